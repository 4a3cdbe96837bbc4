//! Rows ⇄ [`Lease`]: the values each statement binds, and a row read back.
//!
//! Counters, sub-sequence numbers and fences are `u64` in kcl and `bigint` (signed) in
//! Postgres: a value past `i64::MAX` is refused before it is sent (none can be reached by
//! counting), and a negative one read back makes the row unreadable. Hash keys travel as
//! decimal text, into `numeric(39, 0)` columns. Timestamps are stored to the microsecond,
//! rounded down, so that a start pinned at a time is never read back after it.

use chrono::{DateTime, Utc};
use kcl_core::lease::load::Flow;
use kcl_core::{
    Checkpoint, CheckpointUpdate, FencingToken, HashKeyRange, Lease, LeaseLoad, ShardId, WorkerId,
};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

/// The SQL run by `ensure_table` under [`TableSetup::Managed`](crate::TableSetup::Managed),
/// and shipped as `kcl-postgres/schema.sql`.
pub const SCHEMA_SQL: &str = include_str!("../schema.sql");

/// Where the part of `schema.sql` that creates `kcl_positions` begins.
const POSITIONS_PART: &str = "-- kcl_positions: where";

/// The part of `schema.sql` that creates `kcl_positions` (a `PostgresSink`'s table), from
/// its comment to the end of the file.
pub(crate) fn positions_sql() -> &'static str {
    SCHEMA_SQL
        .find(POSITIONS_PART)
        .map_or(SCHEMA_SQL, |at| &SCHEMA_SQL[at..])
}

/// A value kcl counts that Postgres cannot hold.
#[derive(Debug, thiserror::Error)]
#[error("{field} {value} is past what a bigint column holds")]
pub(crate) struct OutOfRange {
    field: &'static str,
    value: u64,
}

/// `value` as a `bigint`.
pub(crate) fn signed(field: &'static str, value: u64) -> Result<i64, OutOfRange> {
    i64::try_from(value).map_err(|_| OutOfRange { field, value })
}

/// `at` to the microsecond, rounded down.
fn micros(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(at.timestamp_micros()).unwrap_or(at)
}

