//! The record file of `kcl-admin dead-letters redrive`: one JSON line per letter put back
//! into its stream, and one per parked key whose holders were asked to replay its letters;
//! each synced before the next step.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use chrono::Utc;

/// The record file, opened (created, or appended to) before the first step it records.
pub(super) struct RecordFile {
    path: PathBuf,
    file: Option<File>,
}

impl RecordFile {
    /// The file at `path`, by default `redriven-<UTC timestamp>.jsonl` here; not opened yet.
    pub(super) fn new(path: Option<PathBuf>) -> Self {
        let path = path.unwrap_or_else(|| {
            PathBuf::from(format!(
                "redriven-{}.jsonl",
                Utc::now().format("%Y%m%dT%H%M%SZ")
            ))
        });
        Self { path, file: None }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Opens it if it is not open yet: before a step, so that the step can be recorded.
    pub(super) fn open(&mut self) -> anyhow::Result<()> {
        if self.file.is_none() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .with_context(|| format!("cannot open the record file {}", self.path.display()))?;
            self.file = Some(file);
        }
        Ok(())
    }

    /// Appends `line`, synced.
    pub(super) fn append(&mut self, line: &serde_json::Value) -> anyhow::Result<()> {
        self.open()?;
        let path = &self.path;
        let file = self
            .file
            .as_mut()
            .with_context(|| format!("the record file {} is not open", path.display()))?;
        writeln!(file, "{line}")
            .and_then(|()| file.sync_data())
            .with_context(|| format!("cannot write the record file {}", path.display()))
    }
}
