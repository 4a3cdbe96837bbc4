//! Checks of the table and its rows: creating the table, creating rows, reading them back
//! whole, deleting them, and the owner index.

use super::Failure;
use super::support::{
    Answer, at, ensure, ensure_eq, eventually, full, held, put, refused, same, shard, stream,
    table, unchanged, worker,
};
use crate::lease::{Lease, LeaseStore, TableFeatures};
use crate::types::{Checkpoint, ShardId};

/// [`ensure_table`](LeaseStore::ensure_table) may run any number of times: it serves the
/// same features each time (a subset of those asked for, none when none are asked), and
/// keeps the rows.
pub async fn ensure_table_is_idempotent(store: &impl LeaseStore) -> Result<(), Failure> {
    let first = table(store).await?;
    let lease = held(shard(1), "a", 3);
    put(store, &lease).await?;
    let again = table(store).await?;
    ensure_eq(again, first, "the features a second ensure_table serves")?;
    let none = store
        .ensure_table(TableFeatures::NONE)
        .await
        .or_fail("ensure_table asking for no feature")?;
    ensure_eq(
        none,
        TableFeatures::NONE,
        "the features served when none is asked for",
    )?;
    unchanged(store, &lease, "ensure_table again").await?;
    let rows = store.list().await.or_fail("list")?;
    ensure_eq(rows.len(), 1, "rows after ensure_table ran three times")
}

/// [`get`](LeaseStore::get) and [`peek`](LeaseStore::peek) of a row that does not exist, or
/// no longer does, answer `None`.
pub async fn get_and_peek_of_a_missing_row_answer_none(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let missing = shard(9);
    ensure_eq(
        store.get(&missing).await.or_fail("get")?,
        None,
        "get of a missing row",
    )?;
    ensure_eq(
        store.peek(&missing).await.or_fail("peek")?,
        None,
        "peek of a missing row",
    )?;
    let lease = put(store, &held(shard(1), "a", 3)).await?;
    store.delete(&lease).await.or_fail("delete")?;
    ensure_eq(
        store.get(&lease.key).await.or_fail("get")?,
        None,
        "get of a deleted row",
    )?;
    eventually("peek of a deleted row answers None", async || {
        let peeked = store.peek(&lease.key).await.or_fail("peek")?;
        Ok(peeked.map_or(Ok(()), |row| Err(format!("it answers {row:?}"))))
    })
    .await
}

/// [`create`](LeaseStore::create) writes the row given, every field as given, and answers
/// true; for a key that exists it answers false and leaves the row as it is.
pub async fn create_writes_a_row_only_when_absent(store: &impl LeaseStore) -> Result<(), Failure> {
    table(store).await?;
    let lease = Lease::new(shard(1), Checkpoint::TrimHorizon);
    let stored = put(store, &lease).await?;
    let mut other = held(shard(1), "a", 9);
    other.checkpoint = at(5, 0);
    let created = store
        .create(&other)
        .await
        .or_fail("create of an existing key")?;
    ensure(!created, || {
        "create of an existing key answered true".to_owned()
    })?;
    unchanged(store, &stored, "create of an existing key").await?;
    // An owned row is created as given too (KCL Java's and kcl-admin's imports write them).
    put(store, &held(shard(2), "b", 7)).await.map(drop)
}

/// [`list`](LeaseStore::list) returns every row as stored, and
/// [`snapshot`](LeaseStore::snapshot) does too, at most a little later; neither has a row
/// that was deleted.
pub async fn list_and_snapshot_return_every_row(store: &impl LeaseStore) -> Result<(), Failure> {
    table(store).await?;
    ensure_eq(
        store.list().await.or_fail("list")?,
        Vec::new(),
        "list of an empty table",
    )?;
    ensure_eq(
        store.snapshot().await.or_fail("snapshot")?,
        Vec::new(),
        "snapshot of an empty table",
    )?;
    let mut finished = Lease::new(shard(3), Checkpoint::ShardEnd);
    finished.child_shard_ids = vec![shard(4), shard(5)];
    let rows = vec![
        held(shard(1), "a", 3),
        full(stream().lease_key(&shard(2)), Some(&stream())),
        finished,
        Lease::new(shard(4), Checkpoint::Latest),
    ];
    for lease in &rows {
        put(store, lease).await?;
    }
    store
        .delete(&rows[3])
        .await
        .or_fail("delete of the fourth row")?;
    let expected = &rows[..3];
    whole_table(&store.list().await.or_fail("list")?, expected, "list")?;
    eventually("snapshot shows every row", async || {
        let read = store.snapshot().await.or_fail("snapshot")?;
        Ok(whole_table(&read, expected, "snapshot").map_err(|f| f.to_string()))
    })
    .await
}

/// Fails unless `read` holds exactly the rows `expected`, in any order.
fn whole_table(read: &[Lease], expected: &[Lease], what: &str) -> Result<(), Failure> {
    let mut keys: Vec<&ShardId> = read.iter().map(|l| &l.key).collect();
    keys.sort();
    let mut wanted: Vec<&ShardId> = expected.iter().map(|l| &l.key).collect();
    wanted.sort();
    ensure_eq(keys, wanted, &format!("the keys {what} returns"))?;
    for lease in expected {
        let found = read.iter().find(|l| l.key == lease.key);
        if let Some(found) = found {
            same(
                found,
                lease,
                &format!("row {} as {what} returns it", lease.key),
            )?;
        }
    }
    Ok(())
}