/// A duration as whole milliseconds.
fn millis(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The owner as bound: `None` for an unowned lease.
pub(crate) fn owner(owner: Option<&WorkerId>) -> Option<&str> {
    owner.map(WorkerId::as_str)
}

/// The load columns' values: figure, capacity and flow, all `None` without a load.
pub(crate) fn load(load: Option<LeaseLoad>) -> (Option<i64>, Option<i64>, Option<String>) {
    match load {
        Some(l) => (
            Some(i64::from(l.milli)),
            Some(i64::from(l.capacity_milli)),
            l.flow.map(|f| f.encode()),
        ),
        None => (None, None, None),
    }
}

/// The values of a checkpoint's writes, `$5`–`$19` of `sql::CHECKPOINT` and `sql::RESET`.
#[derive(Debug)]
pub(crate) struct CheckpointParams {
    checkpoint: String,
    sub: i64,
    pending: Option<String>,
    pending_sub: Option<i64>,
    children: Vec<String>,
    start_timestamp: Option<DateTime<Utc>>,
    endpoint: Option<String>,
    park: Vec<String>,
    restart_grace_ms: Option<i64>,
    carrier: Option<String>,
    signals: Option<String>,
    acked: Option<String>,
    load_milli: Option<i64>,
    capacity_milli: Option<i64>,
    flow: Option<String>,
}

impl CheckpointParams {
    pub(crate) fn new(
        update: &CheckpointUpdate,
        holder_load: Option<LeaseLoad>,
    ) -> Result<Self, OutOfRange> {
        let (load_milli, capacity_milli, flow) = load(holder_load);
        let pending_sub = update.pending.as_ref().map(Checkpoint::sub_sequence);
        Ok(Self {
            checkpoint: update.checkpoint.as_str().to_owned(),
            sub: signed("sub-sequence number", update.checkpoint.sub_sequence())?,
            pending: update.pending.as_ref().map(|p| p.as_str().to_owned()),
            pending_sub: pending_sub
                .map(|s| signed("pending sub-sequence number", s))
                .transpose()?,
            children: keys(&update.child_shard_ids),
            start_timestamp: update.start_timestamp.map(micros),
            endpoint: update.endpoint.clone(),
            park: update.park.clone(),
            restart_grace_ms: update.restart_grace.map(millis),
            carrier: update.carrier.as_ref().map(|c| c.as_str().to_owned()),
            signals: update.signals.clone(),
            acked: update.acked.clone(),
            load_milli,
            capacity_milli,
            flow,
        })
    }

    /// `$5`–`$19`, in order.
    pub(crate) fn values(&self) -> [&(dyn ToSql + Sync); 15] {
        [
            &self.checkpoint,
            &self.sub,
            &self.pending,
            &self.pending_sub,
            &self.children,
            &self.start_timestamp,
            &self.endpoint,
            &self.park,
            &self.restart_grace_ms,
            &self.carrier,
            &self.signals,
            &self.acked,
            &self.load_milli,
            &self.capacity_milli,
            &self.flow,
        ]
    }
}

fn keys(ids: &[ShardId]) -> Vec<String> {
    ids.iter().map(|id| id.as_str().to_owned()).collect()
}

/// The values of a whole row, `$3`–`$25` of `sql::CREATE`.
#[derive(Debug)]
pub(crate) struct RowParams {
    owner: Option<String>,
    counter: i64,
    checkpoint: String,
    sub: i64,
    pending: Option<String>,
    pending_sub: Option<i64>,
    owner_switches: i64,
    fence: Option<i64>,
    parents: Vec<String>,
    children: Vec<String>,
    start_hash: Option<String>,
    end_hash: Option<String>,
    handoff_to: Option<String>,
    start_timestamp: Option<DateTime<Utc>>,
    endpoint: Option<String>,
    parked_keys: Vec<String>,
    load: (Option<i64>, Option<i64>, Option<String>),
    restart_grace_ms: Option<i64>,
    carrier: Option<String>,
    signals: Option<String>,
    acked: Option<String>,
}

impl RowParams {
    pub(crate) fn new(lease: &Lease) -> Result<Self, OutOfRange> {
        let pending_sub = lease
            .pending_checkpoint
            .as_ref()
            .map(Checkpoint::sub_sequence);
        Ok(Self {
            owner: lease.owner.as_ref().map(|o| o.as_str().to_owned()),
            counter: signed("counter", lease.counter)?,
            checkpoint: lease.checkpoint.as_str().to_owned(),
            sub: signed("sub-sequence number", lease.checkpoint.sub_sequence())?,
            pending: lease
                .pending_checkpoint
                .as_ref()
                .map(|p| p.as_str().to_owned()),
            pending_sub: pending_sub
                .map(|s| signed("pending sub-sequence number", s))
                .transpose()?,
            owner_switches: signed("owner switches", lease.owner_switches_since_checkpoint)?,
            fence: lease.fence.map(|f| signed("fence", f.0)).transpose()?,
            parents: keys(&lease.parent_shard_ids),
            children: keys(&lease.child_shard_ids),
            start_hash: lease.hash_key_range.map(|r| r.start.to_string()),
            end_hash: lease.hash_key_range.map(|r| r.end.to_string()),
            handoff_to: lease.handoff_to.as_ref().map(|w| w.as_str().to_owned()),
            start_timestamp: lease.start_timestamp.map(micros),
            endpoint: lease.endpoint.clone(),
            parked_keys: lease.parked_keys.clone(),
            load: load(lease.load),
            restart_grace_ms: lease.restart_grace.map(millis),
            carrier: lease.carrier.as_ref().map(|c| c.as_str().to_owned()),
            signals: lease.signals.clone(),
            acked: lease.acked.clone(),
        })
    }

    /// `$3`–`$25`, in order.
    pub(crate) fn values(&self) -> [&(dyn ToSql + Sync); 23] {
        [
            &self.owner,
            &self.counter,
            &self.checkpoint,
            &self.sub,
            &self.pending,
            &self.pending_sub,
            &self.owner_switches,
            &self.fence,
            &self.parents,
            &self.children,
            &self.start_hash,
            &self.end_hash,
            &self.handoff_to,
            &self.start_timestamp,
            &self.endpoint,
            &self.parked_keys,
            &self.load.0,
            &self.load.1,
            &self.load.2,
            &self.restart_grace_ms,
            &self.carrier,
            &self.signals,
            &self.acked,
        ]
    }
}

/// A column's value, or why the row cannot be read.
fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    column: &'static str,
) -> Result<T, String> {
    row.try_get(column).map_err(|e| format!("{column}: {e}"))
}

