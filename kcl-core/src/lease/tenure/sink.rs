//! A tenure's side of a sink that keeps each shard's position
//! ([`Positions`](crate::outputs::Positions), where the rules are): opening the sink for
//! the tenure, the lease row's checkpoint following each commit into it, and what a refusal
//! by the sink comes to.

use super::{Tenure, TenureError};
use crate::error::{BackendError, ErrorKind};
use crate::lease::CheckpointUpdate;
use crate::lease::positions::Sink;
use crate::task::bounded;
use crate::types::Checkpoint;

impl Tenure {
    /// Hands `sink`'s row of the shard to this tenure and returns its position, then reads
    /// the lease row back: a tenure that had already lost the lease when it opened (a
    /// processor restarted late, a commit refused just as the lease moved) is lost here,
    /// before it commits anything, and the next holder's open fences the sink again.
    pub(crate) async fn open_sink(&self, sink: &Sink) -> Result<Option<Checkpoint>, TenureError> {
        let (shard, owner, fence) = (&self.shard, &self.worker, self.fence);
        let limit = self.call_timeout;
        let position = bounded(limit, "open_positions", sink.0.open(shard, owner, fence))
            .await
            .map_err(TenureError::Store)?;
        let row = bounded(limit, "get", self.store.get(shard))
            .await
            .map_err(TenureError::Store)?;
        if !row.is_some_and(|row| row.is_owned_by(owner) && row.fence == Some(fence)) {
            self.mark_lost();
            return Err(TenureError::Lost);
        }
        Ok(position)
    }

    /// After a commit into a sink that keeps its own position: the lease row's checkpoint
    /// follows, as a plain write. If it fails, the sink still holds the commit: the lease
    /// row trails it until the sink refuses a commit from the older checkpoint, which brings
    /// the row up to the sink ([`sink_refused`](Self::sink_refused)), or the next open does.
    pub(super) async fn follow(&self, update: &CheckpointUpdate) {
        if let Err(error) = self.checkpoint(update).await {
            tracing::warn!(
                shard = %self.shard,
                ?error,
                "the lease's checkpoint did not follow a commit into the sink that keeps the \
                 shard's position; the shard resumes from the sink's position"
            );
        }
    }

    /// A sink that keeps its own position refused the commit (its row names another tenure,
    /// or a position past the commit's checkpoint before; an attempt of this commit applied
    /// earlier is answered with success by the sink itself). The lease row says whether the
    /// lease moved. If not, the sink did: a tenure that opened it late, an open that landed
    /// late, a row deleted by hand, or a commit applied whose answers were all lost. The
    /// worker's sink is then opened again for this tenure and the lease's checkpoint brought
    /// up to its position, so that a commit from there passes: the caller tries once more
    /// (`Parallel`'s committer never restarts), and if that is refused too, returns the
    /// error this gives, a retryable store error that says what happened.
    pub(super) async fn sink_refused(
        &self,
        update: &CheckpointUpdate,
        sink: Option<&Sink>,
    ) -> Result<TenureError, TenureError> {
        let settled = {
            let mut held = self.held.lock().await;
            self.settle_commit(&mut held.lease, update).await
        };
        let current = match settled {
            Err(TenureError::Behind(current)) => current,
            // The tenure's lease row shows this commit: cannot be, the sink refused it.
            Ok(_) => return Ok(self.refusal("")),
            Err(other) => return Err(other),
        };
        let Some(sink) = sink else {
            return Ok(self.refusal("; the worker was not given this sink"));
        };
        let position = self.open_sink(sink).await?;
        let ahead = position
            .as_ref()
            .and_then(|p| p.progress_cmp(&current))
            .is_some_and(std::cmp::Ordering::is_gt);
        match position {
            // A SHARD_END the lease has not got: the processor's restart writes it, with the
            // shard's children, when its open finds the sink there.
            Some(Checkpoint::Sequence(_)) if ahead => {
                let up = CheckpointUpdate::new(position.unwrap_or(current));
                self.checkpoint(&up).await?;
                Ok(self.refusal(": the lease's checkpoint was brought up to the sink's"))
            }
            _ => Ok(self.refusal(
                ": the sink was opened again for this tenure (refused again and again, is the \
                 sink committed into the one given to WorkerBuilder::positions?)",
            )),
        }
    }

    /// The error of a commit the sink refused, with what was done about it.
    fn refusal(&self, done: &str) -> TenureError {
        TenureError::Store(BackendError::new(
            ErrorKind::Retryable,
            "transact",
            format!(
                "the sink that keeps the position of {} refused the commit: its row named \
                 another tenure of the lease, or a position past the checkpoint this commit \
                 started from{done}",
                self.shard
            ),
        ))
    }
}
