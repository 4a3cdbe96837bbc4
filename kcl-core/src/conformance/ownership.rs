//! Checks of the writes that move or prove ownership: renewals, takes, releases and handoff
//! requests, each with its condition, its effect on every field and its refusals.

use super::Failure;
use super::support::{
    Answer, ensure_eq, full, held, load, put, refused, row, same, shard, stale_variants, table,
    unchanged, worker,
};
use crate::lease::{Lease, LeaseStore};
use crate::types::{Checkpoint, FencingToken, WorkerId};

/// [`renew`](LeaseStore::renew) bumps the counter by one and leaves every other field as it
/// was (the checkpoint, the fence, the handoff request, the load when the holder carries
/// none); it answers the row as stored.
pub async fn renew_bumps_the_counter_and_keeps_the_rest(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let before = put(store, &full(shard(1), None)).await?;
    let mut holder = before.clone();
    holder.load = None;
    let renewed = store.renew(&holder).await.or_fail("renew")?;
    let mut expected = before.clone();
    expected.counter += 1;
    same(&renewed, &expected, "the row renew answers")?;
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after renew",
    )?;
    let again = store
        .renew(&renewed)
        .await
        .or_fail("renew with the counter it answered")?;
    ensure_eq(
        again.counter,
        before.counter + 2,
        "the counter after two renewals",
    )
}

/// A renewal writes the load the holder carries (`held.load`), and leaves the row's load
/// alone when it carries none.
pub async fn renew_writes_the_load_it_carries(store: &impl LeaseStore) -> Result<(), Failure> {
    table(store).await?;
    let mut lease = held(shard(1), "a", 3);
    lease.load = Some(load(100));
    let before = put(store, &lease).await?;
    let mut holder = before.clone();
    holder.load = Some(load(700));
    let renewed = store
        .renew(&holder)
        .await
        .or_fail("renew carrying a load")?;
    let mut expected = before.clone();
    expected.counter += 1;
    expected.load = Some(load(700));
    same(&renewed, &expected, "the row renew answers")?;
    let mut without = renewed.clone();
    without.load = None;
    let renewed = store
        .renew(&without)
        .await
        .or_fail("renew carrying no load")?;
    expected.counter += 1;
    same(
        &renewed,
        &expected,
        "the row after a renewal carrying no load",
    )?;
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row as read",
    )
}

/// [`renew`](LeaseStore::renew) is refused (Conflict, the row untouched) unless the row holds
/// the owner and counter the holder last saw; a row that is gone refuses it too.
pub async fn renew_is_refused_unless_owner_and_counter_hold(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let before = put(store, &held(shard(1), "a", 5)).await?;
    for (what, variant) in stale_variants(&before) {
        let what = format!("renew with {what}");
        refused(store.renew(&variant).await, &what)?;
        unchanged(store, &before, &what).await?;
    }
    let missing = held(shard(2), "a", 5);
    refused(store.renew(&missing).await, "renew of a missing row")?;
    ensure_eq(
        store.get(&missing.key).await.or_fail("get")?,
        None,
        "a missing row after renew",
    )
}

/// [`take`](LeaseStore::take) of an unowned row makes the taker its owner, bumps the
/// counter, writes the new counter as the tenure's fence, counts an owner switch (KCL Java's
/// `ownerSwitchesSinceCheckpoint`) and removes a handoff request and a restart grace; the
/// checkpoint and the rest stay.
pub async fn take_makes_the_taker_owner_and_fences_its_tenure(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let mut lease = full(shard(1), None);
    lease.owner = None;
    lease.counter = 7;
    let before = put(store, &lease).await?;
    let taken = store.take(&before, &worker("w")).await.or_fail("take")?;
    let mut expected = before.clone();
    expected.owner = Some(worker("w"));
    expected.counter = 8;
    expected.fence = Some(FencingToken(8));
    expected.owner_switches_since_checkpoint += 1;
    expected.handoff_to = None;
    expected.restart_grace = None;
    same(&taken, &expected, "the row take answers")?;
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after take",
    )
}