/// A `bigint` that kcl counts from zero.
fn unsigned(column: &'static str, value: i64) -> Result<u64, String> {
    u64::try_from(value).map_err(|_| format!("{column}: {value} is negative"))
}

fn checkpoint(row: &Row, column: &'static str, sub: &'static str) -> Result<Checkpoint, String> {
    let value: String = get(row, column)?;
    let sub = unsigned(sub, get::<Option<i64>>(row, sub)?.unwrap_or(0))?;
    Checkpoint::parse(&value, sub).ok_or_else(|| format!("{column}: {value:?} is no checkpoint"))
}

fn hash_key(row: &Row, column: &'static str) -> Result<Option<u128>, String> {
    let text: Option<String> = get(row, column)?;
    text.map(|t| {
        t.parse()
            .map_err(|_| format!("{column}: {t} is no hash key"))
    })
    .transpose()
}

/// The load of a row: a hint for balancing, so a figure out of range is left out rather than
/// making the row unreadable.
fn lease_load(row: &Row) -> Option<LeaseLoad> {
    let figure = |column| {
        get::<Option<i64>>(row, column)
            .ok()
            .flatten()
            .and_then(|n| u32::try_from(n).ok())
    };
    let load = LeaseLoad::new(
        figure("load_milli")?,
        figure("capacity_milli").unwrap_or(1000),
    );
    let flow = get::<Option<String>>(row, "flow").ok().flatten();
    Some(match flow.as_deref().and_then(Flow::decode) {
        Some(flow) => load.with_flow(flow),
        None => load,
    })
}

/// The lease of a row read with `sql::columns!()`; `Err` names what cannot be read.
pub(crate) fn lease(row: &Row) -> Result<Lease, String> {
    let key = ShardId::new(get::<String>(row, "lease_key")?);
    let mut lease = Lease::new(key, checkpoint(row, "checkpoint", "checkpoint_sub")?);
    lease.owner = get::<Option<String>>(row, "owner")?.map(WorkerId::new);
    lease.counter = unsigned("counter", get(row, "counter")?)?;
    if get::<Option<String>>(row, "pending_checkpoint")?.is_some() {
        let pending = checkpoint(row, "pending_checkpoint", "pending_checkpoint_sub")?;
        lease.pending_checkpoint = Some(pending);
    }
    lease.owner_switches_since_checkpoint =
        unsigned("owner_switches", get(row, "owner_switches")?)?;
    // Rewritten by the next take; a negative one fails every commit's condition anyway.
    let fence = get::<Option<i64>>(row, "fence")?.and_then(|f| u64::try_from(f).ok());
    lease.fence = fence.map(FencingToken);
    let ids =
        |column| get::<Vec<String>>(row, column).map(|v| v.into_iter().map(ShardId::new).collect());
    lease.parent_shard_ids = ids("parent_shard_ids")?;
    lease.child_shard_ids = ids("child_shard_ids")?;
    lease.hash_key_range = match (
        hash_key(row, "starting_hash_key")?,
        hash_key(row, "ending_hash_key")?,
    ) {
        (Some(start), Some(end)) => Some(HashKeyRange { start, end }),
        _ => None,
    };
    lease.handoff_to = get::<Option<String>>(row, "handoff_to")?.map(WorkerId::new);
    lease.start_timestamp = get(row, "start_timestamp")?;
    lease.endpoint = get(row, "endpoint")?;
    lease.parked_keys = get(row, "parked_keys")?;
    lease.load = lease_load(row);
    let grace = get::<Option<i64>>(row, "restart_grace_ms")?;
    lease.restart_grace = grace
        .map(|ms| unsigned("restart_grace_ms", ms).map(std::time::Duration::from_millis))
        .transpose()?;
    lease.carrier = get::<Option<String>>(row, "carrier")?.map(ShardId::new);
    lease.signals = get(row, "signals")?;
    lease.acked = get(row, "acked")?;
    Ok(lease)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_positions_part_creates_only_kcl_positions() {
        let part = super::positions_sql();
        assert!(
            part.len() < super::SCHEMA_SQL.len(),
            "the part's comment is missing"
        );
        assert!(part.contains("CREATE TABLE IF NOT EXISTS kcl_positions"));
        assert!(!part.contains("CREATE TABLE IF NOT EXISTS kcl_leases"));
        assert!(!part.contains("CREATE INDEX"));
    }
}
