//! What the tests that drive a [`ChildProcessor`] through kcl's `ProcessorHarness` share: a
//! scripted Python child (`children/scripted.py`) that logs every line it is sent, records,
//! and a harness on the in-memory lease store.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{TimeZone, Utc};
use kcl_core::memory::{MemoryLeaseStore, ProcessorHarness};
use kcl_core::{Record, SequenceNumber};
use kcl_integration_tests::unique;
use kcl_multilang::{ChildCommand, ChildProcessor, FailurePolicy};

pub(crate) struct Scripted {
    log: PathBuf,
    _dir: TempDir,
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn python() -> String {
    std::env::var("KCL_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

pub(crate) fn scripted(mode: &str, timeout: Option<Duration>) -> (ChildProcessor, Scripted) {
    scripted_with(mode, timeout, true, FailurePolicy::default())
}

/// [`scripted`], with `childErrorsFailBatch` and the daemon's failure policy.
pub(crate) fn scripted_with(
    mode: &str,
    timeout: Option<Duration>,
    errors_fail_batch: bool,
    policy: FailurePolicy,
) -> (ChildProcessor, Scripted) {
    let dir = std::env::temp_dir().join(unique(&format!("kcl-multilang-{mode}")));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("received.jsonl");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/children/scripted.py");
    let command = ChildCommand {
        program: python(),
        args: vec![
            script.to_owned(),
            log.display().to_string(),
            mode.to_owned(),
        ],
        timeout,
        errors_fail_batch,
    };
    let processor = ChildProcessor::new(Arc::new(command), policy);
    (
        processor,
        Scripted {
            log,
            _dir: TempDir(dir),
        },
    )
}

impl Scripted {
    /// The lines the daemon wrote to the child.
    pub(crate) fn received(&self) -> Vec<String> {
        self.lines(false)
    }

    /// What the child noted about itself (`# …`).
    pub(crate) fn notes(&self) -> Vec<String> {
        self.lines(true)
    }

    fn lines(&self, notes: bool) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with('#') == notes)
            .map(str::to_owned)
            .collect()
    }

    /// The pid a note starting with `prefix` ends with.
    pub(crate) fn pid_noted(&self, prefix: &str) -> u32 {
        let notes = self.notes();
        notes
            .iter()
            .find_map(|n| n.strip_prefix(prefix)?.parse().ok())
            .unwrap_or_else(|| panic!("no `{prefix}` note: {notes:?}"))
    }

    /// The grandchild's pid and the child's process group.
    pub(crate) fn grandchild(&self) -> (u32, u32) {
        let notes = self.notes();
        notes
            .iter()
            .find_map(|n| {
                let rest = n.strip_prefix("# grandchild ")?;
                let words: Vec<&str> = rest.split(' ').collect();
                Some((words.first()?.parse().ok()?, words.last()?.parse().ok()?))
            })
            .unwrap_or_else(|| panic!("no grandchild noted: {notes:?}"))
    }
}

pub(crate) fn record(sequence: u128, sub: u64, key: &str, data: &'static [u8]) -> Record {
    let mut record = Record::new(
        SequenceNumber::from(sequence),
        key,
        Bytes::from_static(data),
    );
    record.sub_sequence_number = sub;
    record.approximate_arrival = Utc.timestamp_millis_opt(1_700_000_000_123).unwrap();
    record
}

pub(crate) async fn harness(store: &MemoryLeaseStore) -> ProcessorHarness {
    ProcessorHarness::new(store, "shardId-000000000001")
        .await
        .unwrap()
}
