//! Deploys that move nothing, on the in-memory backends under paused time: a worker with a
//! stable id keeps its leases through a graceful restart (`restart_grace`) and resumes them at
//! once; if it does not come back they fail over after the failover time + the grace; a
//! process of the same id still running is fenced by the resume; and under a leader a lease
//! released by a leaving worker moves once, to the least loaded worker (a surge pod); a
//! drained worker (a scale-in) releases its leases whatever its restart grace.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Behaviour, Recorder, Seen, config, delivered_by, fill, held, wait_until, world};
use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::singleton::is_coordination_key;
use kcl_core::{Coordination, Liveness, ShardId, Worker, WorkerConfig};
use tokio::time::{Instant, sleep};

const GRACE: Duration = Duration::from_secs(20);

/// Every coordination and liveness mode.
fn modes() -> [(Coordination, Liveness); 4] {
    [
        (Coordination::Leader, Liveness::PerLease),
        (Coordination::Leader, Liveness::Heartbeat),
        (Coordination::EveryWorker, Liveness::PerLease),
        (Coordination::EveryWorker, Liveness::Heartbeat),
    ]
}

fn config_in((coordination, liveness): (Coordination, Liveness)) -> WorkerConfig {
    config()
        .coordination(coordination)
        .liveness(liveness)
        .restart_grace(GRACE)
}

/// Starts worker `id` talking to the store as `client` (two processes of one id apart in the
/// store's journal).
fn start_as(
    id: &str,
    client: &str,
    config: WorkerConfig,
    (stream, store, seen): (&MemoryStream, &MemoryLeaseStore, &Seen),
    behaviour: &Behaviour,
) -> common::Running {
    let (worker, seen, behaviour) = (client.to_owned(), seen.clone(), behaviour.clone());
    let w = Worker::new(
        id,
        config,
        stream.client(client),
        store.client(client),
        move |shard: &ShardId| Recorder {
            worker: worker.clone(),
            shard: shard.clone(),
            seen: seen.clone(),
            behaviour: behaviour.clone(),
        },
    )
    .unwrap();
    common::Running {
        shutdown: w.shutdown_handle(),
        status: w.status(),
        task: tokio::spawn(w.run()),
    }
}

/// The shard leases `id` owns in the table.
fn owned(store: &MemoryLeaseStore, id: &str) -> BTreeSet<ShardId> {
    store
        .leases()
        .into_iter()
        .filter(|l| {
            !is_coordination_key(&l.key) && l.owner.as_ref().is_some_and(|o| o.as_str() == id)
        })
        .map(|l| l.key)
        .collect()
}

/// Takes of `keys` by a client other than `except`'s processes, from journal event `from` on.
fn taken_by_others(
    store: &MemoryLeaseStore,
    keys: &BTreeSet<ShardId>,
    except: &str,
    from: usize,
) -> Vec<String> {
    store.journal()[from..]
        .iter()
        .filter(|e| e.operation == "take" && keys.contains(&e.lease.key))
        .filter(|e| e.lease.owner.as_ref().is_none_or(|o| o.as_str() != except))
        .map(|e| format!("{} took {} for {:?}", e.client, e.lease.key, e.lease.owner))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_restarted_worker_keeps_its_leases_and_resumes_them_at_once() {
    let b = Behaviour::default(); // checkpoints only in shutdown_requested
    for mode in modes() {
        let (stream, store, seen) = world(8);
        let world = (&stream, &store, &seen);
        let a = start_as("a", "a/1", config_in(mode), world, &b);
        let c = start_as("c", "c", config_in(mode), world, &b);
        assert!(
            wait_until(Duration::from_secs(20), || held(&a) == 4 && held(&c) == 4)
                .await
                .is_some(),
            "{mode:?}: balanced"
        );
        fill(&stream, 200);
        assert!(
            wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 200)
                .await
                .is_some()
        );
        let kept = owned(&store, "a");
        let mark = store.journal().len();
        a.shutdown.shutdown();
        a.task.await.unwrap().unwrap();
        // Still a's, each marked by its last write.
        let rows = store.leases();
        for key in &kept {
            let row = rows.iter().find(|l| &l.key == key).unwrap();
            assert_eq!(
                row.owner.as_ref().map(|o| o.as_str()),
                Some("a"),
                "{mode:?}"
            );
            assert_eq!(row.restart_grace, Some(GRACE), "{mode:?}: {row:?}");
        }
        // Down for longer than the failover time, well within the grace.
        sleep(config().failover_time + Duration::from_secs(4)).await;
        fill(&stream, 100);
        let back = Instant::now();
        let a = start_as("a", "a/2", config_in(mode), world, &b);
        let resumed = wait_until(Duration::from_secs(10), || held(&a) == 4).await;
        assert!(
            resumed.is_some_and(|t| t <= config().taker_interval * 2),
            "{mode:?}: resumed after {resumed:?}"
        );
        assert_eq!(owned(&store, "a"), kept, "{mode:?}: the same leases");
        assert!(
            store.leases().iter().all(|l| l.restart_grace.is_none()),
            "{mode:?}: a resume clears the mark"
        );
        assert_eq!(
            taken_by_others(&store, &kept, "a", mark),
            Vec::<String>::new(),
            "{mode:?}: no lease moved"
        );
        assert!(
            wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 300)
                .await
                .is_some(),
            "{mode:?}: nothing lost ({:?} since the return)",
            back.elapsed()
        );
        let repeats = delivered_by(&seen).values().filter(|w| w.len() > 1).count();
        assert_eq!(
            repeats, 0,
            "{mode:?}: checkpointed at shutdown, resumed from there"
        );
        for w in [a, c] {
            w.shutdown.shutdown();
            w.task.await.unwrap().unwrap();
        }
    }
}

