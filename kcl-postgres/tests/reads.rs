//! Creating and reading rows against a real Postgres: every field round-trips, applications
//! do not see each other's rows, the owner index, parked keys, unreadable rows and the
//! request counts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use chrono::DateTime;
use kcl_core::lease::load::Flow;
use kcl_core::lease::usage::Operation;
use kcl_core::{
    Checkpoint, ErrorKind, ExtendedSequenceNumber, FencingToken, HashKeyRange, LeaseLoad,
    LeaseStore, LeaseStoreExtras, SequenceNumber, ShardId, WorkerId,
};

#[tokio::test]
async fn a_row_with_every_field_set_round_trips() {
    let Some(store) = common::store("round_trip").await else {
        return;
    };
    let key = "123456789012:orders:1700000000:shardId-000000000007";
    let mut lease = common::lease(key);
    lease.checkpoint = Checkpoint::Sequence(ExtendedSequenceNumber {
        sequence: SequenceNumber::parse("49590338271490256608559692538361571095921575989136588898")
            .unwrap(),
        sub_sequence: 3,
    });
    lease.owner = Some(WorkerId::new("w1"));
    lease.counter = 42;
    lease.pending_checkpoint = Some(Checkpoint::ShardEnd);
    lease.owner_switches_since_checkpoint = 2;
    lease.parent_shard_ids = vec![ShardId::new("b"), ShardId::new("a")];
    lease.child_shard_ids = vec![ShardId::new("c")];
    lease.hash_key_range = Some(HashKeyRange::FULL);
    lease.handoff_to = Some(WorkerId::new("w2"));
    lease.start_timestamp = DateTime::from_timestamp_micros(1_763_000_000_123_456);
    lease.endpoint = Some("http://10.0.0.7:8125".to_owned());
    lease.parked_keys = vec!["00000000000000ab/4959/0".to_owned(), "0a/1/0".to_owned()];
    let flow = Flow::new(12.5, 11.0, Duration::from_millis(1500), 0.25);
    lease.load = Some(LeaseLoad::new(250, 2000).with_flow(flow));
    lease.restart_grace = Some(Duration::from_secs(60));
    lease.carrier = Some(ShardId::new("shardId-000000000003"));
    lease.fence = Some(FencingToken(41));
    lease.signals = Some("v1;workers=3".to_owned());
    lease.acked = Some("AToFlZVlnw".to_owned());

    assert!(store.create(&lease).await.unwrap());
    let read = store.get(&lease.key).await.unwrap().unwrap();
    assert_eq!(
        read.load.map(|l| (l.milli, l.capacity_milli)),
        Some((250, 2000))
    );
    let read_flow = read.load.and_then(|l| l.flow).map(|f| f.encode());
    assert_eq!(read_flow, Some(flow.encode()), "the flow is kept");
    let flowless = |mut l: kcl_core::Lease| {
        l.load = l
            .load
            .map(|load| LeaseLoad::new(load.milli, load.capacity_milli));
        l
    };
    assert_eq!(flowless(read), flowless(lease.clone()));
    assert_eq!(
        flowless(store.list().await.unwrap().remove(0)),
        flowless(lease)
    );
}

#[tokio::test]
async fn create_refuses_an_existing_key_and_get_a_missing_one_is_none() {
    let Some(store) = common::store("create").await else {
        return;
    };
    let held = common::held(&store, "shard-1", "a").await;
    assert!(!store.create(&common::lease("shard-1")).await.unwrap());
    assert_eq!(
        store.get(&held.key).await.unwrap().unwrap(),
        held,
        "untouched"
    );
    assert_eq!(store.get(&ShardId::new("shard-9")).await.unwrap(), None);
    assert_eq!(store.peek(&held.key).await.unwrap().unwrap(), held);
}

