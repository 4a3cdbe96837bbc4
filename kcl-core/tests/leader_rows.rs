//! One leader always, whatever an operator does to the role rows and whatever dies: the
//! leader row deleted under a running fleet (by hand, or by `kcl-admin remove-kcl-rows` run
//! against a live fleet), or deleted and created again, unowned or taken by someone else;
//! the leader and the standby killed together, or one after the other. Each worker's
//! `Status::leading` is sampled every 50 ms for two minutes: two workers lead at once for at
//! most a taker interval and a read, never past the failover time, and the fleet is without
//! a leader for at most about two failover times and a few taker intervals. Paused time,
//! in-memory backends.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod common;

use std::time::Duration;

use common::{Behaviour, Running, held, start, wait_until, world};
use kcl_core::memory::MemoryLeaseStore;
use kcl_core::{
    Checkpoint, Coordination, Lease, LeaseStore as _, Liveness, Phase, ShardId, WorkerConfig,
    WorkerId,
};
use tokio::time::{Instant, sleep};

const LEADER: &str = "kcl-coordination/worker-leader";
const STANDBY: &str = "kcl-coordination/worker-standby";
const IDS: [&str; 4] = ["a", "b", "c", "d"];

fn config(liveness: Liveness) -> WorkerConfig {
    common::config()
        .coordination(Coordination::Leader)
        .liveness(liveness)
}

fn holder(store: &MemoryLeaseStore, key: &str) -> Option<String> {
    let row = store.leases().into_iter().find(|l| l.key.as_str() == key);
    row.and_then(|l| l.owner).map(|o| o.to_string())
}

async fn fleet(config: &WorkerConfig) -> (MemoryLeaseStore, Vec<Option<Running>>) {
    fleet_of(config, &Behaviour::default()).await
}

async fn fleet_of(
    config: &WorkerConfig,
    b: &Behaviour,
) -> (MemoryLeaseStore, Vec<Option<Running>>) {
    let (stream, store, seen) = world(8);
    let workers: Vec<Running> = IDS
        .iter()
        .map(|id| start(id, config.clone(), &stream, &store, &seen, b))
        .collect();
    let settled = wait_until(Duration::from_secs(60), || {
        workers.iter().all(|w| held(w) == 2)
            && holder(&store, LEADER).is_some()
            && holder(&store, STANDBY).is_some()
    })
    .await;
    assert!(settled.is_some(), "the fleet did not settle");
    (store, workers.into_iter().map(Some).collect())
}

/// Who leads, by `Status::leading`, sampled every 50 ms for `span`: the longest stretch two
/// or more workers led at once, and the longest stretch nobody did (from `from` on).
async fn watch(
    workers: &[Option<Running>],
    span: Duration,
    from: Duration,
) -> (Duration, Duration) {
    let step = Duration::from_millis(50);
    let start = Instant::now();
    let (mut two, mut none) = (None::<Instant>, None::<Instant>);
    let (mut longest_two, mut longest_none) = (Duration::ZERO, Duration::ZERO);
    while start.elapsed() < span {
        let leading = workers
            .iter()
            .flatten()
            .filter(|w| w.status.borrow().leading)
            .count();
        let now = Instant::now();
        two = if leading >= 2 {
            two.or(Some(now))
        } else {
            None
        };
        none = if leading == 0 && start.elapsed() >= from {
            none.or(Some(now))
        } else {
            None
        };
        longest_two = longest_two.max(two.map_or(Duration::ZERO, |t| now - t));
        longest_none = longest_none.max(none.map_or(Duration::ZERO, |t| now - t));
        sleep(step).await;
    }
    (longest_two, longest_none)
}

fn leaders(workers: &[Option<Running>]) -> Vec<String> {
    let leading = workers.iter().flatten().zip(IDS);
    leading
        .filter(|(w, _)| w.status.borrow().leading)
        .map(|(_, id)| id.to_owned())
        .collect()
}

async fn stop(workers: Vec<Option<Running>>) {
    for w in workers.into_iter().flatten() {
        w.shutdown.shutdown();
        let _ = w.task.await;
    }
}

/// What is done to the leader row under the fleet.
#[derive(Debug, Clone, Copy)]
enum Hand {
    /// Deleted.
    Delete,
    /// Deleted and created again at once, unowned.
    Recreate,
    /// Deleted, created again and taken by a process that is no worker (and never renews).
    RecreateTaken,
}

async fn apply(store: &MemoryLeaseStore, hand: Hand) {
    let key = ShardId::new(LEADER);
    let row = store.get(&key).await.unwrap().unwrap();
    store.delete(&row).await.unwrap();
    if matches!(hand, Hand::Recreate | Hand::RecreateTaken) {
        let fresh = Lease::new(key.clone(), Checkpoint::TrimHorizon);
        assert!(store.create(&fresh).await.unwrap());
    }
    if matches!(hand, Hand::RecreateTaken) {
        let fresh = store.get(&key).await.unwrap().unwrap();
        store
            .take(&fresh, &WorkerId::new("intruder"))
            .await
            .unwrap();
    }
}

