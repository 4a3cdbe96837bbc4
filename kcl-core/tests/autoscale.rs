//! The fleet's autoscaling signals driving an autoscaler, on the in-memory backends under
//! paused time. The fleet starts 5 minutes after its producer (a backlog of 30,000 records),
//! then the producer triples its rate for 10 minutes, then stops; an autoscaler loop (as
//! KEDA's: every 15 s, replicas = `desired_workers`) starts workers after a start delay and
//! stops them gracefully. Each backlog is read within the stated time, replicas come back
//! down, the replica count never changes direction twice within the scale-down window, and
//! nothing is lost through any scale-in.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{Running, Seen, config, world};
use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    Autoscaling, BoxError, Checkpointer, FleetSignals, Liveness, ProcessRecordsInput,
    RecordProcessor, SequenceNumber, ShardId, Worker, WorkerConfig,
};
use tokio::sync::Semaphore;
use tokio::time::{Instant, sleep};

/// What one record costs its worker: 10 ms of the worker's one core (100 records a second
/// at most per worker).
const COST: Duration = Duration::from_millis(10);
const SHARDS: u32 = 8;
const BASE_RATE: u64 = 100;
/// When the first worker starts: the producer has run alone until then.
const FLEET_START: Duration = Duration::from_secs(300);
/// The burst starts once the fleet has read the first backlog and settled (a scale-down
/// window after it caught up): a rise of load right after a scale-in is followed at once,
/// which is a change of direction, not a flap.
const BURST: (Duration, Duration) = (Duration::from_secs(1200), Duration::from_secs(1800));
const END: Duration = Duration::from_secs(2400);
/// How long a new worker takes to start (a pod scheduled, its image pulled).
const START_DELAY: Duration = Duration::from_secs(30);
/// How often the autoscaler asks (KEDA's default polling interval).
const POLL: Duration = Duration::from_secs(15);
/// Within this of a backlog's start the fleet has read it (behind under 10 s): the start
/// delay, a minute of smoothing, and the catch-up time allowed (`catch_up`, 5 min).
const CAUGHT_UP_WITHIN: Duration = Duration::from_secs(30 + 60 + 300);

/// A processor whose records cost [`COST`] each of its worker's one core (a semaphore of one
/// permit per worker): a saturated worker's hooks wait for the core, as on a real host.
struct Costly {
    worker: String,
    shard: ShardId,
    core: Arc<Semaphore>,
    seen: Seen,
}

impl RecordProcessor for Costly {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let n = u32::try_from(input.records().len()).unwrap_or(u32::MAX);
        {
            let _core = self.core.acquire().await?;
            sleep(COST * n).await;
        }
        {
            let mut seen = self.seen.lock().unwrap();
            for r in input.records() {
                seen.push((
                    self.worker.clone(),
                    self.shard.clone(),
                    r.sequence_number.clone(),
                ));
            }
        }
        cp.checkpoint().await?;
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        cp.checkpoint().await?;
        Ok(())
    }
}

fn worker_config(liveness: Liveness) -> WorkerConfig {
    config()
        .liveness(liveness)
        .max_records(100)
        .autoscaling(Autoscaling::default().publish_interval(Duration::from_secs(5)))
}

fn start(id: &str, stream: &MemoryStream, store: &MemoryLeaseStore, seen: &Seen) -> Running {
    start_with(id, Liveness::PerLease, (stream, store, seen))
}

fn start_with(
    id: &str,
    liveness: Liveness,
    (stream, store, seen): (&MemoryStream, &MemoryLeaseStore, &Seen),
) -> Running {
    let (worker, seen, core) = (id.to_owned(), seen.clone(), Arc::new(Semaphore::new(1)));
    let w = Worker::new(
        id,
        worker_config(liveness),
        stream.client(id),
        store.client(id),
        move |shard: &ShardId| Costly {
            worker: worker.clone(),
            shard: shard.clone(),
            core: core.clone(),
            seen: seen.clone(),
        },
    )
    .unwrap();
    Running {
        shutdown: w.shutdown_handle(),
        status: w.status(),
        task: tokio::spawn(w.run()),
    }
}

/// Records a second the producer writes at `t`.
fn rate(t: Duration) -> u64 {
    if t >= BURST.0 && t < BURST.1 {
        BASE_RATE * 3
    } else {
        BASE_RATE
    }
}