/// A [`take`](LeaseStore::take) from another owner (a failover, or a handoff) does as a
/// take of an unowned row: an owner switch counted, the handoff request and the restart
/// grace removed, the fence the new counter.
pub async fn take_from_another_owner_counts_a_switch_and_clears_the_handoff(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let before = put(store, &full(shard(1), None)).await?;
    let taken = store
        .take(&before, &worker("b"))
        .await
        .or_fail("take by b")?;
    let mut expected = before.clone();
    expected.owner = Some(worker("b"));
    expected.counter += 1;
    expected.fence = Some(FencingToken(expected.counter));
    expected.owner_switches_since_checkpoint += 1;
    expected.handoff_to = None;
    expected.restart_grace = None;
    same(&taken, &expected, "the row take answers")?;
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after take",
    )
}

/// A [`take`](LeaseStore::take) by the worker the row names already (an adoption: the
/// leader assigned it) keeps the handoff request and counts no switch; it still bumps the
/// counter, writes the fence and removes the restart grace.
pub async fn an_adoption_keeps_the_handoff_request(store: &impl LeaseStore) -> Result<(), Failure> {
    table(store).await?;
    let before = put(store, &full(shard(1), None)).await?;
    let owner = before.owner.clone().unwrap_or_else(|| worker("a"));
    let adopted = store
        .take(&before, &owner)
        .await
        .or_fail("take by its owner")?;
    let mut expected = before.clone();
    expected.counter += 1;
    expected.fence = Some(FencingToken(expected.counter));
    expected.restart_grace = None;
    same(&adopted, &expected, "the row an adoption answers")?;
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after an adoption",
    )
}

/// [`take`](LeaseStore::take) is refused (Conflict, the row untouched) unless the row holds
/// the owner and counter observed: a take from a stale read, of a row taken meanwhile, or
/// of a row that is gone.
pub async fn take_is_refused_unless_owner_and_counter_hold(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let owned = put(store, &held(shard(1), "a", 5)).await?;
    for (what, variant) in stale_variants(&owned) {
        let what = format!("take observing {what}");
        refused(store.take(&variant, &worker("t")).await, &what)?;
        unchanged(store, &owned, &what).await?;
    }
    let free = put(store, &Lease::new(shard(2), Checkpoint::TrimHorizon)).await?;
    let mut as_owned = free.clone();
    as_owned.owner = Some(worker("a"));
    refused(
        store.take(&as_owned, &worker("t")).await,
        "take of an unowned row observed owned",
    )?;
    unchanged(store, &free, "take of an unowned row observed owned").await?;
    let missing = Lease::new(shard(3), Checkpoint::TrimHorizon);
    refused(
        store.take(&missing, &worker("t")).await,
        "take of a missing row",
    )?;
    ensure_eq(
        store.get(&missing.key).await.or_fail("get")?,
        None,
        "a missing row after take",
    )
}

/// [`release`](LeaseStore::release) removes the owner, the handoff request and the restart
/// grace and bumps the counter, so that any worker may take the lease at once; the
/// checkpoint, the fence and the owner-switch count stay.
pub async fn release_frees_the_lease_and_bumps_the_counter(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let before = put(store, &full(shard(1), None)).await?;
    store.release(&before).await.or_fail("release")?;
    let mut expected = before.clone();
    expected.owner = None;
    expected.counter += 1;
    expected.handoff_to = None;
    expected.restart_grace = None;
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after release",
    )?;
    let taken = store
        .take(&expected, &worker("b"))
        .await
        .or_fail("take of the released row")?;
    ensure_eq(
        taken.owner,
        Some(worker("b")),
        "the owner after a take of the released row",
    )
}

