//! Checks of checkpoint writes and of an operator's reset: what each field of a
//! [`CheckpointUpdate`] does to the row, and the condition (owner, counter and, for a
//! checkpoint, the checkpoint itself).

use std::time::Duration;

use super::Failure;
use super::support::{
    Answer, at, ensure_eq, full, held, load, millis, parked, put, refused, row, same, shard,
    stale_variants, stream, table, unchanged, worker,
};
use crate::lease::{CheckpointUpdate, Lease, LeaseStore};
use crate::types::{Checkpoint, FencingToken, ShardId};

/// Writes `update` from `holder` and checks the row it answers and the row as read
/// against `expected`.
async fn checkpointed(
    store: &impl LeaseStore,
    holder: &Lease,
    update: &CheckpointUpdate,
    expected: &Lease,
    what: &str,
) -> Result<Lease, Failure> {
    let answered = store.checkpoint(holder, update).await.or_fail(what)?;
    same(&answered, expected, &format!("the row {what} answers"))?;
    same(
        &row(store, &holder.key).await?,
        expected,
        &format!("the row after {what}"),
    )?;
    Ok(answered)
}

/// [`checkpoint`](LeaseStore::checkpoint) writes the checkpoint and the pending one, bumps
/// the counter and resets the owner-switch count (as KCL Java does); owner, fence and a
/// handoff request stay.
pub async fn checkpoint_writes_the_update_and_bumps_the_counter(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let mut lease = held(shard(1), "a", 10);
    lease.owner_switches_since_checkpoint = 3;
    lease.handoff_to = Some(worker("b"));
    let before = put(store, &lease).await?;
    let mut update = CheckpointUpdate::new(at(200, 0));
    update.pending = Some(at(250, 4));
    let mut expected = before.clone();
    expected.checkpoint = at(200, 0);
    expected.pending_checkpoint = Some(at(250, 4));
    expected.counter += 1;
    expected.owner_switches_since_checkpoint = 0;
    let after = checkpointed(store, &before, &update, &expected, "checkpoint").await?;
    let next = CheckpointUpdate::new(at(201, 2));
    expected.checkpoint = at(201, 2);
    expected.pending_checkpoint = None;
    expected.counter += 1;
    checkpointed(store, &after, &next, &expected, "a second checkpoint")
        .await
        .map(drop)
}

/// A checkpoint without a pending checkpoint removes the row's (a prepared checkpoint
/// committed, or dropped).
pub async fn checkpoint_removes_the_pending_checkpoint(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let mut lease = held(shard(1), "a", 4);
    lease.pending_checkpoint = Some(at(150, 0));
    let before = put(store, &lease).await?;
    let mut expected = before.clone();
    expected.checkpoint = at(150, 0);
    expected.pending_checkpoint = None;
    expected.counter += 1;
    let update = CheckpointUpdate::new(at(150, 0));
    checkpointed(
        store,
        &before,
        &update,
        &expected,
        "checkpoint committing the pending one",
    )
    .await
    .map(drop)
}

/// `acked` goes only with the checkpoint it was written with: set by a checkpoint that has
/// it, removed by one that has none.
pub async fn checkpoint_writes_acked_with_its_checkpoint_and_removes_it_otherwise(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let before = put(store, &held(shard(1), "a", 4)).await?;
    let mut update = CheckpointUpdate::new(at(110, 0));
    update.acked = Some("3,5:2".to_owned());
    let mut expected = before.clone();
    expected.checkpoint = at(110, 0);
    expected.acked = Some("3,5:2".to_owned());
    expected.counter += 1;
    let after = checkpointed(store, &before, &update, &expected, "checkpoint with acked").await?;
    expected.checkpoint = at(120, 0);
    expected.acked = None;
    expected.counter += 1;
    let update = CheckpointUpdate::new(at(120, 0));
    checkpointed(
        store,
        &after,
        &update,
        &expected,
        "checkpoint without acked",
    )
    .await
    .map(drop)
}

/// `park` adds entries to the row's parked keys (one already there stays once); an update
/// without entries leaves them.
pub async fn checkpoint_adds_parked_entries(store: &impl LeaseStore) -> Result<(), Failure> {
    table(store).await?;
    let mut lease = held(shard(1), "a", 4);
    lease.parked_keys = vec![parked(1, 90)];
    let before = put(store, &lease).await?;
    let mut update = CheckpointUpdate::new(at(110, 0));
    update.park = vec![parked(2, 105), parked(1, 90)];
    let mut expected = before.clone();
    expected.checkpoint = at(110, 0);
    expected.parked_keys = vec![parked(1, 90), parked(2, 105)];
    expected.counter += 1;
    let after = checkpointed(store, &before, &update, &expected, "checkpoint parking").await?;
    expected.checkpoint = at(111, 0);
    expected.counter += 1;
    let update = CheckpointUpdate::new(at(111, 0));
    checkpointed(
        store,
        &after,
        &update,
        &expected,
        "checkpoint parking nothing",
    )
    .await
    .map(drop)
}

