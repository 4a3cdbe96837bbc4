//! The leader and standby rows under `Coordination::Leader` are carried by rows their holders
//! renew anyway (`kcl_core::singleton` `carried`, `worker/roles`): an idle fleet writes them
//! never, whatever its liveness; a dead leader is still replaced within the failover time and
//! a cycle or two, and the leader hands the standby row to a follower; a leader that hands its
//! carrier over names another and goes on leading. Paused time, in-memory backends.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Behaviour, Running, held, start, wait_until, world};
use kcl_core::memory::MemoryLeaseStore;
use kcl_core::{Coordination, Lease, LeaseStore as _, Liveness, WorkerConfig, WorkerId};
use tokio::time::{Instant, sleep};

const LEADER: &str = "kcl-coordination/worker-leader";
const STANDBY: &str = "kcl-coordination/worker-standby";

fn config(liveness: Liveness) -> WorkerConfig {
    common::config()
        .coordination(Coordination::Leader)
        .liveness(liveness)
}

fn row(store: &MemoryLeaseStore, key: &str) -> Option<Lease> {
    store.leases().into_iter().find(|l| l.key.as_str() == key)
}

fn holder(store: &MemoryLeaseStore, key: &str) -> Option<String> {
    row(store, key).and_then(|l| l.owner).map(|o| o.to_string())
}

/// Starts `ids` over `shards` shards and waits until every shard is held, balanced, and both
/// roles are held.
async fn fleet(
    ids: &[&str],
    shards: u32,
    config: &WorkerConfig,
) -> (
    kcl_core::memory::MemoryStream,
    MemoryLeaseStore,
    Vec<Running>,
) {
    let (stream, store, seen) = world(shards);
    let b = Behaviour::default();
    let workers: Vec<Running> = ids
        .iter()
        .map(|id| start(id, config.clone(), &stream, &store, &seen, &b))
        .collect();
    let each = shards as usize / ids.len();
    let settled = wait_until(Duration::from_secs(60), || {
        workers.iter().all(|w| held(w) == each)
            && holder(&store, LEADER).is_some()
            && holder(&store, STANDBY).is_some()
    })
    .await;
    assert!(settled.is_some(), "the fleet did not settle");
    (stream, store, workers)
}

async fn stop(workers: Vec<Running>) {
    for w in workers {
        w.shutdown.shutdown();
        let _ = w.task.await;
    }
}

/// Under either liveness, an idle fleet writes neither role row in a minute (it wrote one
/// every half failover time each before), and each names a carrier its holder owns.
#[tokio::test(start_paused = true)]
async fn an_idle_fleet_writes_no_role_row() {
    for liveness in [Liveness::PerLease, Liveness::Heartbeat] {
        let (_stream, store, workers) = fleet(&["a", "b", "c"], 6, &config(liveness)).await;
        sleep(Duration::from_secs(20)).await;
        let from = store.journal().len();
        sleep(Duration::from_secs(60)).await;
        let writes: Vec<_> = store.journal()[from..]
            .iter()
            .filter(|e| [LEADER, STANDBY].contains(&e.lease.key.as_str()))
            .map(|e| (e.client.clone(), e.operation, e.lease.key.to_string()))
            .collect();
        assert!(
            writes.is_empty(),
            "{liveness:?}: role rows written: {writes:?}"
        );
        for key in [LEADER, STANDBY] {
            let role = row(&store, key).unwrap();
            let carrier = role.carrier.as_ref().expect("a carrier");
            let carrier_row = store.leases().into_iter().find(|l| &l.key == carrier);
            assert!(
                carrier_row.is_some_and(|c| c.owner == role.owner),
                "{liveness:?}: {key} names {carrier}, not its holder's"
            );
        }
        assert_ne!(holder(&store, LEADER), holder(&store, STANDBY));
        stop(workers).await;
    }
}

/// The leader dies (its process gone): the standby takes the leader row within the failover
/// time and a couple of cycles, the dead leader's leases right after, and the new leader
/// hands the standby row to the remaining follower, which takes it within another half
/// failover time or so (its next index query).
#[tokio::test(start_paused = true)]
async fn a_dead_leader_is_replaced_and_the_standby_row_handed_on() {
    let ids = ["a", "b", "c"];
    let config = config(Liveness::PerLease);
    let (_stream, store, mut workers) = fleet(&ids, 6, &config).await;
    sleep(Duration::from_secs(10)).await;
    let (leader, standby) = (
        holder(&store, LEADER).unwrap(),
        holder(&store, STANDBY).unwrap(),
    );
    let at = ids.iter().position(|id| *id == leader).unwrap();
    let dead = workers.remove(at);
    dead.task.abort();
    let killed = Instant::now();
    let (failover, taker) = (config.failover_time, config.taker_interval);
    let led = wait_until(Duration::from_secs(60), || {
        holder(&store, LEADER).is_some_and(|h| h == standby)
    })
    .await;
    let orphans = wait_until(Duration::from_secs(60), || {
        store.leases().iter().all(|l| {
            l.key.as_str().starts_with("kcl-coordination/")
                || l.owner != Some(WorkerId::new(&leader))
        })
    })
    .await;
    let follower = ids
        .iter()
        .find(|id| ![&leader, &standby].contains(&&id.to_string()))
        .unwrap();
    let handed = wait_until(Duration::from_secs(60), || {
        holder(&store, STANDBY).is_some_and(|h| h == *follower)
            && row(&store, STANDBY)
                .is_some_and(|r| r.carrier.is_some_and(|c| !c.as_str().ends_with("standby")))
    })
    .await;
    eprintln!(
        "killed {leader}: {standby} leads {led:?} later, the leases moved by {orphans:?}, {follower} stands by {:?} after the kill",
        handed.map(|_| killed.elapsed())
    );
    let bound = failover + taker * 3;
    assert!(
        led.is_some_and(|t| t <= bound),
        "led after {led:?}, bound {bound:?}"
    );
    assert!(
        orphans.is_some_and(|t| t <= bound + taker),
        "leases after {orphans:?}, bound {:?}",
        bound + taker
    );
    let bound = bound + failover / 2 + taker * 3;
    assert!(
        handed.is_some() && killed.elapsed() <= bound,
        "standby after {:?}, bound {bound:?}",
        killed.elapsed()
    );
    stop(workers).await;
}

