//! What a worker tells the world: [`Status`](super::Status) (for probes and `/status`) and
//! the gauges of held leases, checkpoint ages and problems.

use std::time::Duration;

use tokio::time::Instant;

use super::Worker;
use super::cycle::Coordinator;
use super::problems;
use crate::lease::LeaseStore;
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::types::ShardId;

impl<S: ShardSource, L: LeaseStore, F: ProcessorFactory> Worker<S, L, F> {
    /// A failure that retrying may fix. The first of a kind is logged at WARN, and it is kept
    /// in [`Status::problem`]; repeats of the same are logged at DEBUG only, so that a worker
    /// without credentials says so once instead of every few seconds.
    pub(super) fn problem(&self, what: &str, error: &(dyn std::error::Error + 'static)) {
        let text = format!("{what}: {}", crate::error::error_chain(error));
        if self.status.borrow().coordination.as_ref() == Some(&text) {
            tracing::debug!(problem = %text, "still failing");
            return;
        }
        tracing::warn!(problem = %text, "retrying quietly while this lasts");
        self.status.send_modify(|s| {
            s.coordination = Some(text);
            s.problem = problems::summary(s.coordination.as_deref(), &s.problems);
        });
    }

    /// Calls to the lease table succeed again.
    pub(super) fn solved(&self) {
        let mut solved = None;
        self.status.send_if_modified(|s| {
            solved = s.coordination.take();
            s.problem = problems::summary(None, &s.problems);
            solved.is_some()
        });
        if let Some(problem) = solved {
            tracing::info!(%problem, "recovered");
        }
    }

    /// A shard task started: `Status.held` says so at once, not at the end of the cycle.
    pub(super) fn publish_taken(&self, key: &ShardId, held: usize) {
        #[allow(clippy::cast_precision_loss)]
        ::metrics::gauge!(crate::metrics::LEASES_HELD).set(held as f64);
        self.status.send_modify(|s| {
            if let Err(at) = s.held.binary_search(key) {
                s.held.insert(at, key.clone());
            }
        });
    }

    /// Publishes the held leases and the known problems (see `problems`) in [`Status`] and
    /// their gauges.
    pub(super) fn publish(&self, state: &mut Coordinator) {
        #[allow(clippy::cast_precision_loss)]
        ::metrics::gauge!(crate::metrics::LEASES_HELD).set(state.shards.len() as f64);
        let held: Vec<ShardId> = state.shards.iter().map(|(key, _)| key.clone()).collect();
        let failing = state.shards.iter().filter_map(|(key, held)| {
            let why = held.control.read_failing()?;
            Some((key.to_string(), why))
        });
        let failing = failing.collect();
        state
            .problems
            .replace(problems::ProblemKind::ReadFailing, failing);
        let mut stalled = std::collections::BTreeMap::new();
        for (key, held) in state.shards.iter() {
            let age = held
                .control
                .uncheckpointed_since()
                .map_or(Duration::ZERO, |since| since.elapsed());
            let shard = key.to_string();
            ::metrics::gauge!(crate::metrics::CHECKPOINT_AGE, "shard" => shard.clone())
                .set(age.as_secs_f64());
            if age >= self.config.stalled_after {
                let why = format!(
                    "delivered records have waited over {:?} for a checkpoint (see \
                     kcl_checkpoint_age_seconds)",
                    self.config.stalled_after
                );
                stalled.insert(shard, why);
            }
        }
        state
            .problems
            .replace(problems::ProblemKind::Stalled, stalled);
        state.problems.refresh();
        let problems = state.problems.list();
        self.status.send_if_modified(|s| {
            let changed = s.held != held || s.problems != problems;
            s.held = held;
            s.problems = problems;
            s.problem = problems::summary(s.coordination.as_deref(), &s.problems);
            changed
        });
    }

    /// A cycle completed with a successful read: says so in `Status`.
    pub(super) fn cycle_done(&self) {
        self.status
            .send_modify(|s| s.last_cycle = Some(Instant::now()));
    }
}
