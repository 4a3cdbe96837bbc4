//! Operator actions while the fleet runs (`kcl_core::admin`, the `kcl-admin` CLI): a drained
//! worker hands its leases over and takes none back until it starts again. In-memory
//! backends, paused time. (Resets while the fleet runs are in the simulation; here, the
//! refusal of a finished lease.)
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Behaviour, config, delivered_by, fill, held, start, undelivered, wait_until, world};
use kcl_core::{Coordination, WorkerId};

/// The worker not holding the leader's row (under `Coordination::Leader`, a follower).
fn follower(store: &kcl_core::memory::MemoryLeaseStore) -> &'static str {
    let leader = store
        .leases()
        .into_iter()
        .find(|l| l.key.as_str() == "kcl-coordination/worker-leader")
        .and_then(|l| l.owner);
    if leader.is_some_and(|l| l.as_str() == "a") {
        "c"
    } else {
        "a"
    }
}

async fn drained_worker_hands_over_and_stays_idle_until_it_starts_again(mode: Coordination) {
    let (stream, store, seen) = world(4);
    let b = Behaviour::default(); // checkpoints when asked to stop: a handoff repeats nothing
    let cfg = || config().coordination(mode);
    let w1 = start("a", cfg(), &stream, &store, &seen, &b);
    let w2 = start("c", cfg(), &stream, &store, &seen, &b);
    let two_each = || held(&w1) == 2 && held(&w2) == 2;
    assert!(
        wait_until(Duration::from_secs(30), two_each)
            .await
            .is_some()
    );
    let before = fill(&stream, 200);
    assert!(
        wait_until(Duration::from_secs(10), || undelivered(&seen, &before) == 0)
            .await
            .is_some()
    );

    // Under a leader, a follower: the leader must give it nothing back.
    let name = follower(&store);
    let (a1, c) = if name == "a" { (w1, w2) } else { (w2, w1) };
    let asked = kcl_core::admin::release(&store, &WorkerId::from(name))
        .await
        .unwrap();
    assert_eq!(asked.len(), 2, "{asked:?}");
    let drained = wait_until(Duration::from_secs(30), || held(&a1) == 0 && held(&c) == 4).await;
    assert!(
        drained.is_some(),
        "a {:?} c {:?}",
        a1.status.borrow(),
        c.status.borrow()
    );
    // It stays drained: nothing is written to it, nor asked of others for it.
    let drained_at = tokio::time::Instant::now();
    tokio::time::sleep(config().failover_time * 3).await;
    assert_eq!((held(&a1), held(&c)), (0, 4));
    let offered = store.journal().into_iter().filter(|e| {
        e.at > drained_at
            && !kcl_core::singleton::is_coordination_key(&e.lease.key)
            && (e.lease.owner.as_ref().is_some_and(|o| o.as_str() == name)
                || e.lease
                    .handoff_to
                    .as_ref()
                    .is_some_and(|t| t.as_str() == name))
    });
    let offered: Vec<_> = offered.map(|e| (e.operation, e.lease.key)).collect();
    assert!(
        offered.is_empty(),
        "given to the drained worker: {offered:?}"
    );
    let during = fill(&stream, 200);
    assert!(
        wait_until(Duration::from_secs(10), || undelivered(&seen, &during) == 0)
            .await
            .is_some()
    );
    let repeats = delivered_by(&seen).values().filter(|w| w.len() > 1).count();
    assert_eq!(repeats, 0, "the handoffs repeated records");

    // After maintenance it starts again, and takes its share.
    a1.shutdown.shutdown();
    a1.task.await.unwrap().unwrap();
    let a2 = start(name, cfg(), &stream, &store, &seen, &b);
    let back = wait_until(Duration::from_secs(60), || held(&a2) == 2 && held(&c) == 2).await;
    assert!(
        back.is_some(),
        "a {:?} c {:?}",
        a2.status.borrow(),
        c.status.borrow()
    );
    for w in [a2, c] {
        w.shutdown.shutdown();
        w.task.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_drained_worker_under_a_leader_hands_over_and_stays_idle() {
    drained_worker_hands_over_and_stays_idle_until_it_starts_again(Coordination::Leader).await;
}

#[tokio::test(start_paused = true)]
async fn a_drained_worker_coordinating_for_itself_hands_over_and_stays_idle() {
    drained_worker_hands_over_and_stays_idle_until_it_starts_again(Coordination::EveryWorker).await;
}

#[tokio::test(start_paused = true)]
async fn releasing_the_only_worker_is_refused_by_name() {
    let (stream, store, seen) = world(2);
    let a = start("a", config(), &stream, &store, &seen, &Behaviour::default());
    assert!(
        wait_until(Duration::from_secs(10), || held(&a) == 2)
            .await
            .is_some()
    );
    let refused = kcl_core::admin::release(&store, &WorkerId::from("a")).await;
    let text = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("no other worker"), "{text}");
    assert_eq!(held(&a), 2);
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_finished_lease_is_not_reset_behind_its_children() {
    use kcl_core::admin::{ResetTo, reset};
    use kcl_core::lease::Lease;
    use kcl_core::{Checkpoint, ErrorKind, ExtendedSequenceNumber, SequenceNumber, ShardId};

    let store = kcl_core::memory::MemoryLeaseStore::new();
    let parent = ShardId::new("shardId-000000000000");
    store.insert(Lease::new(parent.clone(), Checkpoint::ShardEnd));
    let to = ResetTo {
        checkpoint: Checkpoint::Sequence(ExtendedSequenceNumber::new(SequenceNumber::from(
            1_000u128,
        ))),
        pin: None,
    };
    let refused = reset(&store, &parent, &to).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Fatal, "{refused}");
    assert!(refused.to_string().contains("SHARD_END"), "{refused}");
    let row = store
        .leases()
        .into_iter()
        .find(|l| l.key == parent)
        .unwrap();
    assert_eq!(row.checkpoint, Checkpoint::ShardEnd, "the row is as it was");
}
