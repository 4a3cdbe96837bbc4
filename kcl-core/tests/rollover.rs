//! A stream whose shards roll over every few hours, as DynamoDB Streams' do (each shard closes
//! and one child carries on), under a fleet that runs for half a simulated day: a worker
//! crashes with records unread just as every shard rolls over, another joins, and every
//! record is delivered, each child's after its parent's.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Behaviour, Seen, start, undelivered_after_waiting, world};
use kcl_core::{SequenceNumber, ShardId, WorkerConfig};
use tokio::time::sleep;

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(30))
        .taker_interval(Duration::from_secs(5))
        .idle_time_between_reads(Duration::from_secs(2))
        .shard_sync_interval(Duration::from_secs(10))
        .parent_poll_interval(Duration::from_secs(5))
}

#[tokio::test(start_paused = true)]
async fn shards_rolling_over_every_four_hours_lose_nothing_and_children_follow_parents() {
    let (stream, store, seen) = world(3);
    let b = Behaviour {
        every_batch: true,
        ..Behaviour::default()
    };
    let first = start("a", config(), &stream, &store, &seen, &b);
    let mut second = Some(start("b", config(), &stream, &store, &seen, &b));
    let mut third = None;
    let mut written: Vec<SequenceNumber> = Vec::new();
    let mut rolled = 0;
    // 12 simulated hours, three records a minute.
    for minute in 0..12 * 60 {
        for i in 0..3 {
            let key = format!("item-{}", (minute * 3 + i) % 50);
            written.push(stream.put(&key, format!("{minute}.{i}")).sequence_number);
            sleep(Duration::from_secs(20)).await;
        }
        if minute == 400 {
            // A burst that worker b never reads, b crashes, and every shard rolls over: the
            // children must wait until b's leases expire and their records are read elsewhere.
            for i in 0..30 {
                written.push(stream.put(&format!("burst-{i}"), "b").sequence_number);
            }
            second.take().unwrap().task.abort();
            third = Some(start("c", config(), &stream, &store, &seen, &b));
            for shard in stream.open_shards() {
                stream.roll_over(&shard).unwrap();
                rolled += 1;
            }
        } else if minute % 80 == 0 && minute > 0 {
            // Every 80 minutes the oldest open shard rolls over: each every 4 hours.
            let open = stream.open_shards();
            stream.roll_over(&open[0]).unwrap();
            rolled += 1;
        }
    }
    assert_eq!(rolled, 10, "shards rolled over");
    assert_eq!(
        undelivered_after_waiting(&seen, &written).await,
        0,
        "nothing lost"
    );
    children_after_parents(&stream, &seen);
    for w in [first, third.unwrap()] {
        w.shutdown.shutdown();
        w.task.await.unwrap().unwrap();
    }
}

/// Every child's first delivery comes after every delivery of its parent.
fn children_after_parents(stream: &kcl_core::memory::MemoryStream, seen: &Seen) {
    let seen = seen.lock().unwrap();
    let mut first: BTreeMap<&ShardId, usize> = BTreeMap::new();
    let mut last: BTreeMap<&ShardId, usize> = BTreeMap::new();
    for (i, (_, shard, _)) in seen.iter().enumerate() {
        first.entry(shard).or_insert(i);
        last.insert(shard, i);
    }
    let mut checked = 0;
    for shard in stream.shards() {
        for parent in &shard.parent_shard_ids {
            if let (Some(child), Some(parent_last)) = (first.get(&shard.id), last.get(parent)) {
                assert!(
                    child > parent_last,
                    "{} delivered before its parent {parent} finished",
                    shard.id
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 8,
        "{checked} parent-child pairs with deliveries on both sides"
    );
}