/// The leader row deleted, or deleted and created again, under a running fleet, per-lease
/// and under heartbeats: two workers never lead at once for longer than two taker intervals
/// and a read (the old leader steps down at its next read of the table); a leader leads
/// again within two failover times; exactly one leads at the end.
#[tokio::test(start_paused = true)]
async fn a_leader_steps_down_when_its_row_is_deleted_or_created_again() {
    for liveness in [Liveness::PerLease, Liveness::Heartbeat] {
        for hand in [Hand::Delete, Hand::Recreate, Hand::RecreateTaken] {
            let config = config(liveness);
            let (store, workers) = fleet(&config).await;
            sleep(Duration::from_secs(5)).await;
            let before = holder(&store, LEADER);
            apply(&store, hand).await;
            let (two, none) = watch(&workers, Duration::from_secs(120), Duration::ZERO).await;
            let now = leaders(&workers);
            eprintln!(
                "{liveness:?} {hand:?}: {before:?} led; two led at once for {two:?} at most, none for {none:?}; now {now:?}"
            );
            let overlap = config.taker_interval * 2 + Duration::from_millis(100);
            assert!(
                two <= overlap,
                "{liveness:?} {hand:?}: two leaders for {two:?}"
            );
            let gap = config.failover_time * 2 + config.taker_interval * 4;
            assert!(none <= gap, "{liveness:?} {hand:?}: no leader for {none:?}");
            assert_eq!(
                now.len(),
                1,
                "{liveness:?} {hand:?}: leaders at the end: {now:?}"
            );
            stop(workers).await;
        }
    }
}

/// The leader and the standby die together, or the standby first and the leader a
/// failover time later (the standby row was not handed on yet): a follower leads within two
/// failover times and a few taker intervals of the leader's death (it read the leader row
/// every six failover times before: 33 s without a leader at a failover time of 3 s).
#[tokio::test(start_paused = true)]
async fn a_fleet_whose_leader_and_standby_die_leads_again_within_two_failover_times() {
    for stagger in [Duration::ZERO, Duration::from_secs(6)] {
        let config = config(Liveness::PerLease);
        let (store, mut workers) = fleet(&config).await;
        sleep(Duration::from_secs(5)).await;
        let standby = holder(&store, STANDBY).unwrap();
        let at = IDS.iter().position(|id| *id == standby).unwrap();
        workers[at].take().unwrap().task.abort();
        sleep(stagger).await;
        let leader = holder(&store, LEADER).unwrap();
        let at = IDS.iter().position(|id| *id == leader).unwrap();
        workers[at].take().unwrap().task.abort();
        let killed = Instant::now();
        let led = wait_until(Duration::from_secs(60), || leaders(&workers).len() == 1).await;
        eprintln!(
            "standby {standby} killed, leader {leader} {stagger:?} later: led again {led:?} later"
        );
        let bound = config.failover_time * 2 + config.taker_interval * 4;
        assert!(
            led.is_some_and(|t| t <= bound),
            "led after {led:?}, bound {bound:?}"
        );
        let (two, none) = watch(&workers, Duration::from_secs(30), Duration::ZERO).await;
        assert_eq!(two, Duration::ZERO, "two leaders after a takeover");
        assert_eq!(none, Duration::ZERO, "the new leader stepped down");
        assert!(killed.elapsed() > bound);
        stop(workers).await;
    }
}

/// The standby row deleted under the fleet: its holder steps down, and the leader creates the
/// row again and hands it on, so the fleet has a standby within a few failover times (it had
/// none for good before: nobody created the row again).
#[tokio::test(start_paused = true)]
async fn a_deleted_standby_row_is_made_again_and_handed_on() {
    for liveness in [Liveness::PerLease, Liveness::Heartbeat] {
        let config = config(liveness);
        let (store, workers) = fleet(&config).await;
        sleep(Duration::from_secs(5)).await;
        let key = ShardId::new(STANDBY);
        let row = store.get(&key).await.unwrap().unwrap();
        store.delete(&row).await.unwrap();
        let back = wait_until(Duration::from_secs(60), || {
            let standby = holder(&store, STANDBY);
            standby.is_some() && standby != holder(&store, LEADER)
        })
        .await;
        eprintln!("{liveness:?}: a standby again {back:?} after the row was deleted");
        let bound = config.failover_time * 3;
        assert!(
            back.is_some_and(|t| t <= bound),
            "{liveness:?}: standby after {back:?}"
        );
        let (two, _) = watch(&workers, Duration::from_secs(20), Duration::ZERO).await;
        assert_eq!(two, Duration::ZERO, "{liveness:?}");
        stop(workers).await;
    }
}

/// A leader shutting down runs no more cycles and hands its role back: from the moment its
/// shutdown begins it says it leads no more, so that it and its successor never both say so
/// (a stopped leader said it led, before). Its status is read at every turn of the runtime
/// until it has stopped.
#[tokio::test(start_paused = true)]
async fn a_leader_shutting_down_says_it_leads_no_more() {
    let (store, mut workers) = fleet(&config(Liveness::PerLease)).await;
    let leader = holder(&store, LEADER).expect("a leader");
    let at = IDS
        .iter()
        .position(|id| *id == leader)
        .expect("one of ours");
    let w = workers[at].take().expect("running");
    assert!(w.status.borrow().leading);
    w.shutdown.shutdown();
    let mut seen = Vec::new();
    for _ in 0..100_000 {
        tokio::task::yield_now().await;
        let s = w.status.borrow();
        if seen.last() != Some(&(s.phase, s.leading)) {
            seen.push((s.phase, s.leading));
        }
        if s.phase == Phase::Stopped {
            break;
        }
    }
    assert_eq!(seen.last().map(|(phase, _)| *phase), Some(Phase::Stopped));
    let led = seen
        .iter()
        .filter(|(phase, leading)| *phase != Phase::Running && *leading);
    assert_eq!(
        led.count(),
        0,
        "led while shutting down or stopped: {seen:?}"
    );
    let _ = w.task.await;
    stop(workers).await;
}