#[tokio::test(start_paused = true)]
async fn kept_leases_fail_over_after_failover_plus_grace_if_the_worker_stays_away() {
    let b = Behaviour {
        every_batch: true,
        ..Behaviour::default()
    };
    for mode in modes() {
        let (stream, store, seen) = world(6);
        let world = (&stream, &store, &seen);
        let a = start_as("a", "a", config_in(mode), world, &b);
        let c = start_as("c", "c", config_in(mode), world, &b);
        assert!(
            wait_until(Duration::from_secs(20), || held(&a) == 3 && held(&c) == 3)
                .await
                .is_some()
        );
        a.shutdown.shutdown();
        a.task.await.unwrap().unwrap();
        let stopped = Instant::now();
        let moved = wait_until(Duration::from_secs(60), || held(&c) == 6).await;
        let expiry = config().failover_time + GRACE;
        // Observed standing still that long, then a cycle or two (a new leader's included).
        let bound = expiry + config().taker_interval * 4;
        assert!(
            moved.is_some_and(|t| t >= expiry && t <= bound),
            "{mode:?}: took {moved:?}, expected {expiry:?}..={bound:?}"
        );
        fill(&stream, 100);
        assert!(
            wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 100)
                .await
                .is_some(),
            "{mode:?}: nothing lost ({:?})",
            stopped.elapsed()
        );
        c.shutdown.shutdown();
        c.task.await.unwrap().unwrap();
    }
}

/// A drain (`ShutdownHandle::drain`, a scale-in) releases every lease even under a restart
/// grace: the worker is not coming back, so nothing waits for it. The other worker takes them
/// within a few taker cycles, far below the failover time; every record is delivered once
/// (checkpointed at shutdown), and no row keeps a restart mark.
#[tokio::test(start_paused = true)]
async fn a_drained_worker_releases_its_leases_even_under_a_restart_grace() {
    let b = Behaviour::default(); // checkpoints only in shutdown_requested
    for mode in modes() {
        let (stream, store, seen) = world(6);
        let world = (&stream, &store, &seen);
        let a = start_as("a", "a", config_in(mode), world, &b);
        let c = start_as("c", "c", config_in(mode), world, &b);
        assert!(
            wait_until(Duration::from_secs(20), || held(&a) == 3 && held(&c) == 3)
                .await
                .is_some(),
            "{mode:?}: balanced"
        );
        fill(&stream, 120);
        assert!(
            wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 120)
                .await
                .is_some()
        );
        let mark = store.journal().len();
        a.shutdown.drain();
        assert!(a.shutdown.is_draining() && a.shutdown.is_shutdown());
        a.task.await.unwrap().unwrap();
        // Released by the handback itself: no write kept a lease for a restart.
        let kept: Vec<String> = store.journal()[mark..]
            .iter()
            .filter(|e| e.lease.restart_grace.is_some())
            .map(|e| format!("{} {} {}", e.client, e.operation, e.lease.key))
            .collect();
        assert_eq!(
            kept,
            Vec::<String>::new(),
            "{mode:?}: nothing kept for a restart"
        );
        let moved = wait_until(Duration::from_secs(30), || held(&c) == 6).await;
        let bound = config().taker_interval * 4;
        assert!(
            moved.is_some_and(|t| t <= bound),
            "{mode:?}: taken after {moved:?}, expected within {bound:?} (failover {:?})",
            config().failover_time
        );
        fill(&stream, 60);
        assert!(
            wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 180)
                .await
                .is_some(),
            "{mode:?}: nothing lost"
        );
        let repeats = delivered_by(&seen).values().filter(|w| w.len() > 1).count();
        assert_eq!(repeats, 0, "{mode:?}: checkpointed at the drain");
        c.shutdown.shutdown();
        c.task.await.unwrap().unwrap();
    }
}