#[tokio::test]
async fn applications_share_the_table_and_nothing_else() {
    let Some(store) = common::store("app_one").await else {
        return;
    };
    let other = common::store("app_two").await.unwrap();
    common::held(&store, "shard-2", "a").await;
    common::held(&store, "shard-1", "a").await;
    common::held(&other, "shard-1", "a").await;
    let keys = |leases: Vec<kcl_core::Lease>| leases.into_iter().map(|l| l.key).collect::<Vec<_>>();
    assert_eq!(
        keys(store.list().await.unwrap()),
        [ShardId::new("shard-1"), ShardId::new("shard-2")],
        "by key"
    );
    assert_eq!(
        keys(other.snapshot().await.unwrap()),
        [ShardId::new("shard-1")]
    );
    let owned = store.owned_by(&WorkerId::new("a")).await.unwrap();
    assert_eq!(owned, [ShardId::new("shard-1"), ShardId::new("shard-2")]);
    assert!(
        store
            .owned_by(&WorkerId::new("b"))
            .await
            .unwrap()
            .is_empty()
    );
    // Deleting one application's row leaves the other's.
    let mine = store.get(&ShardId::new("shard-1")).await.unwrap().unwrap();
    store.delete(&mine).await.unwrap();
    assert!(other.get(&ShardId::new("shard-1")).await.unwrap().is_some());
}

#[tokio::test]
async fn parked_keys_are_unparked_and_redriven_without_the_counter() {
    let Some(store) = common::store("parked").await else {
        return;
    };
    let mut lease = common::lease("shard-1");
    lease.parked_keys = vec!["a/1/0".into(), "b/2/0".into(), "c/3/0".into()];
    assert!(store.create(&lease).await.unwrap());
    assert!(
        store
            .request_redrive(&lease.key, "b/2/0", "redrive/b")
            .await
            .unwrap()
    );
    assert!(
        store
            .request_redrive(&lease.key, "b/2/0", "redrive/b")
            .await
            .unwrap()
    );
    assert!(
        !store
            .request_redrive(&lease.key, "z/9/0", "redrive/z")
            .await
            .unwrap()
    );
    assert!(
        !store
            .request_redrive(&ShardId::new("none"), "b/2/0", "r")
            .await
            .unwrap()
    );
    let row = store.get(&lease.key).await.unwrap().unwrap();
    assert_eq!(row.parked_keys, ["a/1/0", "b/2/0", "c/3/0", "redrive/b"]);
    store
        .unpark(&lease.key, &["b/2/0".into(), "redrive/b".into()])
        .await
        .unwrap();
    let row = store.get(&lease.key).await.unwrap().unwrap();
    assert_eq!(row.parked_keys, ["a/1/0", "c/3/0"]);
    assert_eq!(row.counter, 0, "neither write moved the counter");
    let missing = store.unpark(&ShardId::new("none"), &["a/1/0".into()]).await;
    assert_eq!(missing.unwrap_err().kind(), ErrorKind::Conflict);
}

#[tokio::test]
async fn an_unreadable_row_is_skipped_and_reported() {
    let Some(store) = common::store("unreadable").await else {
        return;
    };
    common::held(&store, "shard-1", "a").await;
    let client = common::raw(&common::url().unwrap()).await;
    let insert =
        "INSERT INTO kcl_leases (application, lease_key, checkpoint) VALUES ($1, 'bad', 'bogus')";
    client
        .execute(insert, &[&store.application()])
        .await
        .unwrap();
    let leases = store.list().await.unwrap();
    assert_eq!(leases.len(), 1);
    let unreadable = store.unreadable();
    assert_eq!(unreadable.len(), 1);
    assert_eq!(unreadable[0].key.as_deref(), Some("bad"));
    assert!(
        unreadable[0].reason.contains("checkpoint"),
        "{}",
        unreadable[0].reason
    );
}

#[tokio::test]
async fn every_request_is_counted_by_operation() {
    let Some(store) = common::store("usage").await else {
        return;
    };
    let held = common::held(&store, "shard-1", "a").await;
    store.renew(&held).await.unwrap();
    store.renew(&held).await.unwrap_err();
    store.list().await.unwrap();
    let usage = store.usage().unwrap();
    assert_eq!(
        usage.of(Operation::Renew).requests,
        2,
        "a refused write is a request"
    );
    assert_eq!(usage.of(Operation::Create).requests, 1);
    assert_eq!(usage.of(Operation::Take).requests, 1);
    let list = usage.of(Operation::List);
    assert_eq!((list.requests, list.rows), (1, 1));
    assert_eq!(usage.total().read_units + usage.total().write_units, 0.0);
}
