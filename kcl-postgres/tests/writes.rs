//! Each write of the store against a real Postgres: what it writes when its condition holds,
//! and that it is refused as a conflict, writing nothing, when it does not.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use kcl_core::{
    Checkpoint, CheckpointUpdate, ErrorKind, ExtendedSequenceNumber, Lease, LeaseLoad, LeaseStore,
    SequenceNumber, ShardId, WorkerId,
};

fn seq(n: &str, sub: u64) -> Checkpoint {
    Checkpoint::Sequence(ExtendedSequenceNumber {
        sequence: SequenceNumber::parse(n).unwrap(),
        sub_sequence: sub,
    })
}

/// `lease` with one change.
fn changed(lease: &Lease, change: impl FnOnce(&mut Lease)) -> Lease {
    let mut lease = lease.clone();
    change(&mut lease);
    lease
}

fn w(id: &str) -> WorkerId {
    WorkerId::new(id)
}

/// Asserts `result` is a conflict and the row is still `before`.
async fn refused<T: std::fmt::Debug>(
    store: &impl LeaseStore,
    result: Result<T, kcl_core::BackendError>,
    before: &Lease,
) {
    let error = result.expect_err("the write should have been refused");
    assert_eq!(error.kind(), ErrorKind::Conflict, "{error}");
    let now = store.get(&before.key).await.unwrap().unwrap();
    assert_eq!(&now, before, "a refused write changed the row");
}

#[tokio::test]
async fn renew_bumps_the_counter_on_owner_and_counter() {
    let Some(store) = common::store("renew").await else {
        return;
    };
    let mut held = common::held(&store, "shard-1", "a").await;
    held.load = Some(LeaseLoad::new(250, 2000));
    let renewed = store.renew(&held).await.unwrap();
    assert_eq!(renewed.counter, held.counter + 1);
    assert_eq!(renewed.load, Some(LeaseLoad::new(250, 2000)));
    // Without a load the row's stays.
    let again = store
        .renew(&changed(&renewed, |l| l.load = None))
        .await
        .unwrap();
    assert_eq!(again.load, Some(LeaseLoad::new(250, 2000)));

    refused(&store, store.renew(&renewed).await, &again).await;
    let other = changed(&again, |l| l.owner = Some(w("b")));
    refused(&store, store.renew(&other).await, &again).await;
    let gone = common::lease("no-such-shard");
    let error = store.renew(&gone).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Conflict, "a missing row: {error}");
}

