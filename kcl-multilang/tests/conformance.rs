//! The protocol, message by message, without AWS: a [`ChildProcessor`] driven by kcl's
//! `ProcessorHarness` on the in-memory lease store, its child a scripted Python process
//! (`children/scripted.py`) that logs every line it is sent. The lines are compared with
//! golden lines in the form KCL Java 3.1.3's MultiLangDaemon writes them (captured from it:
//! see `docs/multilang.md`), and the checkpoints with what the lease holds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{TimeZone, Utc};
use kcl_core::memory::{MemoryLeaseStore, ProcessorHarness};
use kcl_core::{Checkpoint, ExtendedSequenceNumber, Record, SequenceNumber, ShardId};
use kcl_integration_tests::unique;
use kcl_multilang::{ChildCommand, ChildProcessor, FailurePolicy};

struct Scripted {
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

fn python() -> String {
    std::env::var("KCL_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn scripted(mode: &str, timeout: Option<Duration>) -> (ChildProcessor, Scripted) {
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
    };
    let processor = ChildProcessor::new(Arc::new(command), FailurePolicy::default());
    (
        processor,
        Scripted {
            log,
            _dir: TempDir(dir),
        },
    )
}

impl Scripted {
    fn received(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn record(sequence: u128, sub: u64, key: &str, data: &'static [u8]) -> Record {
    let mut record = Record::new(
        SequenceNumber::from(sequence),
        key,
        Bytes::from_static(data),
    );
    record.sub_sequence_number = sub;
    record.approximate_arrival = Utc.timestamp_millis_opt(1_700_000_000_123).unwrap();
    record
}

async fn harness(store: &MemoryLeaseStore) -> ProcessorHarness {
    ProcessorHarness::new(store, "shardId-000000000001")
        .await
        .unwrap()
}

#[tokio::test]
async fn a_shard_from_initialize_to_shutdown_requested_line_by_line() {
    let store = MemoryLeaseStore::new();
    let mut h = harness(&store).await;
    let (mut processor, child) = scripted("normal", None);
    h.initialize(&mut processor).await.unwrap();
    let records = vec![
        record(49_000_000_000_000_000_001, 0, "pk-0", b"hello"),
        record(49_000_000_000_000_000_002, 1, "pk-1", b"\x00\xffbinary"),
    ];
    h.process(&mut processor, records).await.unwrap();
    assert_eq!(
        h.checkpoint().await.unwrap(),
        Checkpoint::Sequence(ExtendedSequenceNumber {
            sequence: SequenceNumber::from(49_000_000_000_000_000_002u128),
            sub_sequence: 1,
        })
    );
    h.shutdown_requested(&mut processor).await.unwrap();
    let golden = [
        r#"{"action":"initialize","shardId":"shardId-000000000001","sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}"#,
        r#"{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null,"error":"InvalidStateException"}"#,
        r#"{"action":"processRecords","records":[{"data":"aGVsbG8=","partitionKey":"pk-0","sequenceNumber":"49000000000000000001","approximateArrivalTimestamp":1700000000123,"subSequenceNumber":0,"action":"record"},{"data":"AP9iaW5hcnk=","partitionKey":"pk-1","sequenceNumber":"49000000000000000002","approximateArrivalTimestamp":1700000000123,"subSequenceNumber":1,"action":"record"}],"millisBehindLatest":null}"#,
        r#"{"action":"checkpoint","sequenceNumber":"not-a-number","subSequenceNumber":null,"error":"IllegalArgumentException"}"#,
        r#"{"action":"checkpoint","sequenceNumber":"9999999999999999999999999999999999999999","subSequenceNumber":null,"error":"IllegalArgumentException"}"#,
        r#"{"action":"checkpoint","sequenceNumber":"49000000000000000002","subSequenceNumber":1,"error":null}"#,
        r#"{"action":"shutdownRequested"}"#,
        r#"{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null,"error":null}"#,
        r#"{"action":"leaseLost"}"#,
    ];
    assert_eq!(child.received(), golden);
}

#[tokio::test]
async fn shard_ended_checkpoints_the_end_and_lease_lost_forbids_checkpoints() {
    let store = MemoryLeaseStore::new();
    let mut h = harness(&store).await;
    let (mut processor, child) = scripted("normal", None);
    h.initialize(&mut processor).await.unwrap();
    h.process(&mut processor, vec![record(7, 0, "k", b"x")])
        .await
        .unwrap();
    h.shard_ended(&mut processor, vec![ShardId::from("shardId-000000000002")])
        .await
        .unwrap();
    assert_eq!(h.checkpoint().await.unwrap(), Checkpoint::ShardEnd);
    let received = child.received();
    assert_eq!(received[received.len() - 2], r#"{"action":"shardEnded"}"#);
    assert_eq!(
        received[received.len() - 1],
        r#"{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null,"error":null}"#
    );

    // Another shard whose lease is taken away: leaseLost, and the child is gone.
    let store = MemoryLeaseStore::new();
    let mut h = harness(&store).await;
    let (mut processor, child) = scripted("normal", None);
    h.initialize(&mut processor).await.unwrap();
    h.lease_lost(&mut processor).await;
    assert_eq!(
        child.received().last().map(String::as_str),
        Some(r#"{"action":"leaseLost"}"#)
    );
}

#[tokio::test]
async fn noise_on_stdout_and_other_messages_are_skipped() {
    let store = MemoryLeaseStore::new();
    let mut h = harness(&store).await;
    let (mut processor, _child) = scripted("junk", None);
    h.initialize(&mut processor).await.unwrap();
    h.process(&mut processor, vec![record(7, 0, "k", b"x")])
        .await
        .unwrap();
    assert!(matches!(
        h.checkpoint().await.unwrap(),
        Checkpoint::Sequence(_)
    ));
}

#[tokio::test]
async fn a_broken_child_fails_the_hook_and_nothing_is_checkpointed() {
    for (mode, timeout, expected) in [
        (
            "wrong",
            None,
            "answered `wrong` while `processRecords` was in flight",
        ),
        (
            "exit",
            None,
            "ended while processing `processRecords` (exit status: 3)",
        ),
        (
            "hang",
            Some(Duration::from_secs(1)),
            "did not answer `processRecords` within 1s",
        ),
    ] {
        let store = MemoryLeaseStore::new();
        let mut h = harness(&store).await;
        let (mut processor, _child) = scripted(mode, timeout);
        h.initialize(&mut processor).await.unwrap();
        let error = h
            .process(&mut processor, vec![record(7, 0, "k", b"x")])
            .await
            .unwrap_err();
        assert!(error.to_string().contains(expected), "{mode}: {error}");
        assert_eq!(
            h.checkpoint().await.unwrap(),
            Checkpoint::TrimHorizon,
            "{mode}"
        );
        // What the worker does next: the processor is told its lease is gone (or dropped).
        h.lease_lost(&mut processor).await;
    }
}

#[tokio::test]
async fn a_child_that_cannot_start_fails_initialize() {
    let store = MemoryLeaseStore::new();
    let mut h = harness(&store).await;
    let command = ChildCommand::parse("/nonexistent/kcl-multilang-child --flag").unwrap();
    let mut processor = ChildProcessor::new(Arc::new(command), FailurePolicy::default());
    let error = h.initialize(&mut processor).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("cannot start `/nonexistent/kcl-multilang-child`"),
        "{error}"
    );
}

/// What KCL Java 3.1.3's MultiLangDaemon wrote to a child (amazon_kclpy 3.x) over a stream
/// of three records, captured with `tee` between the two: `tests/golden/kcl-java-3.1.3.jsonl`.
/// The same inputs give the same bytes here.
#[test]
fn the_lines_are_the_java_daemons_byte_for_byte() {
    use kcl_multilang::protocol::{CheckpointFailure, JsonRecord, ToChild};

    let golden = include_str!("golden/kcl-java-3.1.3.jsonl");
    let arrived = [1_795_586_745_227, 1_795_586_745_258, 1_795_586_745_261];
    let data: [&'static [u8]; 3] = [b"hello", b"\x00\xffbinary", b"{\"n\":3}"];
    let records: Vec<JsonRecord> = (0..3)
        .map(|i| {
            let mut r = record(i as u128 + 1, 0, &format!("pk-{i}"), data[i]);
            r.approximate_arrival = Utc.timestamp_millis_opt(arrived[i]).unwrap();
            JsonRecord::from(&r)
        })
        .collect();
    let reply = |sequence: &str, sub: Option<i64>, error| ToChild::Checkpoint {
        sequence_number: Some(sequence.to_owned()),
        sub_sequence_number: sub,
        error,
    };
    let ours = [
        ToChild::initialize("shardId-000000000000", &Checkpoint::TrimHorizon),
        ToChild::ProcessRecords {
            records,
            millis_behind_latest: Some(0),
        },
        reply(
            "abc",
            None,
            Some(CheckpointFailure::IllegalArgumentException),
        ),
        reply(
            &"9".repeat(60),
            None,
            Some(CheckpointFailure::IllegalArgumentException),
        ),
        reply("3", Some(0), None),
    ];
    let ours: Vec<String> = ours.iter().map(ToChild::to_line).collect();
    let golden: Vec<&str> = golden.lines().collect();
    assert_eq!(ours, golden);
}
