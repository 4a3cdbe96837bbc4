//! How the coordinator steers a running shard task, and what the task shows it back: a
//! graceful stop or a handoff one way; progress, lag and why reads fail the other (for
//! `Status` and the shard's problems). Shared by the two; each side sets only its own half.

use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::progress::Progress;
use crate::types::{Checkpoint, ExtendedSequenceNumber, WorkerId};

/// How the coordinator steers a running shard task.
#[derive(Debug)]
pub(crate) struct Control {
    /// Cancelled to stop gracefully (worker shutdown, or a handoff).
    pub(super) graceful: CancellationToken,
    handoff_to: Mutex<Option<WorkerId>>,
    /// Why reading the shard fails in a way retrying cannot fix, while it does.
    read_failing: Mutex<Option<String>>,
    /// How the shard progresses, across its processor's restarts.
    progress: Mutex<Progress>,
    /// What the failure policy did, across its processor's restarts.
    pub(crate) failures: std::sync::Arc<crate::failure::Tally>,
}

impl Control {
    pub(crate) fn new(graceful: CancellationToken) -> Self {
        Self {
            graceful,
            handoff_to: Mutex::new(None),
            read_failing: Mutex::new(None),
            progress: Mutex::new(Progress::default()),
            failures: std::sync::Arc::default(),
        }
    }

    pub(super) fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long the shard's checkpoint has stood still while records past it wait (see
    /// `progress`; `problems`: a shard stalled).
    pub(crate) fn stall_age(&self) -> Duration {
        self.progress().stall_age()
    }

    /// Why the shard is failing, if its attempts keep failing without progress (see
    /// `progress`).
    pub(crate) fn failing(&self) -> Option<String> {
        self.progress().failing()
    }

    /// With `false`: records are about to be handed over. With `true`: the attempt's
    /// checkpoint covers what it was handed (the wait ends once it covers everything the
    /// shard was handed in this tenure; see `progress`).
    pub(super) fn set_covered(&self, covered: bool) {
        let mut progress = self.progress();
        if covered {
            progress.covered(true);
        } else {
            progress.handing_over();
        }
    }

    /// The lease's checkpoint now, and the last record the current attempt delivered (the
    /// coordinator, which does not know it, gives `None`).
    pub(crate) fn observe(
        &self,
        checkpoint: &Checkpoint,
        delivered: Option<&ExtendedSequenceNumber>,
    ) {
        self.progress().observe(checkpoint, delivered);
    }

    /// A batch of records was processed without an error.
    pub(super) fn progressed(&self) {
        self.progress().progressed();
    }

    /// A read was `millis` behind the stream's tip.
    pub(super) fn behind_latest(&self, millis: u64) {
        self.progress().behind_latest(millis);
    }

    /// When the shard last progressed, and how far behind the tip its last read was.
    pub(crate) fn seen(&self) -> (Option<tokio::time::Instant>, Option<u64>) {
        self.progress().seen()
    }

    /// Why reading the shard fails in a way retrying cannot fix, if it does (see the module
    /// docs).
    pub(crate) fn read_failing(&self) -> Option<String> {
        self.read_failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Notes why reading fails, or with `None` that a read succeeded.
    pub(super) fn set_read_failing(&self, why: Option<String>) {
        let mut failing = self
            .read_failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if failing.is_some() || why.is_some() {
            *failing = why;
        }
    }

    /// Stops the shard gracefully and hands its lease to `to`.
    pub(crate) fn hand_off(&self, to: WorkerId) {
        *self
            .handoff_to
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(to);
        self.graceful.cancel();
    }

    pub(crate) fn is_handing_off(&self) -> bool {
        self.handoff_target().is_some()
    }

    pub(super) fn handoff_target(&self) -> Option<WorkerId> {
        self.handoff_to
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}
