//! Checks of what a store offers beyond its operations
//! ([`LeaseStoreExtras`](crate::LeaseStoreExtras)): the change feed and request counts where
//! the store serves them, and the parked-key writes of a redrive, which every store keeping
//! parked keys needs.

use std::collections::BTreeMap;

use super::support::{
    Answer, ensure, ensure_eq, eventually, held, parked, put, refused, row, same, shard, table,
    worker,
};
use super::{Failure, not_applicable};
use crate::lease::feed::{Change, FeedRead};
use crate::lease::usage::{Operation, Usage};
use crate::lease::{CheckpointUpdate, Lease, LeaseStore};
use crate::types::{Checkpoint, ShardId};

/// Where [`ensure_table`](LeaseStore::ensure_table) says the store serves a change feed: a
/// first read ([`changes`](crate::LeaseStoreExtras::changes) from no position) restarts,
/// and reads from there serve every later write of a row once, in order, each as the row
/// after it, then its deletion. A store may answer `Unavailable` while the table is small
/// (reading it whole is cheaper): the check then fills it to 32 KB first.
pub async fn the_change_feed_serves_every_write_in_order(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    if !table(store).await?.change_feed {
        let why = "ensure_table serves no change feed";
        not_applicable("the_change_feed_serves_every_write_in_order", why);
        return Ok(());
    }
    let mut first = store
        .changes(None)
        .await
        .or_fail("changes from no position")?;
    if first == FeedRead::Unavailable {
        // A store may read a small table whole rather than follow its feed (DynamoDB's does
        // below 12 KB, where a read costs less than a feed request): grow the table and read
        // it whole once.
        fill(store).await?;
        first = store
            .changes(None)
            .await
            .or_fail("changes, the table filled")?;
    }
    let FeedRead::Restart(mut position) = first else {
        return Err(Failure::contract(format!(
            "a first read of the feed must restart; it answered {first:?}"
        )));
    };
    let created = put(store, &Lease::new(shard(1), Checkpoint::TrimHorizon)).await?;
    let taken = store.take(&created, &worker("a")).await.or_fail("take")?;
    let renewed = store.renew(&taken).await.or_fail("renew")?;
    store.delete(&renewed).await.or_fail("delete")?;
    let key = created.key.clone();
    let mut seen: Vec<Change> = Vec::new();
    eventually(
        "the feed serves the create, take, renewal and delete",
        async || {
            match store.changes(Some(&position)).await.or_fail("changes")? {
                FeedRead::Changes(changes, next) => {
                    seen.extend(changes.into_iter().filter(|c| key_of(c) == &key));
                    position = next;
                }
                other => {
                    return Err(Failure::contract(format!(
                        "a read from a position the feed handed out answered {other:?}"
                    )));
                }
            }
            let done = matches!(seen.last(), Some(Change::Deleted(_)));
            Ok(if done {
                Ok(())
            } else {
                Err(format!("it served {seen:?}"))
            })
        },
    )
    .await?;
    let expected = [created, taken, renewed];
    ensure_eq(seen.len(), 4, "changes served for one row's four writes")?;
    for (change, lease) in seen.iter().zip(&expected) {
        let Change::Written(written) = change else {
            return Err(Failure::contract(format!(
                "the feed served {change:?} where the write of counter {} was due",
                lease.counter
            )));
        };
        same(
            written,
            lease,
            &format!("the feed's change of counter {}", lease.counter),
        )?;
    }
    Ok(())
}

/// Rows enough to make the table 32 KB, each with 2 KB of `acked` (the most a worker
/// writes), then a whole read of it.
async fn fill(store: &impl LeaseStore) -> Result<(), Failure> {
    for n in 0..16 {
        let mut filler = Lease::new(ShardId::new(format!("filler-{n:02}")), Checkpoint::ShardEnd);
        filler.acked = Some("1".repeat(2048));
        put(store, &filler).await?;
    }
    store.list().await.or_fail("list").map(drop)
}

fn key_of(change: &Change) -> &ShardId {
    match change {
        Change::Written(lease) => &lease.key,
        Change::Deleted(key) => key,
    }
}

/// Requests so far, by operation.
fn requests(usage: &Usage) -> BTreeMap<Operation, u64> {
    let tallies = usage.by_operation();
    tallies
        .into_iter()
        .map(|(op, t)| (op, t.requests))
        .collect()
}

