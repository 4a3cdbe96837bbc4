//! What a worker tells the world: [`Status`](super::Status) (for probes and `/status`) and
//! the gauges of held leases, checkpoint ages and problems.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::watch;

use super::problems::{self, ProblemKind, Problems};
use super::shards::Shards;
use super::{Phase, ShardStatus, Status};
use crate::mutation::{self, Mutation};
use crate::types::{ShardId, WorkerId};

/// Problems by shard: why each is stalled or failing.
type ByShard = BTreeMap<String, String>;

/// The worker's [`Status`], as it publishes it: the one writer of the `watch` channel.
#[derive(Debug)]
pub(super) struct Report {
    status: watch::Sender<Status>,
}

impl Default for Report {
    fn default() -> Self {
        Self {
            status: watch::Sender::new(Status::default()),
        }
    }
}

impl Report {
    /// Follows the status.
    pub(super) fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    /// The worker is in `phase` now.
    pub(super) fn phase(&self, phase: Phase) {
        self.status.send_modify(|s| s.phase = phase);
    }

    /// Shutdown began: no cycle runs any more, so this worker leads nothing (its role goes
    /// back for a successor to lead), whatever its last cycle said.
    pub(super) fn shutting_down(&self) {
        self.status.send_modify(|s| {
            s.phase = Phase::ShuttingDown;
            s.leading = false;
        });
    }

    /// `run` returned: nothing is held any more.
    pub(super) fn stopped(&self) {
        self.status.send_modify(|s| {
            s.phase = Phase::Stopped;
            s.held.clear();
        });
    }

    /// The coordinator loop went round (see [`Status::heartbeat`]).
    pub(super) fn beat(&self) {
        self.status
            .send_modify(|s| s.heartbeat = Some(Instant::now()));
    }

    /// Whether the last read of the lease table succeeded.
    pub(super) fn reachable(&self, reachable: bool) {
        self.status.send_modify(|s| s.store_reachable = reachable);
    }

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
    pub(super) fn publish(
        &self,
        held: &Shards,
        problems: &mut Problems,
        stalled_after: Option<Duration>,
    ) {
        #[allow(clippy::cast_precision_loss)]
        ::metrics::gauge!(crate::metrics::LEASES_HELD).set(held.len() as f64);
        let failing = held.iter().filter_map(|(key, held)| {
            let why = held.control.read_failing()?;
            Some((key.to_string(), why))
        });
        problems.replace(ProblemKind::ReadFailing, failing.collect());
        let (stalled, failing, shards) = progress(held, stalled_after);
        problems.replace(ProblemKind::Stalled, stalled);
        problems.replace(ProblemKind::Failing, failing);
        problems.refresh();
        let held: Vec<ShardId> = held.iter().map(|(key, _)| key.clone()).collect();
        let problems = problems.list();
        self.status.send_if_modified(|s| {
            let changed = s.held != held || s.problems != problems || s.shards != shards;
            s.held = held;
            s.problems = problems;
            s.shards = shards;
            s.problem = problems::summary(s.coordination.as_deref(), &s.problems);
            changed
        });
    }

    /// The fleet's leader as last seen, whether this worker leads, and whether it is asked
    /// to drain.
    pub(super) fn publish_roles(&self, leader: Option<WorkerId>, leading: bool, draining: bool) {
        self.status.send_if_modified(|s| {
            let changed = s.leader != leader || s.leading != leading || s.draining != draining;
            s.leader = leader;
            s.leading = leading;
            s.draining = draining;
            changed
        });
    }

    /// The fleet's signals as worked out or read here ([`Status::fleet`]).
    pub(super) fn publish_fleet(&self, fleet: Option<crate::FleetSignals>) {
        self.status.send_if_modified(|s| {
            let changed = s.fleet != fleet;
            s.fleet = fleet;
            changed
        });
    }

    /// A cycle completed with a successful read: says so in `Status`.
    pub(super) fn cycle_done(&self) {
        self.status
            .send_modify(|s| s.last_cycle = Some(Instant::now()));
    }
}