#[tokio::test]
async fn take_writes_owner_fence_and_switches() {
    let Some(store) = common::store("take").await else {
        return;
    };
    let fresh = common::lease("shard-1");
    assert!(store.create(&fresh).await.unwrap());
    let taken = store.take(&fresh, &w("a")).await.unwrap();
    assert_eq!(taken.owner, Some(w("a")));
    assert_eq!(taken.counter, 1);
    assert_eq!(
        taken.fence,
        Some(kcl_core::FencingToken(1)),
        "the fence is the counter written"
    );
    assert_eq!(taken.owner_switches_since_checkpoint, 1);

    // A handoff request, then an adoption (a take naming the owner again) keeps it; a take by
    // another worker clears it and removes the restart grace.
    store.request_handoff(&taken, Some(&w("c"))).await.unwrap();
    let asked = store.get(&taken.key).await.unwrap().unwrap();
    let adopted = store.take(&asked, &w("a")).await.unwrap();
    assert_eq!(adopted.handoff_to, Some(w("c")));
    assert_eq!(
        adopted.owner_switches_since_checkpoint, 1,
        "an adoption is no switch"
    );
    assert_eq!(adopted.fence, Some(kcl_core::FencingToken(adopted.counter)));
    let mut marked = CheckpointUpdate::new(Checkpoint::TrimHorizon);
    marked.restart_grace = Some(Duration::from_secs(30));
    let marked = store.checkpoint(&adopted, &marked).await.unwrap();
    assert_eq!(marked.restart_grace, Some(Duration::from_secs(30)));
    let moved = store.take(&marked, &w("b")).await.unwrap();
    assert_eq!(moved.owner, Some(w("b")));
    assert_eq!(moved.handoff_to, None);
    assert_eq!(moved.restart_grace, None);
    assert_eq!(moved.owner_switches_since_checkpoint, 1);

    refused(&store, store.take(&marked, &w("c")).await, &moved).await;
    let unowned = changed(&moved, |l| l.owner = None);
    refused(&store, store.take(&unowned, &w("c")).await, &moved).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_taking_one_lease_at_once_one_wins() {
    let Some(store) = common::store("race").await else {
        return;
    };
    let other = common::twin(&store).await;
    for round in 0..20 {
        let fresh = common::lease(&format!("shard-{round}"));
        assert!(store.create(&fresh).await.unwrap());
        let (wa, wb) = (w("a"), w("b"));
        let (a, b) = tokio::join!(store.take(&fresh, &wa), other.take(&fresh, &wb));
        let lost = match (a, b) {
            (Ok(_), Err(lost)) | (Err(lost), Ok(_)) => lost,
            (a, b) => panic!("round {round}: not exactly one winner: {a:?} {b:?}"),
        };
        assert_eq!(lost.kind(), ErrorKind::Conflict, "round {round}");
        let row = store.get(&fresh.key).await.unwrap().unwrap();
        assert_eq!(row.counter, 1, "round {round}: one write");
        // Two writes of one tenure at once (a renewal and a checkpoint's): the counter
        // decides, as the owner is the same.
        let (a, b) = tokio::join!(store.renew(&row), other.renew(&row));
        assert_eq!(
            a.is_ok() as u8 + b.is_ok() as u8,
            1,
            "round {round}: {a:?} {b:?}"
        );
        let row = store.get(&fresh.key).await.unwrap().unwrap();
        assert_eq!(row.counter, 2, "round {round}: one renewal");
    }
}

#[tokio::test]
async fn release_and_handoff_requests() {
    let Some(store) = common::store("release").await else {
        return;
    };
    let held = common::held(&store, "shard-1", "a").await;
    // A request is conditional on the owner alone and leaves the counter alone.
    let stale = changed(&held, |l| l.counter = 0);
    store.request_handoff(&stale, Some(&w("b"))).await.unwrap();
    let asked = store.get(&held.key).await.unwrap().unwrap();
    assert_eq!(
        (asked.handoff_to.clone(), asked.counter),
        (Some(w("b")), held.counter)
    );
    store.request_handoff(&asked, None).await.unwrap();
    let declined = store.get(&held.key).await.unwrap().unwrap();
    assert_eq!(declined.handoff_to, None);
    let not_owner = changed(&declined, |l| l.owner = Some(w("x")));
    refused(
        &store,
        store.request_handoff(&not_owner, Some(&w("b"))).await,
        &declined,
    )
    .await;

    store
        .request_handoff(&declined, Some(&w("b")))
        .await
        .unwrap();
    let asked = store.get(&held.key).await.unwrap().unwrap();
    refused(&store, store.release(&stale).await, &asked).await;
    store.release(&asked).await.unwrap();
    let released = store.get(&held.key).await.unwrap().unwrap();
    assert_eq!(released.owner, None);
    assert_eq!(released.counter, asked.counter + 1);
    assert_eq!(released.handoff_to, None);
    // Unowned: a request must observe no owner.
    store
        .request_handoff(&released, Some(&w("b")))
        .await
        .unwrap();
}

#[tokio::test]
async fn checkpoint_is_conditional_on_owner_counter_and_checkpoint() {
    let Some(store) = common::store("checkpoint").await else {
        return;
    };
    let held = common::held(&store, "shard-1", "a").await;
    let mut update = CheckpointUpdate::new(seq("4959", 2));
    update.pending = Some(seq("5000", 0));
    update.child_shard_ids = vec![ShardId::new("shard-2"), ShardId::new("shard-3")];
    update.park = vec!["k1/1/0".into(), "k2/2/0".into(), "k1/1/0".into()];
    update.acked = Some("AToF".into());
    update.endpoint = Some("http://10.0.0.7:8125".into());
    let mut holder = held.clone();
    holder.load = Some(LeaseLoad::new(100, 1000));
    let written = store.checkpoint(&holder, &update).await.unwrap();
    assert_eq!(written.checkpoint, seq("4959", 2));
    assert_eq!(written.pending_checkpoint, Some(seq("5000", 0)));
    assert_eq!(written.counter, held.counter + 1);
    assert_eq!(written.owner_switches_since_checkpoint, 0);
    assert_eq!(written.child_shard_ids, update.child_shard_ids);
    assert_eq!(
        written.parked_keys,
        ["k1/1/0", "k2/2/0"],
        "each once, in order"
    );
    assert_eq!(written.acked.as_deref(), Some("AToF"));
    assert_eq!(written.load, Some(LeaseLoad::new(100, 1000)));
    assert_eq!(written.fence, held.fence, "a checkpoint leaves the fence");

    // The next: absent fields stay, parked keys are appended, acked and pending go.
    let mut next = CheckpointUpdate::new(seq("4960", 0));
    next.park = vec!["k2/2/0".into(), "k3/3/0".into()];
    let second = store.checkpoint(&written, &next).await.unwrap();
    assert_eq!(second.parked_keys, ["k1/1/0", "k2/2/0", "k3/3/0"]);
    assert_eq!(
        (second.acked.clone(), second.pending_checkpoint.clone()),
        (None, None)
    );
    assert_eq!(second.child_shard_ids, update.child_shard_ids);
    assert_eq!(second.endpoint.as_deref(), Some("http://10.0.0.7:8125"));

    // Refused: an old counter; the counter right but the checkpoint moved (a commit moved it
    // without the counter); another owner.
    refused(&store, store.checkpoint(&written, &next).await, &second).await;
    let behind = changed(&second, |l| l.checkpoint = seq("4959", 2));
    refused(&store, store.checkpoint(&behind, &next).await, &second).await;
    let sub_differs = changed(&second, |l| l.checkpoint = seq("4960", 1));
    refused(&store, store.checkpoint(&sub_differs, &next).await, &second).await;
    let other = changed(&second, |l| l.owner = Some(w("b")));
    refused(&store, store.checkpoint(&other, &next).await, &second).await;
}

#[tokio::test]
async fn reset_takes_and_checkpoints_in_one_write() {
    let Some(store) = common::store("reset").await else {
        return;
    };
    let held = common::held(&store, "shard-1", "a").await;
    store.request_handoff(&held, Some(&w("c"))).await.unwrap();
    let observed = store.get(&held.key).await.unwrap().unwrap();
    let mut update = CheckpointUpdate::new(seq("77", 0));
    update.restart_grace = Some(Duration::from_millis(1500));
    let reset = store.reset(&observed, &w("admin"), &update).await.unwrap();
    assert_eq!(reset.owner, Some(w("admin")));
    assert_eq!(reset.counter, observed.counter + 1);
    assert_eq!(reset.fence, Some(kcl_core::FencingToken(reset.counter)));
    assert_eq!(reset.checkpoint, seq("77", 0));
    assert_eq!(reset.handoff_to, None);
    assert_eq!(reset.owner_switches_since_checkpoint, 0);
    assert_eq!(reset.restart_grace, Some(Duration::from_millis(1500)));
    refused(
        &store,
        store.reset(&observed, &w("x"), &update).await,
        &reset,
    )
    .await;
}

#[tokio::test]
async fn delete_is_conditional_on_the_counter() {
    let Some(store) = common::store("delete").await else {
        return;
    };
    let held = common::held(&store, "shard-1", "a").await;
    let renewed = store.renew(&held).await.unwrap();
    refused(&store, store.delete(&held).await, &renewed).await;
    store.delete(&renewed).await.unwrap();
    assert_eq!(store.get(&held.key).await.unwrap(), None);
    let error = store.delete(&renewed).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Conflict, "a missing row: {error}");
}