/// Where the store counts its requests ([`usage`](crate::LeaseStoreExtras::usage)), each
/// request that reaches the table is counted once under its operation, a refused write too.
pub async fn usage_counts_every_request(store: &impl LeaseStore) -> Result<(), Failure> {
    table(store).await?;
    let Some(usage) = store.usage() else {
        not_applicable("usage_counts_every_request", "the store counts no requests");
        return Ok(());
    };
    let before = requests(&usage);
    let lease = Lease::new(shard(1), Checkpoint::TrimHorizon);
    store.create(&lease).await.or_fail("create")?;
    store.create(&lease).await.or_fail("create again")?;
    store.get(&lease.key).await.or_fail("get")?;
    store.peek(&lease.key).await.or_fail("peek")?;
    store.list().await.or_fail("list")?;
    store.snapshot().await.or_fail("snapshot")?;
    let taken = store.take(&lease, &worker("a")).await.or_fail("take")?;
    let renewed = store.renew(&taken).await.or_fail("renew")?;
    refused(store.renew(&taken).await, "renew with an older counter")?;
    let to = worker("b");
    store
        .request_handoff(&renewed, Some(&to))
        .await
        .or_fail("request_handoff")?;
    let update = CheckpointUpdate::new(Checkpoint::Latest);
    let written = store
        .checkpoint(&renewed, &update)
        .await
        .or_fail("checkpoint")?;
    let reset = store.reset(&written, &to, &update).await.or_fail("reset")?;
    store.release(&reset).await.or_fail("release")?;
    refused(store.delete(&reset).await, "delete with an older counter")?;
    let expected = [
        (Operation::Create, 2),
        (Operation::Get, 1),
        (Operation::Peek, 1),
        (Operation::List, 1),
        (Operation::Snapshot, 1),
        (Operation::Take, 1),
        (Operation::Renew, 2),
        (Operation::RequestHandoff, 1),
        (Operation::Checkpoint, 1),
        (Operation::Reset, 1),
        (Operation::Release, 1),
        (Operation::Delete, 1),
    ];
    let after = requests(&usage);
    for (operation, n) in expected {
        let counted = (after.get(&operation).copied().unwrap_or(0))
            .saturating_sub(before.get(&operation).copied().unwrap_or(0));
        ensure_eq(counted, n, &format!("requests counted under {operation}"))?;
    }
    Ok(())
}

/// [`unpark`](crate::LeaseStoreExtras::unpark) removes the entries named from the row's
/// parked keys, whoever holds it, and nothing else: the counter stays, so the holder's next
/// write succeeds. A row that is gone refuses it (Conflict) and no row is made.
pub async fn unpark_removes_entries_and_leaves_the_counter(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let mut lease = held(shard(1), "a", 5);
    lease.parked_keys = vec![parked(1, 10), parked(2, 11), parked(3, 12)];
    let before = put(store, &lease).await?;
    store
        .unpark(&before.key, &[parked(1, 10), parked(3, 12)])
        .await
        .or_fail("unpark")?;
    let mut expected = before.clone();
    expected.parked_keys = vec![parked(2, 11)];
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after unpark",
    )?;
    let renewed = store
        .renew(&before)
        .await
        .or_fail("the holder's renewal after unpark")?;
    expected.counter += 1;
    same(&renewed, &expected, "the row the holder's renewal answers")?;
    let missing = shard(2);
    refused(
        store.unpark(&missing, &[parked(1, 10)]).await,
        "unpark of a missing row",
    )?;
    ensure_eq(
        store.get(&missing).await.or_fail("get")?,
        None,
        "a missing row after it",
    )
}

/// [`request_redrive`](crate::LeaseStoreExtras::request_redrive) adds its entry while the
/// row still parks the key (true), touching nothing else; once the row no longer parks it,
/// or is gone, it answers false and writes nothing.
pub async fn request_redrive_adds_its_entry_while_the_key_is_parked(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let entry = parked(7, 40);
    let request = format!("{entry}/redrive");
    let mut lease = held(shard(1), "a", 5);
    lease.parked_keys = vec![entry.clone()];
    let before = put(store, &lease).await?;
    let asked = store
        .request_redrive(&before.key, &entry, &request)
        .await
        .or_fail("request_redrive")?;
    ensure(asked, || {
        "request_redrive of a parked key answered false".to_owned()
    })?;
    let mut expected = before.clone();
    expected.parked_keys = vec![entry.clone(), request.clone()];
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after request_redrive",
    )?;
    let again = store
        .request_redrive(&before.key, &entry, &request)
        .await
        .or_fail("request_redrive again")?;
    ensure(again, || {
        "request_redrive asked twice answered false".to_owned()
    })?;
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after asking twice",
    )?;
    let other = parked(8, 41);
    let asked = store
        .request_redrive(&before.key, &other, &format!("{other}/redrive"))
        .await
        .or_fail("request_redrive of a key not parked")?;
    ensure(!asked, || {
        "request_redrive of a key not parked answered true".to_owned()
    })?;
    same(
        &row(store, &before.key).await?,
        &expected,
        "the row after it",
    )?;
    let gone = shard(2);
    let asked = store
        .request_redrive(&gone, &entry, &request)
        .await
        .or_fail("request_redrive of a missing row")?;
    ensure(!asked, || {
        "request_redrive of a missing row answered true".to_owned()
    })?;
    ensure_eq(
        store.get(&gone).await.or_fail("get")?,
        None,
        "a missing row after it",
    )
}