/// Each held shard's checkpoint age (its gauge), and the shards stalled and failing (see
/// `shard_consumer::progress`). A lease whose validity ran out (the process was frozen,
/// or cut off from the table) is neither: another worker may hold it and move its
/// checkpoint, and this one's task stops as soon as it runs.
fn progress(
    held: &Shards,
    stalled_after: Option<Duration>,
) -> (ByShard, ByShard, Vec<ShardStatus>) {
    let (mut stalled, mut failing) = (BTreeMap::new(), BTreeMap::new());
    let mut shards = Vec::new();
    for (key, held) in held.iter() {
        // A move the shard task has not looked at yet: it looks between batches, not while
        // a hook runs or a graceful stop waits for the records in flight.
        let checkpoint = held.tenure.checkpoint_now();
        if let Some(checkpoint) = &checkpoint
            && !mutation::on(Mutation::StallAgeSeenByTaskOnly)
        {
            held.control.observe(checkpoint, None);
        }
        let (last_progress, millis_behind_latest) = held.control.seen();
        shards.push(ShardStatus {
            shard: key.clone(),
            checkpoint,
            millis_behind_latest,
            last_progress,
            failures: held.control.failures.snapshot(),
        });
        let age = held.control.stall_age();
        let shard = key.to_string();
        ::metrics::gauge!(crate::metrics::CHECKPOINT_AGE, "shard" => shard.clone())
            .set(age.as_secs_f64());
        if !held.tenure.is_valid() && !mutation::on(Mutation::StalledPastValidity) {
            continue;
        }
        let failures = held.control.failures.snapshot();
        if failures.outage {
            // Before the attempts' own count (the blocked restarts add up to it too), and the
            // same text while it lasts: a change would be logged as a new problem.
            let why = "an outage: the failure policy gave up on outage_after records in a row \
                       with none succeeding, and blocks until a record succeeds (see the log)";
            failing.insert(shard.clone(), why.to_owned());
        } else if let Some(why) = held.control.failing() {
            failing.insert(shard.clone(), why);
        } else if failures.sink_refusals >= crate::failure::SINK_FAILING_AFTER {
            let why = "the dead-letter sink keeps refusing a letter: the record waits for it, \
                       and the checkpoint with it (see the log and \
                       kcl_dead_letter_sink_failures_total)";
            failing.insert(shard.clone(), why.to_owned());
        }
        if let Some(limit) = stalled_after.filter(|limit| age >= *limit) {
            // The same text while it lasts: a change would be logged as a new problem.
            let why = format!(
                "records past the checkpoint have waited over {limit:?} (stalled_after) \
                 without it moving (see kcl_checkpoint_age_seconds)"
            );
            stalled.insert(shard, why);
        }
    }
    (stalled, failing, shards)
}