/// [`release`](LeaseStore::release) is refused (Conflict, the row untouched) unless the row
/// holds the owner and counter the holder last saw.
pub async fn release_is_refused_unless_owner_and_counter_hold(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let before = put(store, &held(shard(1), "a", 5)).await?;
    for (what, variant) in stale_variants(&before) {
        let what = format!("release with {what}");
        refused(store.release(&variant).await, &what)?;
        unchanged(store, &before, &what).await?;
    }
    let missing = held(shard(2), "a", 5);
    refused(store.release(&missing).await, "release of a missing row")?;
    ensure_eq(
        store.get(&missing.key).await.or_fail("get")?,
        None,
        "a missing row after release",
    )
}

/// [`request_handoff`](LeaseStore::request_handoff) is conditioned on the owner alone (a
/// read whose counter is long gone still asks), writes the target and nothing else: the
/// counter stays, so the owner's next renewal succeeds. `None` withdraws the request.
pub async fn request_handoff_names_the_target_and_leaves_the_counter(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let before = put(store, &held(shard(1), "a", 7)).await?;
    let mut observed = before.clone();
    observed.counter = 3;
    store
        .request_handoff(&observed, Some(&worker("b")))
        .await
        .or_fail("request_handoff from an older read")?;
    let mut expected = before.clone();
    expected.handoff_to = Some(worker("b"));
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after request_handoff",
    )?;
    let renewed = store
        .renew(&before)
        .await
        .or_fail("the owner's renewal after a handoff request")?;
    expected.counter += 1;
    same(&renewed, &expected, "the row the owner's renewal answers")?;
    store
        .request_handoff(&observed, None::<&WorkerId>)
        .await
        .or_fail("request_handoff withdrawing")?;
    expected.handoff_to = None;
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after withdrawing the request",
    )
}

/// [`request_handoff`](LeaseStore::request_handoff) is refused (Conflict, the row untouched)
/// when the row's owner is not the one observed: another owner, none, or one where none was
/// observed.
pub async fn request_handoff_is_refused_unless_the_owner_holds(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let owned = put(store, &held(shard(1), "a", 5)).await?;
    let to = worker("t");
    let mut other = owned.clone();
    other.owner = Some(worker("b"));
    let mut unowned = owned.clone();
    unowned.owner = None;
    for (what, variant) in [("another owner", other), ("no owner", unowned)] {
        let what = format!("request_handoff observing {what}");
        refused(store.request_handoff(&variant, Some(&to)).await, &what)?;
        unchanged(store, &owned, &what).await?;
    }
    let free = put(store, &Lease::new(shard(2), Checkpoint::TrimHorizon)).await?;
    let mut as_owned = free.clone();
    as_owned.owner = Some(worker("a"));
    let what = "request_handoff of an unowned row observed owned";
    refused(store.request_handoff(&as_owned, Some(&to)).await, what)?;
    unchanged(store, &free, what).await?;
    let missing = held(shard(3), "a", 5);
    refused(
        store.request_handoff(&missing, Some(&to)).await,
        "request_handoff of a missing row",
    )?;
    ensure_eq(
        store.get(&missing.key).await.or_fail("get")?,
        None,
        "a missing row after it",
    )
}

/// [`request_handoff`](LeaseStore::request_handoff) of a row that is gone, from a read that
/// saw it unowned, is refused (Conflict) and creates nothing: no write makes a row but
/// [`create`](LeaseStore::create).
pub async fn request_handoff_on_a_missing_row_is_refused(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let gone = Lease::new(shard(1), Checkpoint::TrimHorizon);
    let what = "request_handoff of a missing row observed unowned";
    refused(store.request_handoff(&gone, Some(&worker("t"))).await, what)?;
    ensure_eq(
        store.get(&gone.key).await.or_fail("get")?,
        None,
        "the row after it",
    )?;
    let listed = store.list().await.or_fail("list")?;
    ensure_eq(listed, Vec::new(), "the rows after it")?;
    // A row the store wrote but cannot read is skipped by `list` and named here.
    ensure_eq(
        store.unreadable(),
        Vec::new(),
        "the unreadable rows after it",
    )
}
