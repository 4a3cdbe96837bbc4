//! Enhanced fan-out on the in-memory stream, under paused time: subscriptions renewed after
//! their lifetime lose and repeat nothing; a handoff waits out the 5-second subscribe limit
//! without losing records; records are pushed as they arrive; a source without fan-out stops
//! the worker with an error that says so.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Behaviour, config, delivered_by, fill, held, start, wait_until, world};
use kcl_core::{Retrieval, WorkerConfig};
use tokio::time::sleep;

fn fan_out() -> WorkerConfig {
    config().retrieval(Retrieval::FanOut {
        consumer_name: "app".to_owned(),
    })
}

#[tokio::test(start_paused = true)]
async fn renewed_subscriptions_lose_and_repeat_nothing() {
    let (stream, store, seen) = world(3);
    stream.set_subscription_lifetime(Duration::from_secs(2));
    let b = Behaviour {
        every_batch: true,
        ..Behaviour::default()
    };
    let w = start("a", fan_out(), &stream, &store, &seen, &b);
    let mut written = Vec::new();
    // 20 s of writes: each shard's subscription is renewed about ten times.
    for _ in 0..40 {
        written.extend(fill(&stream, 5));
        sleep(Duration::from_millis(500)).await;
    }
    assert!(
        wait_until(Duration::from_secs(10), || delivered_by(&seen).len()
            == written.len())
        .await
        .is_some(),
        "every record delivered"
    );
    let twice: Vec<_> = delivered_by(&seen)
        .into_iter()
        .filter(|(_, by)| by.len() > 1)
        .collect();
    assert!(twice.is_empty(), "delivered twice: {twice:?}");
    // In order per shard: each shard's sequence numbers were delivered ascending.
    let seen_now = seen.lock().unwrap().clone();
    for shard in stream.open_shards() {
        let order: Vec<_> = seen_now
            .iter()
            .filter(|(_, s, _)| *s == shard)
            .map(|(_, _, q)| q.clone())
            .collect();
        assert!(
            order.windows(2).all(|p| p[0] < p[1]),
            "{shard} out of order"
        );
    }
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn records_are_pushed_as_they_arrive() {
    let (stream, store, seen) = world(1);
    // A polling worker would wait up to this long after an empty read.
    let w = start(
        "a",
        fan_out().idle_time_between_reads(Duration::from_secs(5)),
        &stream,
        &store,
        &seen,
        &Behaviour::default(),
    );
    assert!(
        wait_until(Duration::from_secs(5), || held(&w) == 1)
            .await
            .is_some()
    );
    sleep(Duration::from_secs(1)).await;
    fill(&stream, 1);
    let took = wait_until(Duration::from_secs(10), || seen.lock().unwrap().len() == 1).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_millis(100)),
        "delivered after {took:?}"
    );
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_handoff_waits_out_the_subscribe_limit_and_loses_nothing() {
    let (stream, store, seen) = world(4);
    let b = Behaviour {
        every_batch: true,
        ..Behaviour::default()
    };
    let a = start("a", fan_out(), &stream, &store, &seen, &b);
    assert!(
        wait_until(Duration::from_secs(5), || held(&a) == 4)
            .await
            .is_some()
    );
    let mut written = fill(&stream, 40);
    let c = start("c", fan_out(), &stream, &store, &seen, &b);
    assert!(
        wait_until(Duration::from_secs(20), || held(&a) == 2 && held(&c) == 2)
            .await
            .is_some()
    );
    written.extend(fill(&stream, 40));
    // The new owner subscribes once the 5 s since the old owner's subscription are over.
    let took = wait_until(Duration::from_secs(20), || {
        delivered_by(&seen).len() == written.len()
    })
    .await;
    assert!(
        took.is_some_and(|t| t <= Duration::from_secs(7)),
        "every record delivered after {took:?}"
    );
    a.shutdown.shutdown();
    c.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
    c.task.await.unwrap().unwrap();
}

/// A source that only polls: `ShardSource`'s default fan-out methods.
struct PollingOnly(kcl_core::memory::MemoryStream);

impl kcl_core::ShardSource for PollingOnly {
    async fn list_shards(&self) -> Result<Vec<kcl_core::Shard>, kcl_core::BackendError> {
        self.0.list_shards().await
    }

    async fn shard_iterator(
        &self,
        shard: &kcl_core::ShardId,
        position: &kcl_core::StartingPosition,
    ) -> Result<kcl_core::ShardIterator, kcl_core::BackendError> {
        self.0.shard_iterator(shard, position).await
    }

    async fn get_records(
        &self,
        iterator: &kcl_core::ShardIterator,
        limit: u32,
    ) -> Result<kcl_core::RecordBatch, kcl_core::BackendError> {
        self.0.get_records(iterator, limit).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_source_without_fan_out_stops_the_worker_saying_so() {
    let (stream, store, _) = world(1);
    let worker = kcl_core::Worker::builder(PollingOnly(stream), store)
        .id("a")
        .config(fan_out())
        .build(|_: &kcl_core::ShardId| kcl_core::memory::IdleProcessor)
        .unwrap();
    let error = tokio::time::timeout(Duration::from_secs(30), worker.run())
        .await
        .expect("the worker stops")
        .expect_err("with an error");
    let text = kcl_core::error_chain(&error);
    assert!(text.contains("does not support enhanced fan-out"), "{text}");
}