/// A checkpoint at `SHARD_END` writes the children it names (in a multi-stream row, with
/// their stream); a later one naming none leaves them.
pub async fn checkpoint_writes_children_and_keeps_them_when_none_are_given(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let s = stream();
    for (n, id) in [(1, None), (2, Some(&s))] {
        let key = id.map_or_else(|| shard(n), |s| s.lease_key(&shard(n)));
        let child = |c| id.map_or_else(|| shard(c), |s| s.lease_key(&shard(c)));
        let before = put(store, &held(key, "a", 4)).await?;
        let mut update = CheckpointUpdate::new(Checkpoint::ShardEnd);
        update.child_shard_ids = vec![child(7), child(6)];
        let mut expected = before.clone();
        expected.checkpoint = Checkpoint::ShardEnd;
        expected.child_shard_ids = vec![child(6), child(7)];
        expected.counter += 1;
        let what = format!("checkpoint at SHARD_END of {}", before.key);
        let after = checkpointed(store, &before, &update, &expected, &what).await?;
        expected.counter += 1;
        let update = CheckpointUpdate::new(Checkpoint::ShardEnd);
        let what = format!("checkpoint naming no children of {}", before.key);
        checkpointed(store, &after, &update, &expected, &what).await?;
    }
    Ok(())
}

/// A checkpoint leaves alone every attribute its update does not set (start timestamp,
/// endpoint, signals, carrier, restart grace, children, parked keys, parents, hash key
/// range, load, fence, handoff request), and writes each one it sets.
pub async fn checkpoint_leaves_what_the_update_does_not_set(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let before = put(store, &full(shard(1), None)).await?;
    let mut holder = before.clone();
    holder.load = None;
    let mut expected = before.clone();
    expected.checkpoint = at(300, 0);
    expected.pending_checkpoint = None;
    expected.acked = None;
    expected.owner_switches_since_checkpoint = 0;
    expected.counter += 1;
    let update = CheckpointUpdate::new(at(300, 0));
    let after = checkpointed(store, &holder, &update, &expected, "a bare checkpoint").await?;
    let mut update = CheckpointUpdate::new(at(301, 0));
    update.start_timestamp = Some(millis(1_800_000_000_456));
    update.endpoint = Some("http://10.0.0.9:8080/singletons".to_owned());
    update.signals = Some("v1 workers=4 shards=12".to_owned());
    update.carrier = Some(ShardId::new("kcl-heartbeat-worker-b"));
    update.restart_grace = Some(Duration::from_millis(61_500));
    expected.checkpoint = at(301, 0);
    expected.start_timestamp = update.start_timestamp;
    expected.endpoint.clone_from(&update.endpoint);
    expected.signals.clone_from(&update.signals);
    expected.carrier.clone_from(&update.carrier);
    expected.restart_grace = update.restart_grace;
    expected.counter += 1;
    checkpointed(
        store,
        &after,
        &update,
        &expected,
        "a checkpoint setting every attribute",
    )
    .await
    .map(drop)
}

/// A checkpoint writes the load the holder carries (`held.load`), as a renewal does.
pub async fn checkpoint_writes_the_load_it_carries(store: &impl LeaseStore) -> Result<(), Failure> {
    table(store).await?;
    let mut lease = held(shard(1), "a", 4);
    lease.load = Some(load(100));
    let before = put(store, &lease).await?;
    let mut holder = before.clone();
    holder.load = Some(load(900));
    let mut expected = before.clone();
    expected.checkpoint = at(101, 0);
    expected.load = Some(load(900));
    expected.counter += 1;
    let update = CheckpointUpdate::new(at(101, 0));
    checkpointed(
        store,
        &holder,
        &update,
        &expected,
        "checkpoint carrying a load",
    )
    .await
    .map(drop)
}

/// [`checkpoint`](LeaseStore::checkpoint) is refused (Conflict, the row untouched) unless the
/// row holds the owner, the counter and the checkpoint the holder last saw: a commit moves
/// the checkpoint without the counter, and a write from before it must not move the row
/// back. Another sequence number, another sub-sequence number either way, a sentinel, and a
/// row that is gone are all refused.
pub async fn checkpoint_is_refused_unless_owner_counter_and_checkpoint_hold(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let update = CheckpointUpdate::new(at(500, 0));
    let before = put(store, &held(shard(1), "a", 5)).await?;
    let mut variants = stale_variants(&before);
    for (what, checkpoint) in [
        ("another sequence number", at(101, 0)),
        ("another sub-sequence number", at(100, 1)),
        ("TRIM_HORIZON", Checkpoint::TrimHorizon),
    ] {
        let mut variant = before.clone();
        variant.checkpoint = checkpoint;
        variants.push((what, variant));
    }
    for (what, variant) in variants {
        let what = format!("checkpoint with {what}");
        refused(store.checkpoint(&variant, &update).await, &what)?;
        unchanged(store, &before, &what).await?;
    }
    let mut sub = held(shard(2), "a", 5);
    sub.checkpoint = at(100, 2);
    let sub = put(store, &sub).await?;
    let mut whole = sub.clone();
    whole.checkpoint = at(100, 0);
    let what = "checkpoint with sub-sequence 0 of a row at sub-sequence 2";
    refused(store.checkpoint(&whole, &update).await, what)?;
    unchanged(store, &sub, what).await?;
    let missing = held(shard(3), "a", 5);
    refused(
        store.checkpoint(&missing, &update).await,
        "checkpoint of a missing row",
    )?;
    ensure_eq(
        store.get(&missing.key).await.or_fail("get")?,
        None,
        "a missing row after it",
    )
}

