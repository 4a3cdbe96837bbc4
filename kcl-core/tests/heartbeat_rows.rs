//! A live worker's heartbeat row deleted by hand (an operator, `remove-kcl-rows` with too
//! short a watch): under `liveness = heartbeat` its leases are renewed by that row only, so an
//! absent row read as "owner dead" let another worker take them at once while the owner still
//! delivered (two readers of a shard for seconds, seen against the emulators). Its absence now
//! counts only from when it was first seen: nobody takes the owner's leases until the row has
//! been absent for the failover time, by which time the owner has found its row gone at its
//! next renewal and stopped. Paused time, in-memory backends.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Behaviour, held, start, wait_until, world};
use kcl_core::{Coordination, LeaseStore as _, Liveness, ShardId};
use tokio::time::{Instant, sleep};

#[tokio::test(start_paused = true)]
async fn a_deleted_heartbeat_row_does_not_make_its_owners_leases_look_dead() {
    let config = common::config()
        .coordination(Coordination::Leader)
        .liveness(Liveness::Heartbeat);
    let (stream, store, seen) = world(6);
    let b = Behaviour::default();
    let workers: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|id| start(id, config.clone(), &stream, &store, &seen, &b))
        .collect();
    let settled = wait_until(Duration::from_secs(60), || {
        workers.iter().all(|w| held(w) == 2)
    })
    .await;
    assert!(settled.is_some(), "the fleet did not settle");
    sleep(Duration::from_secs(10)).await;
    // A follower's (the leader takes what it sees expired).
    let leader = store
        .get(&ShardId::new("kcl-coordination/worker-leader"))
        .await;
    let leader = leader.unwrap().and_then(|r| r.owner).unwrap().to_string();
    let victim = ["a", "b", "c"].into_iter().find(|w| *w != leader).unwrap();
    let from = store.journal().len();
    let deleted = Instant::now();
    // The operator's script deletes it again and again for two seconds (the worker makes
    // it again at each cycle): every other worker reads the table without it at some point.
    let key = ShardId::new(format!("kcl-coordination/worker/{victim}"));
    while deleted.elapsed() < Duration::from_secs(2) {
        if let Ok(Some(row)) = store.get(&key).await {
            let _ = store.delete(&row).await;
        }
        sleep(Duration::from_millis(50)).await;
    }
    sleep(Duration::from_secs(28)).await;
    let taken: Vec<_> = store.journal()[from..]
        .iter()
        .filter(|e| e.operation == "take" && e.client != victim)
        .filter(|e| !e.lease.key.as_str().starts_with("kcl-coordination/"))
        .map(|e| (e.client.clone(), e.lease.key.to_string(), e.at - deleted))
        .collect();
    let first = taken.iter().map(|(_, _, at)| *at).min();
    assert!(
        first.is_none_or(|at| at >= config.failover_time),
        "{victim}'s leases taken {first:?} after its row was deleted: {taken:?}"
    );
    let all = wait_until(Duration::from_secs(60), || {
        workers.iter().map(held).sum::<usize>() == 6
    })
    .await;
    assert!(all.is_some(), "the shards are not all held again");
    for w in workers {
        w.shutdown.shutdown();
        let _ = w.task.await;
    }
}
