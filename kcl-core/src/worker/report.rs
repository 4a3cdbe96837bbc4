//! What a worker tells the world: [`Status`](super::Status) (for probes and `/status`) and
//! the gauges of held leases, checkpoint ages and problems.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::Worker;
use super::cycle::Coordinator;
use super::problems;
use crate::lease::LeaseStore;
use crate::mutation::{self, Mutation};
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
        let (stalled, failing) = self.progress(state);
        state
            .problems
            .replace(problems::ProblemKind::Stalled, stalled);
        state
            .problems
            .replace(problems::ProblemKind::Failing, failing);
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

    /// Each held shard's checkpoint age (its gauge), and the shards stalled and failing (see
    /// `shard_consumer::progress`). A lease whose validity ran out (the process was frozen,
    /// or cut off from the table) is neither: another worker may hold it and move its
    /// checkpoint, and this one's task stops as soon as it runs.
    fn progress(
        &self,
        state: &Coordinator,
    ) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let (mut stalled, mut failing) = (BTreeMap::new(), BTreeMap::new());
        for (key, held) in state.shards.iter() {
            let age = held.control.stall_age();
            let shard = key.to_string();
            ::metrics::gauge!(crate::metrics::CHECKPOINT_AGE, "shard" => shard.clone())
                .set(age.as_secs_f64());
            if !held.tenure.is_valid() && !mutation::on(Mutation::StalledPastValidity) {
                continue;
            }
            if let Some(why) = held.control.failing() {
                failing.insert(shard.clone(), why);
            }
            if let Some(limit) = self.config.stalled_after.filter(|limit| age >= *limit) {
                // The same text while it lasts: a change would be logged as a new problem.
                let why = format!(
                    "records past the checkpoint have waited over {limit:?} (stalled_after) \
                     without it moving (see kcl_checkpoint_age_seconds)"
                );
                stalled.insert(shard, why);
            }
        }
        (stalled, failing)
    }

    /// A cycle completed with a successful read: says so in `Status`.
    pub(super) fn cycle_done(&self) {
        self.status
            .send_modify(|s| s.last_cycle = Some(Instant::now()));
    }
}