/// [`reset`](LeaseStore::reset) takes and checkpoints in one write: the new owner, the
/// counter bumped once and written as the fence, the owner switches reset, the handoff
/// request, the restart grace, the pending checkpoint and `acked` removed, the checkpoint
/// written; the rest stays.
pub async fn reset_takes_and_checkpoints_in_one_write(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let before = put(store, &full(shard(1), None)).await?;
    let update = CheckpointUpdate::new(at(500, 0));
    let answered = store
        .reset(&before, &worker("c"), &update)
        .await
        .or_fail("reset")?;
    let mut expected = before.clone();
    expected.owner = Some(worker("c"));
    expected.counter += 1;
    expected.fence = Some(FencingToken(expected.counter));
    expected.owner_switches_since_checkpoint = 0;
    expected.handoff_to = None;
    expected.restart_grace = None;
    expected.checkpoint = at(500, 0);
    expected.pending_checkpoint = None;
    expected.acked = None;
    same(&answered, &expected, "the row reset answers")?;
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after reset",
    )
}

/// A reset writes every field its update sets (pending checkpoint, children, start
/// timestamp, endpoint, parked entries, carrier, signals, acked), as a checkpoint would.
pub async fn reset_writes_every_field_of_its_update(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let before = put(store, &held(shard(1), "a", 5)).await?;
    let update = full_update();
    let answered = store
        .reset(&before, &worker("c"), &update)
        .await
        .or_fail("reset with a full update")?;
    let mut expected = before.clone();
    expected.owner = Some(worker("c"));
    expected.counter = 6;
    expected.fence = Some(FencingToken(6));
    expected.checkpoint = update.checkpoint.clone();
    expected.pending_checkpoint.clone_from(&update.pending);
    expected.child_shard_ids.clone_from(&update.child_shard_ids);
    expected.start_timestamp = update.start_timestamp;
    expected.endpoint.clone_from(&update.endpoint);
    expected.parked_keys.clone_from(&update.park);
    expected.carrier.clone_from(&update.carrier);
    expected.signals.clone_from(&update.signals);
    expected.acked.clone_from(&update.acked);
    same(&answered, &expected, "the row reset answers")?;
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after reset",
    )
}

/// An update setting every field but the restart grace.
fn full_update() -> CheckpointUpdate {
    let mut update = CheckpointUpdate::new(at(600, 1));
    update.pending = Some(at(650, 0));
    update.child_shard_ids = vec![shard(6), shard(7)];
    update.start_timestamp = Some(millis(1_750_000_000_001));
    update.endpoint = Some("http://10.0.0.8:8080/singletons".to_owned());
    update.park = vec![parked(3, 599)];
    update.carrier = Some(ShardId::new("kcl-heartbeat-worker-c"));
    update.signals = Some("v1 workers=2".to_owned());
    update.acked = Some("1".to_owned());
    update
}

/// A reset whose update sets a restart grace keeps it: the take's removal comes first, the
/// update's write after (as in [`reset`](LeaseStore::reset)'s docs: a take, then the
/// update written as a checkpoint does).
pub async fn reset_keeps_a_restart_grace_its_update_sets(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let mut lease = held(shard(1), "a", 5);
    lease.restart_grace = Some(Duration::from_millis(30_000));
    let before = put(store, &lease).await?;
    let mut update = CheckpointUpdate::new(at(700, 0));
    update.restart_grace = Some(Duration::from_millis(90_000));
    let answered = store
        .reset(&before, &worker("c"), &update)
        .await
        .or_fail("reset with a restart grace")?;
    ensure_eq(
        answered.restart_grace,
        update.restart_grace,
        "the restart grace after the reset",
    )?;
    same(
        &row(store, &before.key).await?,
        &answered,
        "the row after reset",
    )
}

/// [`reset`](LeaseStore::reset) is refused (Conflict, the row untouched) unless the row holds
/// the owner and counter observed; a row that is gone refuses it too.
pub async fn reset_is_refused_unless_owner_and_counter_hold(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let update = CheckpointUpdate::new(at(500, 0));
    let before = put(store, &held(shard(1), "a", 5)).await?;
    for (what, variant) in stale_variants(&before) {
        let what = format!("reset observing {what}");
        refused(store.reset(&variant, &worker("c"), &update).await, &what)?;
        unchanged(store, &before, &what).await?;
    }
    let missing = held(shard(2), "a", 5);
    refused(
        store.reset(&missing, &worker("c"), &update).await,
        "reset of a missing row",
    )?;
    ensure_eq(
        store.get(&missing.key).await.or_fail("get")?,
        None,
        "a missing row after it",
    )
}