/// Writes at [`rate`] until [`END`]; returns what it wrote.
async fn produce(stream: MemoryStream, start: Instant) -> Vec<SequenceNumber> {
    let mut written = Vec::new();
    let mut i = 0_u64;
    while start.elapsed() < END {
        let per_tick = rate(start.elapsed()) / 10;
        for _ in 0..per_tick {
            written.push(stream.put(&format!("key-{}", i % 101), "x").sequence_number);
            i += 1;
        }
        sleep(Duration::from_millis(100)).await;
    }
    written
}

/// The autoscaler: every [`POLL`], replicas = the fleet's `desired_workers` (as any worker
/// answers it: the published figure); new workers start after [`START_DELAY`], the newest
/// stop first, gracefully.
struct Autoscaler {
    liveness: Liveness,
    running: Vec<(String, Running)>,
    starting: Vec<Instant>,
    next_id: usize,
    /// (when, replicas asked for) at every change.
    replicas: Vec<(Duration, usize)>,
    /// (when, the fleet's figures) at every poll.
    seen: Vec<(Duration, FleetSignals)>,
}

impl Autoscaler {
    fn signals(&self) -> Option<FleetSignals> {
        self.running
            .iter()
            .find_map(|(_, r)| r.status.borrow().fleet.clone())
    }

