//! The table claimed for one application at start, before any shard is opened, whichever
//! store holds it (DynamoDB, Postgres): the order of the steps is the same everywhere, only
//! the calls differ ([`Claims`]).
//!
//! **The application item** names the application the table belongs to. The first worker of
//! an application creates it, conditioned on its absence, so that of two applications
//! starting at once one wins and the other is refused at start, naming both; every commit is
//! conditioned on its shard's position item naming the same application, so a second
//! application writes nothing even if the item was deleted by hand.
//!
//! **The baseline**: at the table's first use by an application, the shards already leased
//! have checkpoints but no position in the table, which a worker would take for records
//! checkpointed without their windows. So the first worker records each lease's checkpoint
//! as its shard's position (conditioned on none being there yet), before it opens any shard:
//! the table counts from there. A worker that finds the item still `pending` (its creator
//! died, or is still at it) records the baseline too; the writes are idempotent.

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{ErrorKind, Lease, LeaseStore};

use super::{Items, TableError};

/// Baseline writes at once.
const CONCURRENT_WRITES: usize = 8;

/// What the application item says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// There is none.
    Absent,
    /// It names another application.
    Other(String),
    /// This application's, its baseline not recorded yet.
    Pending,
    /// This application's, its baseline recorded.
    Done,
}

/// The calls [`claim`] makes of a table's store.
pub trait Claims: Items {
    /// What the application item says, read consistently.
    fn read_claim(&self) -> BoxFuture<'_, Result<Claim, TableError>>;

    /// Creates the application item (`pending`, this application's) unless there is one;
    /// what the item says afterwards. Says so at INFO when it created it.
    fn create_claim(&self) -> BoxFuture<'_, Result<Claim, TableError>>;

    /// `lease`'s checkpoint as its shard's position, unless the table has one; true if
    /// written.
    fn record_baseline<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, TableError>>;

    /// Marks the baseline done in the application item.
    fn baseline_done(&self) -> BoxFuture<'_, Result<(), TableError>>;
}

/// Claims the table for `items`' application (see the module docs): refuses it if another
/// application's item is there; records the baseline of the shards `store` leases if this is
/// the application's first use of the table.
///
/// # Errors
/// [`TableError::OtherApplication`], or a call's error.
pub async fn claim<C: Claims, L: LeaseStore>(items: &C, store: &L) -> Result<(), TableError> {
    let mut claim = items.read_claim().await?;
    if claim == Claim::Absent {
        claim = items.create_claim().await?;
    }
    match claim {
        Claim::Other(theirs) => Err(TableError::OtherApplication {
            table: items.table().to_owned(),
            ours: items.application().to_owned(),
            theirs,
            shard: None,
        }),
        Claim::Done => Ok(()),
        Claim::Absent | Claim::Pending => baseline(items, store).await,
    }
}

/// Records each unfinished lease's checkpoint as its shard's position where none is, then
/// marks the baseline done.
async fn baseline<C: Claims, L: LeaseStore>(items: &C, store: &L) -> Result<(), TableError> {
    let leases = match store.list().await {
        Ok(leases) => leases,
        // A new application: its lease table comes with its worker.
        Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            return Err(TableError::Call {
                table: items.table().to_owned(),
                operation: "the baseline's read of the lease table",
                source: Box::new(e),
            });
        }
    };
    let leases: Vec<Lease> = leases
        .into_iter()
        .filter(|l| !is_coordination_key(&l.key))
        .collect();
    let written = futures_util::stream::iter(&leases)
        .map(|lease| items.record_baseline(lease))
        .buffer_unordered(CONCURRENT_WRITES)
        .collect::<Vec<_>>()
        .await;
    let recorded = written.into_iter().collect::<Result<Vec<bool>, _>>()?;
    items.baseline_done().await?;
    tracing::info!(
        table = items.table(),
        shards = recorded.iter().filter(|r| **r).count(),
        "the exactly-once table counts each leased shard from its checkpoint (baseline recorded)"
    );
    Ok(())
}