/// Two processes of one worker id at once (a pod thought gone, still running): the newer
/// takes the leases naming its id, each by a conditional take, and from then on no write of
/// the older one applies until it takes the lease back itself: one unfenced owner at a time.
/// (The two may take the leases from each other again and again: an id must be unique at
/// any instant, as `WorkerBuilder::id` says; what it cannot cost is a second owner.)
#[tokio::test(start_paused = true)]
async fn a_resume_fences_an_older_process_of_the_same_id() {
    let b = Behaviour {
        every_batch: true,
        ..Behaviour::default()
    };
    for mode in modes() {
        let (stream, store, seen) = world(4);
        let world = (&stream, &store, &seen);
        let old = start_as("a", "a/old", config_in(mode), world, &b);
        assert!(
            wait_until(Duration::from_secs(10), || held(&old) == 4)
                .await
                .is_some()
        );
        fill(&stream, 50);
        sleep(Duration::from_secs(1)).await;
        let from = store.journal().len();
        let new = start_as("a", "a/new", config_in(mode), world, &b);
        assert!(
            wait_until(Duration::from_secs(20), || held(&new) > 0)
                .await
                .is_some(),
            "{mode:?}: the new process resumes"
        );
        fill(&stream, 50);
        sleep(Duration::from_secs(5)).await;
        // Per lease, the writes of a process apply only between its take and the other's.
        let mut holder = std::collections::BTreeMap::new();
        let mut resumed = 0;
        for e in &store.journal()[from..] {
            if is_coordination_key(&e.lease.key) {
                continue;
            }
            if e.operation == "take" {
                resumed += usize::from(e.client == "a/new");
                holder.insert(e.lease.key.clone(), e.client.clone());
            } else if matches!(e.operation, "renew" | "checkpoint" | "release") {
                let by = holder.get(&e.lease.key).map_or("a/old", String::as_str);
                assert_eq!(by, e.client, "{mode:?}: {} of {}", e.operation, e.lease.key);
            }
        }
        assert!(resumed >= 1, "{mode:?}");
        assert!(
            wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 100)
                .await
                .is_some(),
            "{mode:?}: nothing lost"
        );
        for w in [old, new] {
            w.shutdown.shutdown();
            w.task.await.unwrap().unwrap();
        }
    }
}

/// A rolling replace under a leader: a new worker (a surge pod, with a name of its own)
/// joins, then one of the others shuts down and releases its leases. Each goes straight to
/// the least loaded worker, the new one, and moves no further: one move per lease, not two
/// (to the leader, then on).
#[tokio::test(start_paused = true)]
async fn a_released_lease_moves_once_to_the_least_loaded_worker() {
    let b = Behaviour::default();
    let (stream, store, seen) = world(8);
    let world = (&stream, &store, &seen);
    let base = config().max_leases_to_steal(1);
    let a = start_as("a", "a", base.clone(), world, &b);
    let c = start_as("c", "c", base.clone(), world, &b);
    assert!(
        wait_until(Duration::from_secs(20), || held(&a) == 4 && held(&c) == 4)
            .await
            .is_some()
    );
    // The follower leaves (the leader's leaving is the leader's own failover).
    let leader = a
        .status
        .borrow()
        .leader
        .clone()
        .map(|l| l.as_str().to_owned());
    let (stays, leaves, leaving) = if leader.as_deref() == Some("a") {
        (a, c, "c")
    } else {
        (c, a, "a")
    };
    let n = start_as("n", "n", base.clone(), world, &b);
    // The new worker makes itself known (it asks for a lease).
    sleep(config().taker_interval * 2).await;
    let released = owned(&store, leaving);
    let from = store.journal().len();
    leaves.shutdown.shutdown();
    leaves.task.await.unwrap().unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || held(&n) + held(&stays) == 8
            && held(&n) >= 3)
        .await
        .is_some(),
        "held: n {}, the other {}",
        held(&n),
        held(&stays)
    );
    sleep(config().failover_time).await;
    let journal = store.journal();
    for key in &released {
        let takes: Vec<String> = journal[from..]
            .iter()
            .filter(|e| e.operation == "take" && &e.lease.key == key)
            .map(|e| format!("{} for {:?}", e.client, e.lease.owner))
            .collect();
        // Assigned to its new owner (written by the leader), then adopted by it: one move.
        let owners: BTreeSet<_> = journal[from..]
            .iter()
            .filter(|e| e.operation == "take" && &e.lease.key == key)
            .map(|e| e.lease.owner.clone())
            .collect();
        assert_eq!(owners.len(), 1, "{key}: {takes:?}");
    }
    fill(&stream, 100);
    assert!(
        wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 100)
            .await
            .is_some()
    );
    for w in [stays, n] {
        w.shutdown.shutdown();
        w.task.await.unwrap().unwrap();
    }
}