    async fn poll(&mut self, t: Duration, world: (&MemoryStream, &MemoryLeaseStore, &Seen)) {
        let now = Instant::now();
        let ready: Vec<Instant> = self
            .starting
            .iter()
            .copied()
            .filter(|at| *at <= now)
            .collect();
        self.starting.retain(|at| *at > now);
        for _ in ready {
            let id = format!("w{}", self.next_id);
            self.next_id += 1;
            let running = start_with(&id, self.liveness, world);
            self.running.push((id, running));
        }
        let Some(signals) = self.signals() else {
            return;
        };
        self.seen.push((t, signals.clone()));
        let want = usize::try_from(signals.desired_workers).unwrap();
        let have = self.running.len() + self.starting.len();
        if want > have {
            for _ in have..want {
                self.starting.push(now + START_DELAY);
            }
        } else if want < have {
            for _ in want..have {
                if self.starting.pop().is_none()
                    && let Some((_, r)) = self.running.pop()
                {
                    r.shutdown.shutdown();
                    r.task.await.unwrap().unwrap();
                }
            }
        }
        if self.replicas.last().is_none_or(|(_, n)| *n != want) {
            self.replicas.push((t, want));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_tripled_rate_scales_out_reads_the_backlog_and_scales_back_in() {
    scenario(Liveness::PerLease).await;
}

/// The same under heartbeats, where the leader reads each worker's total from its heartbeat
/// row (its lease rows move only with checkpoints).
#[tokio::test(start_paused = true)]
async fn under_heartbeats_too() {
    scenario(Liveness::Heartbeat).await;
}

async fn scenario(liveness: Liveness) {
    let (stream, store, seen) = world(SHARDS);
    let start_at = Instant::now();
    let producer = tokio::spawn(produce(stream.clone(), start_at));
    sleep(FLEET_START).await;
    let first = start_with("w0", liveness, (&stream, &store, &seen));
    let mut scaler = Autoscaler {
        liveness,
        running: vec![("w0".to_owned(), first)],
        starting: Vec::new(),
        next_id: 1,
        replicas: vec![(FLEET_START, 1)],
        seen: Vec::new(),
    };
    while start_at.elapsed() < END + Duration::from_secs(600) {
        sleep(POLL).await;
        scaler
            .poll(start_at.elapsed(), (&stream, &store, &seen))
            .await;
    }
    let written = producer.await.unwrap();
    let delivered: BTreeSet<SequenceNumber> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, q)| q.clone())
        .collect();
    let lost = written.iter().filter(|q| !delivered.contains(q)).count();
    for (_, r) in scaler.running.drain(..) {
        r.shutdown.shutdown();
        r.task.await.unwrap().unwrap();
    }
    let timeline: Vec<String> = scaler
        .replicas
        .iter()
        .map(|(t, n)| format!("{}s:{n}", t.as_secs()))
        .collect();
    println!("replicas {timeline:?}");
    for (t, s) in scaler.seen.iter().step_by(4) {
        println!(
            "{:>5}s desired {} recommended {} workers {} behind {:.0}s backlog {} arrival {:.0} drain {:.0} load {:.2} needed {:.2}",
            t.as_secs(),
            s.desired_workers,
            s.recommended,
            s.workers,
            s.behind.as_secs_f64(),
            s.backlog_records,
            s.arrival_rate,
            s.drain_rate,
            s.load,
            s.needed
        );
    }
    assert_eq!(lost, 0, "records never delivered through the scale-ins");
    let at = |t: Duration| {
        scaler
            .replicas
            .iter()
            .rev()
            .find(|(at, _)| *at <= t)
            .map_or(0, |(_, n)| *n)
    };
    let (before, during) = (at(BURST.0), at(BURST.1));
    assert!(during > before, "the burst scaled out: {timeline:?}");
    assert!(at(END) < during, "and back in after it: {timeline:?}");
    let last = scaler.replicas.last().map(|(_, n)| *n).unwrap();
    assert_eq!(last, 1, "one worker once nothing arrives: {timeline:?}");
    // Each backlog read within the stated time: the one the fleet started with, and any the
    // burst made.
    let behind_at = |from: Duration, to: Duration| {
        scaler
            .seen
            .iter()
            .filter(move |(t, _)| *t >= from && *t < to)
            .map(|(t, s)| (t.as_secs(), s.behind.as_secs()))
    };
    let started_behind = behind_at(FLEET_START, FLEET_START + Duration::from_secs(120))
        .map(|(_, b)| b)
        .max()
        .unwrap();
    assert!(
        started_behind >= 250,
        "the fleet started {started_behind} s behind"
    );
    for (from, to) in [(FLEET_START, BURST.0), (BURST.0, END)] {
        let late: Vec<_> = behind_at(from + CAUGHT_UP_WITHIN, to)
            .filter(|(_, b)| *b > 10)
            .collect();
        assert!(
            late.is_empty(),
            "still behind {CAUGHT_UP_WITHIN:?} after {from:?}: {late:?}"
        );
    }
    // At most one change of direction per scale-down window.
    let down = Autoscaling::default().scale_down_window;
    let mut turns = Vec::new();
    for pair in scaler.replicas.windows(3) {
        let (a, b, c) = (pair[0].1, pair[1].1, pair[2].1);
        if (b > a) != (c > b) {
            turns.push(pair[2].0);
        }
    }
    for pair in turns.windows(2) {
        assert!(pair[1] - pair[0] >= down, "flapped: {timeline:?}");
    }
}

/// A leader that crashes while `desired_workers` is held up by the scale-down window: the
/// next leader goes on from the figure it published, and the fleet is not scaled in early.
#[tokio::test(start_paused = true)]
async fn a_new_leader_goes_on_from_the_published_figure() {
    let (stream, store, seen) = world(SHARDS);
    let start_at = Instant::now();
    let producer = {
        let stream = stream.clone();
        tokio::spawn(async move {
            let mut i = 0_u64;
            while start_at.elapsed() < Duration::from_secs(600) {
                let per_tick = if start_at.elapsed() < Duration::from_secs(180) {
                    30
                } else {
                    5
                };
                for _ in 0..per_tick {
                    stream.put(&format!("key-{}", i % 101), "x");
                    i += 1;
                }
                sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut fleet: Vec<(&str, Running)> = ["w0", "w1", "w2"]
        .into_iter()
        .map(|id| (id, start(id, &stream, &store, &seen)))
        .collect();
    sleep(Duration::from_secs(420)).await;
    let leader = fleet
        .iter()
        .find_map(|(_, r)| r.status.borrow().leader.clone())
        .unwrap();
    let index = fleet
        .iter()
        .position(|(id, _)| *id == leader.as_str())
        .unwrap();
    let before = fleet[index].1.status.borrow().fleet.clone().unwrap();
    assert!(
        before.desired_workers > before.recommended,
        "held up by the scale-down window when the leader crashes: {before:?}"
    );
    fleet.remove(index).1.task.abort();
    // For the rest of the window, every figure the others show is at least what was said,
    // and one of them leads and says it.
    let until = Instant::now() + Duration::from_secs(40);
    while Instant::now() < until {
        sleep(Duration::from_secs(1)).await;
        for (_, r) in &fleet {
            if let Some(s) = r.status.borrow().fleet.clone() {
                assert!(
                    s.desired_workers >= before.desired_workers,
                    "{s:?} after {before:?}"
                );
            }
        }
    }
    let next = fleet.iter().find(|(id, r)| {
        r.status
            .borrow()
            .leader
            .as_ref()
            .is_some_and(|l| l.as_str() == *id)
    });
    assert!(next.is_some(), "a new leader within 40 s");
    producer.abort();
}
