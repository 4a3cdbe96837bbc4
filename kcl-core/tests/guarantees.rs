//! Regression tests for promises that once broke outside the simulation's model: LATEST
//! starts, vanished shards, hung backends and unbounded durations. In-memory backends, paused
//! time.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{
    Behaviour, Seen, config, delivered_of, fill, held, start, undelivered,
    undelivered_after_waiting, wait_until, world,
};
use kcl_core::memory::{Faults, MemoryLeaseStore, MemoryStream};
use kcl_core::{Checkpoint, InitialPosition, Lease, LeaseStore, TableFeatures};
use tokio::time::{Instant, sleep, timeout};

fn latest() -> kcl_core::WorkerConfig {
    config().initial_position(InitialPosition::Latest)
}

#[tokio::test(start_paused = true)]
async fn latest_reopened_after_an_expired_iterator_skips_nothing() {
    let faults = Faults::seeded(1);
    let stream = MemoryStream::with_faults(1, faults.clone());
    let (store, seen) = (MemoryLeaseStore::new(), Seen::default());
    let old = fill(&stream, 5);
    // Older than the pin's margin for clock skew: never delivered.
    sleep(latest().max_clock_skew + Duration::from_secs(1)).await;
    let a = start("a", latest(), &stream, &store, &seen, &Behaviour::default());
    assert!(
        wait_until(Duration::from_secs(5), || held(&a) == 1)
            .await
            .is_some()
    );
    sleep(Duration::from_secs(1)).await; // polling at LATEST, nothing delivered yet
    faults.set_expired_iterator_rate(1.0);
    sleep(Duration::from_millis(500)).await;
    let mut written = fill(&stream, 10); // written while every read finds its iterator expired
    sleep(Duration::from_secs(2)).await;
    faults.set_expired_iterator_rate(0.0);
    sleep(Duration::from_secs(1)).await;
    written.extend(fill(&stream, 10));
    let lost = undelivered_after_waiting(&seen, &written).await;
    assert_eq!(
        lost, 0,
        "{lost} of 20 records written after the shard was opened never delivered"
    );
    assert_eq!(
        delivered_of(&seen, &old),
        0,
        "records from before the start"
    );
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn latest_after_a_processor_failure_before_the_first_checkpoint_skips_nothing() {
    let (stream, store, seen) = world(1);
    let shard = stream.open_shards().remove(0);
    let b = Behaviour {
        every_batch: true,
        fail_once_on: Some(shard),
        ..Behaviour::default()
    };
    let a = start("a", latest(), &stream, &store, &seen, &b);
    assert!(
        wait_until(Duration::from_secs(5), || held(&a) == 1)
            .await
            .is_some()
    );
    sleep(Duration::from_secs(1)).await;
    let mut written = fill(&stream, 5);
    assert!(
        wait_until(Duration::from_secs(5), || b.failed.load(Ordering::SeqCst))
            .await
            .is_some()
    );
    written.extend(fill(&stream, 10)); // while the processor restarts
    sleep(Duration::from_secs(3)).await;
    written.extend(fill(&stream, 5));
    let lost = undelivered_after_waiting(&seen, &written).await;
    assert_eq!(lost, 0, "{lost} of 20 records never delivered");
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn latest_after_a_crash_before_the_first_checkpoint_skips_nothing() {
    let (stream, store, seen) = world(1);
    let b = Behaviour::default(); // checkpoints only in shutdown_requested
    let a = start("a", latest(), &stream, &store, &seen, &b);
    assert!(
        wait_until(Duration::from_secs(5), || held(&a) == 1)
            .await
            .is_some()
    );
    sleep(Duration::from_secs(1)).await;
    let mut written = fill(&stream, 5);
    assert!(
        wait_until(Duration::from_secs(5), || undelivered(&seen, &written) == 0)
            .await
            .is_some()
    );
    a.task.abort(); // crashes before any checkpoint
    let c = start("c", latest(), &stream, &store, &seen, &b);
    written.extend(fill(&stream, 10)); // during the failover
    assert!(
        wait_until(Duration::from_secs(20), || held(&c) == 1)
            .await
            .is_some()
    );
    sleep(Duration::from_secs(1)).await;
    written.extend(fill(&stream, 5));
    let lost = undelivered_after_waiting(&seen, &written).await;
    assert_eq!(lost, 0, "{lost} of 20 records never delivered");
    c.shutdown.shutdown();
    c.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn latest_on_a_fresh_table_after_a_reshard_replays_no_history() {
    let (stream, store, seen) = world(1);
    let parent = stream.open_shards().remove(0);
    let mut old = fill(&stream, 10);
    stream.split(&parent).unwrap();
    old.extend(fill(&stream, 20)); // in the children, before the consumer starts
    let a = start("a", latest(), &stream, &store, &seen, &Behaviour::default());
    sleep(Duration::from_secs(3)).await;
    let new = fill(&stream, 10);
    assert_eq!(undelivered_after_waiting(&seen, &new).await, 0);
    let replayed = delivered_of(&seen, &old);
    assert_eq!(
        replayed, 0,
        "{replayed} records from before the start delivered"
    );
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_lease_whose_shard_aged_out_ends_and_lets_its_children_start() {
    let (stream, store, seen) = world(1);
    let parent = stream.open_shards().remove(0);
    // A previous run tracked the parent, then the fleet was down until it aged out.
    store.ensure_table(TableFeatures::NONE).await.unwrap();
    store.insert(Lease::new(parent.clone(), Checkpoint::TrimHorizon));
    fill(&stream, 5);
    stream.split(&parent).unwrap();
    stream.age_out(&parent).unwrap();
    let written = fill(&stream, 10);
    let a = start("a", config(), &stream, &store, &seen, &Behaviour::default());
    let all = wait_until(Duration::from_secs(600), || {
        undelivered(&seen, &written) == 0
    })
    .await;
    let lost = undelivered(&seen, &written);
    assert!(
        all.is_some(),
        "{lost} of 10 records of the children never delivered"
    );
    // The row of the vanished shard is cleaned up like any finished parent.
    let cleaned = wait_until(config().lease_cleanup_delay * 2, || {
        store.leases().iter().all(|l| l.key != parent)
    })
    .await;
    assert!(cleaned.is_some(), "{:?}", store.leases());
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_meets_its_deadline_and_force_is_immediate_when_every_call_hangs() {
    let faults = Faults::seeded(2);
    let stream = MemoryStream::with_faults(2, faults.clone());
    let store = MemoryLeaseStore::with_faults(faults.clone());
    let seen = Seen::default();
    let deadline = Duration::from_secs(3);
    let b = Behaviour::default();
    let a = start(
        "a",
        config().shutdown_timeout(deadline),
        &stream,
        &store,
        &seen,
        &b,
    );
    let c = start(
        "c",
        config().shutdown_timeout(deadline),
        &stream,
        &store,
        &seen,
        &b,
    );
    assert!(
        wait_until(Duration::from_secs(5), || held(&a) == 1 && held(&c) == 1)
            .await
            .is_some()
    );
    faults.pause("a"); // every backend call of a hangs from now on
    faults.pause("c");
    sleep(Duration::from_secs(2)).await;

    let asked = Instant::now();
    a.shutdown.shutdown();
    let returned = timeout(deadline * 10, a.task).await;
    assert!(
        returned.is_ok(),
        "shutdown still running after {:?}",
        asked.elapsed()
    );
    let took = asked.elapsed();
    assert!(
        took <= deadline + Duration::from_millis(100),
        "shutdown took {took:?}"
    );

    let asked = Instant::now();
    c.shutdown.shutdown();
    c.shutdown.force();
    let returned = timeout(deadline * 10, c.task).await;
    assert!(
        returned.is_ok(),
        "force still running after {:?}",
        asked.elapsed()
    );
    assert!(
        asked.elapsed() < Duration::from_millis(100),
        "force took {:?}",
        asked.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn durations_too_large_to_add_to_an_instant_are_refused_by_name() {
    let config = config().shutdown_timeout(Duration::from_secs(500_000_000_000 * 31_557_600));
    let error = config.validate().err();
    assert_eq!(
        error.as_ref().map(|e| e.key),
        Some("shutdown_timeout"),
        "{error:?}"
    );

    let (stream, store, _) = world(1);
    let factory = |shard: &kcl_core::ShardId| common::Recorder {
        worker: "a".into(),
        shard: shard.clone(),
        seen: Seen::default(),
        behaviour: Behaviour::default(),
    };
    match kcl_core::Worker::new("a", config, stream, store, factory) {
        Err(e) => assert_eq!(e.key, "shutdown_timeout"),
        Ok(w) => {
            let shutdown = w.shutdown_handle();
            let task = tokio::spawn(w.run());
            sleep(Duration::from_secs(1)).await;
            shutdown.shutdown();
            panic!("accepted; its shutdown ended with {:?}", task.await);
        }
    }
}