#[cfg(all(test, feature = "test-util"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use tokio::time::{Instant, sleep};

    use crate::memory::{MemoryLeaseStore, MemoryStream};
    use crate::worker::ProblemKind;
    use crate::{
        BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, Worker, WorkerConfig,
    };

    /// Checkpoints nothing for 6 s (its records wait), then checkpoints everything it was
    /// handed in a hook that runs on for 5 s more.
    struct SlowAfterCheckpoint {
        started: Instant,
        done: bool,
    }

    impl RecordProcessor for SlowAfterCheckpoint {
        async fn process_records(
            &mut self,
            _: ProcessRecordsInput<'_>,
            cp: &mut Checkpointer,
        ) -> Result<(), BoxError> {
            if !self.done && self.started.elapsed() >= Duration::from_secs(6) {
                self.done = true;
                cp.checkpoint().await?;
                sleep(Duration::from_secs(5)).await;
            }
            Ok(())
        }
    }

    /// The shard task looks at its checkpoint between batches only: a move made in a hook
    /// that runs on is seen by the coordinator as it publishes, and the shard, whose records
    /// no longer wait, is not reported stalled `stalled_after` after they began to.
    #[tokio::test(start_paused = true)]
    async fn a_checkpoint_moved_in_a_hook_that_runs_on_ends_the_stall() {
        // The mutation check runs this test with the mutation it catches (`Mutation::unit_test`).
        crate::mutation::set_from_env();
        let stream = MemoryStream::new(1);
        let producer = stream.clone();
        tokio::spawn(async move {
            for i in 0_u64.. {
                producer.put(&format!("key-{}", i % 7), format!("record-{i}"));
                sleep(Duration::from_millis(100)).await;
            }
        });
        let config = WorkerConfig::default()
            .failover_time(Duration::from_secs(6))
            .taker_interval(Duration::from_millis(500))
            .idle_time_between_reads(Duration::from_millis(200))
            .stalled_after(Duration::from_secs(8));
        let started = Instant::now();
        let worker = Worker::builder(stream, MemoryLeaseStore::new())
            .id("w")
            .config(config)
            .build(move |_| SlowAfterCheckpoint {
                started,
                done: false,
            })
            .unwrap();
        let status = worker.status();
        let shutdown = worker.shutdown_handle();
        let task = tokio::spawn(worker.run());
        // Records wait from the first batch on until the move at 6 s; the hook returns at
        // 11 s, and those handed over since wait until 19 s.
        while started.elapsed() < Duration::from_secs(16) {
            sleep(Duration::from_millis(100)).await;
            let s = status.borrow();
            let stalled = s.problems.iter().any(|p| p.kind == ProblemKind::Stalled);
            assert!(!stalled, "at {:?}: {:?}", started.elapsed(), s.problems);
        }
        shutdown.shutdown();
        task.await.unwrap().unwrap();
    }

    /// `Status` names the leader (this worker, alone) and each held shard with its checkpoint,
    /// lag and last progress; once `admin::release` asks the worker to drain, it says so.
    #[tokio::test(start_paused = true)]
    async fn status_names_the_leader_each_shard_and_a_drain() {
        struct Checkpointing;
        impl RecordProcessor for Checkpointing {
            async fn process_records(
                &mut self,
                _: ProcessRecordsInput<'_>,
                cp: &mut Checkpointer,
            ) -> Result<(), BoxError> {
                cp.checkpoint().await?;
                Ok(())
            }
        }
        let stream = MemoryStream::new(2);
        let store = MemoryLeaseStore::new();
        for i in 0..20 {
            stream.put(&format!("key-{i}"), format!("record-{i}"));
        }
        let worker = Worker::builder(stream, store.clone())
            .id("w")
            .config(WorkerConfig::default().idle_time_between_reads(Duration::from_millis(200)))
            .build(|_| Checkpointing)
            .unwrap();
        let status = worker.status();
        let shutdown = worker.shutdown_handle();
        let task = tokio::spawn(worker.run());
        sleep(Duration::from_secs(20)).await;
        {
            let s = status.borrow();
            assert_eq!(s.leader.as_ref().map(|w| w.as_str()), Some("w"));
            assert!(!s.draining);
            assert_eq!(s.shards.len(), 2, "{:?}", s.shards);
            for shard in &s.shards {
                let moved = shard
                    .checkpoint
                    .as_ref()
                    .is_some_and(|c| matches!(c, crate::types::Checkpoint::Sequence(_)));
                assert!(moved, "{shard:?}");
                assert_eq!(shard.millis_behind_latest, Some(0), "{shard:?}");
                assert!(shard.last_progress.is_some(), "{shard:?}");
            }
        }
        // No other worker shows in the table: the drain row only, then the worker drains.
        let me = crate::types::WorkerId::from("w");
        let drain = crate::lease::Lease::new(
            crate::singleton::drain_key(&me),
            crate::types::Checkpoint::TrimHorizon,
        );
        assert!(
            crate::lease::LeaseStore::create(&store, &drain)
                .await
                .unwrap()
        );
        sleep(Duration::from_secs(5)).await;
        assert!(status.borrow().draining, "{:?}", status.borrow());
        shutdown.shutdown();
        task.await.unwrap().unwrap();
    }
}