/// The leader hands its carrier (a lease) to another worker: it names another lease of its
/// own in its row, at once, and keeps leading; nobody takes the row.
#[tokio::test(start_paused = true)]
async fn a_leader_handing_its_carrier_over_names_another() {
    let config = config(Liveness::PerLease);
    let (_stream, store, workers) = fleet(&["a", "b"], 4, &config).await;
    sleep(Duration::from_secs(10)).await;
    let leader = holder(&store, LEADER).unwrap();
    let standby = holder(&store, STANDBY).unwrap();
    let carrier = row(&store, LEADER).unwrap().carrier.unwrap();
    let carried = row(&store, carrier.as_str()).unwrap();
    assert_eq!(
        carried.owner.as_ref().map(|o| o.to_string()),
        Some(leader.clone())
    );
    let from = store.journal().len();
    store
        .request_handoff(&carried, Some(&WorkerId::new(&standby)))
        .await
        .unwrap();
    let moved = wait_until(Duration::from_secs(30), || {
        holder(&store, carrier.as_str()).is_some_and(|h| h == standby)
    })
    .await;
    assert!(moved.is_some(), "the carrier was not handed over");
    sleep(config.failover_time * 2).await;
    let now = row(&store, LEADER).unwrap();
    assert_eq!(
        now.owner.as_ref().map(|o| o.to_string()),
        Some(leader.clone())
    );
    let renamed = now.carrier.unwrap();
    assert_ne!(renamed, carrier);
    assert!(holder(&store, renamed.as_str()).is_some_and(|h| h == leader));
    let takes: Vec<_> = store.journal()[from..]
        .iter()
        .filter(|e| e.lease.key.as_str() == LEADER && e.operation == "take")
        .map(|e| e.client.clone())
        .collect();
    assert!(takes.is_empty(), "the leader row changed hands: {takes:?}");
    stop(workers).await;
}

/// Holds `shutdown_requested` until told: the worker's shutdown waits on it, after its roles
/// were given back.
struct HeldShutdown(Arc<tokio::sync::Notify>);

impl kcl_core::RecordProcessor for HeldShutdown {
    async fn process_records(
        &mut self,
        _: kcl_core::ProcessRecordsInput<'_>,
        _: &mut kcl_core::Checkpointer,
    ) -> Result<(), kcl_core::BoxError> {
        Ok(())
    }

    async fn shutdown_requested(
        &mut self,
        cp: &mut kcl_core::Checkpointer,
    ) -> Result<(), kcl_core::BoxError> {
        self.0.notified().await;
        cp.checkpoint().await?;
        Ok(())
    }
}

/// The leader hands the standby row on to a follower that, unknown to it, is shutting down
/// (its last cycle is over): the follower gives the row back with its leases, instead of
/// leaving it owned by a worker that is gone until the leader sees it stand still.
#[tokio::test(start_paused = true)]
async fn a_standby_row_handed_over_during_shutdown_is_given_back() {
    let (stream, store, _) = world(1);
    let release = Arc::new(tokio::sync::Notify::new());
    let held_shutdown = release.clone();
    let worker = kcl_core::Worker::new(
        "x",
        config(Liveness::PerLease),
        stream.client("x"),
        store.client("x"),
        move |_: &kcl_core::ShardId| HeldShutdown(held_shutdown.clone()),
    )
    .unwrap();
    let (shutdown, status) = (worker.shutdown_handle(), worker.status());
    let task = tokio::spawn(worker.run());
    let took = wait_until(Duration::from_secs(30), || status.borrow().held.len() == 1).await;
    assert!(took.is_some(), "x took the shard");
    shutdown.shutdown();
    // Its roles go back while its shard waits in `shutdown_requested`.
    let gone = wait_until(Duration::from_secs(10), || holder(&store, LEADER).is_none()).await;
    assert!(gone.is_some(), "the leader row given back");
    // Now the standby row is written naming x, as a leader handing it on does.
    let key = kcl_core::ShardId::new(STANDBY);
    let fresh = Lease::new(key.clone(), kcl_core::Checkpoint::TrimHorizon);
    let _ = store.create(&fresh).await;
    let current = store.get(&key).await.unwrap().unwrap();
    store.take(&current, &WorkerId::new("x")).await.unwrap();
    release.notify_one();
    task.await.unwrap().unwrap();
    assert_eq!(holder(&store, STANDBY), None, "the standby row given back");
    assert_eq!(held_rows(&store, "x"), 0, "nothing left naming x");
}

/// Rows naming `worker`.
fn held_rows(store: &MemoryLeaseStore, worker: &str) -> usize {
    store
        .leases()
        .iter()
        .filter(|l| l.owner.as_ref().is_some_and(|o| o.as_str() == worker))
        .count()
}