/// A row with every field set (hash key range, load and flow, carrier, signals, endpoint,
/// parked keys, start timestamp, restart grace, fence, acked, parents and children) reads
/// back as written, by [`get`](LeaseStore::get), [`peek`](LeaseStore::peek) and
/// [`list`](LeaseStore::list).
pub async fn a_row_with_every_field_round_trips(store: &impl LeaseStore) -> Result<(), Failure> {
    table(store).await?;
    round_trip(store, full(shard(2), None)).await
}

/// As [`a_row_with_every_field_round_trips`], for a row of a multi-stream application:
/// its key is KCL Java's `account:stream:creationEpoch:shardId`, and so are its parents'
/// and children's (DynamoDB stores those without the stream, as KCL Java does, and puts it
/// back on reading).
pub async fn a_multi_stream_row_with_every_field_round_trips(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let s = stream();
    round_trip(store, full(s.lease_key(&shard(2)), Some(&s))).await
}

async fn round_trip(store: &impl LeaseStore, lease: Lease) -> Result<(), Failure> {
    let stored = put(store, &lease).await?;
    let listed = store.list().await.or_fail("list")?;
    whole_table(&listed, std::slice::from_ref(&lease), "list")?;
    eventually("peek reads the row back", async || {
        let peeked = store.peek(&lease.key).await.or_fail("peek")?;
        Ok(match peeked {
            Some(p) => same(&p, &stored, "peek").map_err(|f| f.to_string()),
            None => Err("peek answers None".to_owned()),
        })
    })
    .await
}

/// Every kind of checkpoint reads back as written, the committed one and the pending one:
/// KCL Java's sentinels (`TRIM_HORIZON`, `LATEST`, `AT_TIMESTAMP`, `SHARD_END`) and sequence
/// numbers of 56 digits with and without a sub-sequence number.
pub async fn every_checkpoint_kind_round_trips(store: &impl LeaseStore) -> Result<(), Failure> {
    table(store).await?;
    let kinds = [
        Checkpoint::TrimHorizon,
        Checkpoint::Latest,
        Checkpoint::AtTimestamp,
        Checkpoint::ShardEnd,
        at(7, 0),
        at(8, 11),
    ];
    let pending = kinds.iter().cycle().skip(1);
    for ((n, checkpoint), pending) in (1..).zip(&kinds).zip(pending) {
        let mut lease = Lease::new(shard(n), checkpoint.clone());
        lease.pending_checkpoint = Some(pending.clone());
        put(store, &lease).await?;
    }
    Ok(())
}

/// [`delete`](LeaseStore::delete) is conditioned on the counter alone: refused (Conflict,
/// the row left) if the row was written since it was read, applied whoever owns it, and
/// refused for a row already gone.
pub async fn delete_is_conditioned_on_the_counter_alone(
    store: &impl LeaseStore,
) -> Result<(), Failure> {
    table(store).await?;
    let lease = put(store, &held(shard(1), "a", 5)).await?;
    let mut stale = lease.clone();
    stale.counter -= 1;
    refused(store.delete(&stale).await, "delete with an older counter")?;
    unchanged(store, &lease, "delete with an older counter").await?;
    let mut ahead = lease.clone();
    ahead.counter += 1;
    refused(store.delete(&ahead).await, "delete with a later counter")?;
    unchanged(store, &lease, "delete with a later counter").await?;
    let mut other_owner = lease.clone();
    other_owner.owner = Some(worker("b"));
    store
        .delete(&other_owner)
        .await
        .or_fail("delete with the counter, naming another owner")?;
    ensure_eq(
        store.get(&lease.key).await.or_fail("get")?,
        None,
        "the row after delete",
    )?;
    refused(
        store.delete(&lease).await,
        "delete of a row already deleted",
    )
}

/// [`owned_by`](LeaseStore::owned_by) names the keys of one owner's rows, at most a little
/// late, and follows takes and releases.
pub async fn owned_by_names_the_rows_of_one_owner(store: &impl LeaseStore) -> Result<(), Failure> {
    table(store).await?;
    let a1 = put(store, &held(shard(1), "a", 3)).await?;
    let a2 = put(store, &held(shard(2), "a", 4)).await?;
    put(store, &held(shard(3), "b", 5)).await?;
    put(store, &Lease::new(shard(4), Checkpoint::TrimHorizon)).await?;
    owners(store, &[("a", &[1, 2]), ("b", &[3]), ("c", &[])]).await?;
    store.take(&a1, &worker("b")).await.or_fail("take by b")?;
    store.release(&a2).await.or_fail("release by a")?;
    owners(store, &[("a", &[]), ("b", &[1, 3])]).await
}

/// Polls until `owned_by` names, for each owner, the rows of those shard numbers.
async fn owners(store: &impl LeaseStore, expected: &[(&str, &[u32])]) -> Result<(), Failure> {
    for (owner, shards) in expected {
        let wanted: Vec<ShardId> = shards.iter().map(|n| shard(*n)).collect();
        let what = format!("owned_by({}) names {wanted:?}", worker(owner));
        eventually(&what, async || {
            let mut keys = store.owned_by(&worker(owner)).await.or_fail("owned_by")?;
            keys.sort();
            Ok(if keys == wanted {
                Ok(())
            } else {
                Err(format!("it names {keys:?}"))
            })
        })
        .await?;
    }
    Ok(())
}
