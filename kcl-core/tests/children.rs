//! Children start at once under a leader: when a follower (neither the leader nor the
//! standby, so it never reads the table nor syncs shards) reads a parent to its end, the
//! leader sees the parent's `SHARD_END` in its next read of the table and syncs then, not at
//! its next periodic sync (`shard_sync_interval`, 60 s here): the children's leases exist
//! within a leader cycle or two, and their records are processed a few seconds later (the
//! follower they are assigned to adopts them at its next index query, every half failover
//! time). Paused time, in-memory backends.
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
use kcl_core::{Coordination, ShardId, WorkerConfig};
use tokio::time::{Instant, sleep};

const WORKERS: [&str; 4] = ["a", "b", "c", "d"];

fn config() -> WorkerConfig {
    // A periodic sync far away: only the shard's end can make it come sooner.
    common::config()
        .coordination(Coordination::Leader)
        .shard_sync_interval(Duration::from_secs(60))
}

fn holder_of(store: &kcl_core::memory::MemoryLeaseStore, row: &str) -> Option<String> {
    store
        .leases()
        .into_iter()
        .find(|l| l.key.as_str() == row)
        .and_then(|l| l.owner)
        .map(|o| o.to_string())
}

#[tokio::test(start_paused = true)]
async fn a_followers_shard_end_starts_the_children_within_a_leader_cycle() {
    let (stream, store, seen) = world(8);
    let b = Behaviour {
        every_batch: true,
        ..Behaviour::default()
    };
    let workers: Vec<Running> = WORKERS
        .iter()
        .map(|id| start(id, config(), &stream, &store, &seen, &b))
        .collect();
    let settled = wait_until(Duration::from_secs(60), || {
        workers.iter().all(|w| held(w) == 2)
            && holder_of(&store, "kcl-coordination/worker-standby").is_some()
    })
    .await;
    assert!(settled.is_some(), "the fleet did not settle");
    // Past the leader's first periodic sync, a follower's shard: nothing but its end makes
    // the leader sync again for a minute.
    sleep(Duration::from_secs(5)).await;
    let leader = holder_of(&store, "kcl-coordination/worker-leader").unwrap();
    let standby = holder_of(&store, "kcl-coordination/worker-standby").unwrap();
    let (i, follower) = workers
        .iter()
        .enumerate()
        .find(|(i, _)| ![&leader, &standby].contains(&&WORKERS[*i].to_string()))
        .unwrap();
    let parent = follower.status.borrow().held[0].clone();
    let children = stream.split(&parent).unwrap();
    let split_at = Instant::now();
    eprintln!(
        "leader {leader}, standby {standby}, follower {} ends {parent}",
        WORKERS[i]
    );

    let leased = |key: &ShardId| store.leases().iter().any(|l| &l.key == key);
    let created = wait_until(Duration::from_secs(120), || children.iter().all(leased)).await;
    let written = common::fill(&stream, 60);
    let processed = wait_until(Duration::from_secs(120), || {
        common::undelivered(&seen, &written) == 0
    })
    .await;
    let (taker, failover) = (config().taker_interval, config().failover_time);
    let by: std::collections::BTreeSet<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, shard, _)| children.contains(shard))
        .map(|(w, _, _)| w.clone())
        .collect();
    eprintln!(
        "children's leases {created:?} after the split; their records all processed {:?} after it (by {by:?})",
        processed.map(|_| split_at.elapsed())
    );
    // The follower reads the parent's end within a read or two; the leader's next cycle
    // shows it and syncs.
    let lease_bound = taker * 4;
    assert!(
        created.is_some_and(|t| t <= lease_bound),
        "children's leases after {created:?}, bound {lease_bound:?} (shard_sync_interval {:?})",
        config().shard_sync_interval
    );
    // Then an assignment and the new owner's next index query (half the failover time).
    let bound = lease_bound + failover / 2 + Duration::from_secs(2);
    let all = split_at.elapsed();
    assert!(
        processed.is_some() && all <= bound,
        "the children's records {all:?} after the split, bound {bound:?}"
    );
    for w in workers {
        w.shutdown.shutdown();
        w.task.await.unwrap().unwrap();
    }
}
