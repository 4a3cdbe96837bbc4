//! The demo's fleet: workers started, stopped and crashed on cue, and how the lease table is
//! drawn.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use kcl_core::singleton::{Singleton, SingletonConfig, is_coordination_key};
use kcl_core::{Lease, ShardId, ShutdownHandle, Worker, WorkerConfig};
use kcl_example_consumer::WindowCounter;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use super::WINDOW;
use super::backend::Backend;
use super::ledger::{Audited, Ledger, LedgerSink, lock};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    Running,
    Stopped,
    Crashed,
}

#[derive(Debug)]
pub(super) struct Member {
    pub(super) name: String,
    pub(super) handle: ShutdownHandle,
    pub(super) task: Option<JoinHandle<Result<(), kcl_core::Error>>>,
    pub(super) fate: Fate,
    pub(super) failed: Option<String>,
    /// Its candidacy for the fleet's summary job: stopped with the worker.
    pub(super) summary: Option<(CancellationToken, JoinHandle<()>)>,
}

pub(super) struct Fleet<B> {
    pub(super) backend: Arc<B>,
    pub(super) config: WorkerConfig,
    pub(super) ledger: Arc<Ledger>,
    pub(super) members: Vec<Member>,
    pub(super) clock: Arc<Clock>,
}

/// How often the fleet's summary job runs (on one worker at a time).
const SUMMARY_PERIOD: Duration = Duration::from_secs(3);

impl<B: Backend> Fleet<B> {
    pub(super) fn start(&mut self, name: &str) -> anyhow::Result<()> {
        let ledger = self.ledger.clone();
        let worker_name = name.to_owned();
        let factory = move |shard: &ShardId| Audited {
            worker: worker_name.clone(),
            ledger: ledger.clone(),
            inner: WindowCounter::new(shard, WINDOW, 3, LedgerSink(ledger.clone())),
        };
        let worker = Worker::new(
            name,
            self.config.clone(),
            self.backend.source(name),
            self.backend.store(name),
            factory,
        )?;
        let summary = self.summary(name)?;
        self.members.push(Member {
            name: name.to_owned(),
            handle: worker.shutdown_handle(),
            task: Some(tokio::spawn(worker.run())),
            fate: Fate::Running,
            failed: None,
            summary: Some(summary),
        });
        Ok(())
    }

    /// Worker `name` also competes for the fleet's summary job: a singleton on the same lease
    /// table that, every few seconds, says what the fleet processed, from one worker at a time.
    fn summary(&self, name: &str) -> anyhow::Result<(CancellationToken, JoinHandle<()>)> {
        let config = SingletonConfig::default()
            .failover_time(self.config.failover_time)
            .poll_interval(Duration::from_millis(500));
        let job = Singleton::new("fleet-summary", name, self.backend.store(name), config)?;
        let stop = CancellationToken::new();
        let (ledger, clock, me) = (self.ledger.clone(), self.clock.clone(), name.to_owned());
        let until = stop.clone();
        let task = tokio::spawn(async move {
            let run = job.every(SUMMARY_PERIOD, until, move |period| {
                let processed: u64 = lock(&ledger.by_worker).values().sum();
                lock(&ledger.periods).push((period.index, me.clone()));
                clock.say(&format!(
                    "summary  {processed} records processed so far (the fleet's summary job, on {me}, fencing token {})",
                    period.fencing_token()
                ));
                async {}
            });
            if let Err(error) = run.await {
                tracing::warn!(%error, "the summary job failed");
            }
        });
        Ok((stop, task))
    }

    pub(super) fn member(&mut self, name: &str) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.name == name)
    }

    /// Graceful stop; returns how long it took.
    pub(super) async fn stop(&mut self, name: &str) -> Option<Duration> {
        let member = self.member(name)?;
        let started = Instant::now();
        member.handle.shutdown();
        if let Some((stop, task)) = member.summary.take() {
            // Its row is handed back at once, as the worker's leases are.
            stop.cancel();
            let _ = timeout(Duration::from_secs(15), task).await;
        }
        let task = member.task.take()?;
        member.fate = Fate::Stopped;
        match timeout(Duration::from_secs(15), task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => member.failed = Some(format!("run failed: {e}")),
            Ok(Err(e)) => member.failed = Some(format!("task failed: {e}")),
            Err(_) => member.failed = Some("did not stop within 15s".to_owned()),
        }
        Some(started.elapsed())
    }

    /// Like a `kill -9`: the worker's tasks vanish without releasing anything.
    pub(super) fn crash(&mut self, name: &str) {
        if let Some(member) = self.member(name) {
            if let Some(task) = member.task.take() {
                task.abort();
            }
            if let Some((_, task)) = member.summary.take() {
                task.abort();
            }
            member.fate = Fate::Crashed;
        }
    }

    pub(super) fn running(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.fate == Fate::Running)
            .map(|m| m.name.clone())
            .collect()
    }
}

/// `shardId-000000000012` → `12`.
pub(super) fn short(shard: &ShardId) -> String {
    let s = shard.as_str();
    let digits = s.trim_start_matches("shardId-").trim_start_matches('0');
    if digits.is_empty() {
        "0".to_owned()
    } else {
        digits.to_owned()
    }
}

/// Owner → shards, for leases not finished yet.
pub(super) fn distribution(leases: &[Lease]) -> BTreeMap<String, Vec<ShardId>> {
    let mut out: BTreeMap<String, Vec<ShardId>> = BTreeMap::new();
    for lease in leases {
        if lease.is_finished() || is_coordination_key(&lease.key) {
            continue;
        }
        let owner = lease
            .owner
            .as_ref()
            .map_or_else(|| "(free)".to_owned(), ToString::to_string);
        out.entry(owner).or_default().push(lease.key.clone());
    }
    out
}

pub(super) fn render(dist: &BTreeMap<String, Vec<ShardId>>) -> String {
    let mut line = String::new();
    for (owner, shards) in dist {
        if !line.is_empty() {
            line.push_str("  ");
        }
        let ids: Vec<String> = shards.iter().map(short).collect();
        let _ = write!(line, "{owner}[{}]", ids.join(" "));
    }
    line
}

pub(super) struct Clock(pub(super) Instant);

impl Clock {
    pub(super) fn say(&self, message: &str) {
        println!("{:>6.1}s  {message}", self.0.elapsed().as_secs_f64());
    }
}
