//! What the checks share: rows to set up, answers read as failures, rows compared field by
//! field, and polling of eventually consistent reads.

use std::fmt::Debug;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::{EVENTUALLY, Failure};
use crate::error::{BackendError, ErrorKind, error_chain};
use crate::lease::load::Flow;
use crate::lease::{Lease, LeaseLoad, LeaseStore, TableFeatures};
use crate::multi_stream::StreamId;
use crate::types::{
    Checkpoint, ExtendedSequenceNumber, FencingToken, HashKeyRange, SequenceNumber, ShardId,
    WorkerId,
};

/// How often an eventually consistent read is tried again.
const POLL: Duration = Duration::from_millis(100);

/// A store's answer read as the check's: an error is a [`Failure::Store`] naming `what`.
pub(super) trait Answer<T> {
    fn or_fail(self, what: &str) -> Result<T, Failure>;
}

impl<T> Answer<T> for Result<T, BackendError> {
    fn or_fail(self, what: &str) -> Result<T, Failure> {
        self.map_err(|source| Failure::Store {
            what: what.to_owned(),
            source,
        })
    }
}

/// Fails with `what` unless `holds`.
pub(super) fn ensure(holds: bool, what: impl FnOnce() -> String) -> Result<(), Failure> {
    if holds {
        Ok(())
    } else {
        Err(Failure::contract(what()))
    }
}

/// Fails unless `found == expected`.
#[allow(
    clippy::needless_pass_by_value,
    reason = "an assertion: call sites pass what they read, as assert_eq! takes it"
)]
pub(super) fn ensure_eq<T: PartialEq + Debug>(
    found: T,
    expected: T,
    what: &str,
) -> Result<(), Failure> {
    ensure(found == expected, || {
        format!("{what}: found {found:?}, expected {expected:?}")
    })
}

/// Fails unless `result` is a refusal of kind [`Conflict`](ErrorKind::Conflict).
pub(super) fn refused<T: Debug>(
    result: Result<T, BackendError>,
    what: &str,
) -> Result<(), Failure> {
    match result {
        Err(e) if e.kind() == ErrorKind::Conflict => Ok(()),
        Err(e) => Err(Failure::contract(format!(
            "{what}: expected a refusal of kind Conflict, got an error of kind {:?}: {}",
            e.kind(),
            error_chain(&e)
        ))),
        Ok(applied) => Err(Failure::contract(format!(
            "{what}: expected a refusal of kind Conflict, but it applied: {applied:?}"
        ))),
    }
}

/// The table, asked for every feature (as the default coordination does).
pub(super) async fn table(store: &impl LeaseStore) -> Result<TableFeatures, Failure> {
    store
        .ensure_table(TableFeatures::ALL)
        .await
        .or_fail("ensure_table")
}

/// Creates `lease` (which must be new) and returns the row as stored, checked equal to it.
pub(super) async fn put(store: &impl LeaseStore, lease: &Lease) -> Result<Lease, Failure> {
    let created = store
        .create(lease)
        .await
        .or_fail(&format!("create {}", lease.key))?;
    ensure(created, || {
        format!("create {} of a new row answered false", lease.key)
    })?;
    let stored = row(store, &lease.key).await?;
    same(&stored, lease, &format!("row {} as created", lease.key))?;
    Ok(stored)
}

/// Row `key`, which must exist.
pub(super) async fn row(store: &impl LeaseStore, key: &ShardId) -> Result<Lease, Failure> {
    store
        .get(key)
        .await
        .or_fail(&format!("get {key}"))?
        .ok_or_else(|| Failure::contract(format!("row {key} is missing")))
}

/// Fails unless row `before.key` is still exactly `before` (after a refused write).
pub(super) async fn unchanged(
    store: &impl LeaseStore,
    before: &Lease,
    what: &str,
) -> Result<(), Failure> {
    let now = row(store, &before.key).await?;
    same(&now, before, &format!("{what}: the row changed"))
}

/// Fails unless `found` is `expected`, naming every field that differs. Sets (parents,
/// children, parked keys) are compared as sets.
pub(super) fn same(found: &Lease, expected: &Lease, what: &str) -> Result<(), Failure> {
    let differences = differences(found, expected);
    ensure(differences.is_empty(), || {
        format!("{what}: {}", differences.join("; "))
    })
}

/// The fields in which `found` differs from `expected`, each with both values.
pub(super) fn differences(found: &Lease, expected: &Lease) -> Vec<String> {
    let (found, expected) = (normalized(found), normalized(expected));
    // Destructured so that a field added to `Lease` is compared, or the build fails here.
    let Lease {
        key,
        owner,
        counter,
        checkpoint,
        pending_checkpoint,
        owner_switches_since_checkpoint,
        parent_shard_ids,
        child_shard_ids,
        hash_key_range,
        handoff_to,
        start_timestamp,
        endpoint,
        parked_keys,
        load,
        restart_grace,
        carrier,
        fence,
        signals,
        acked,
    } = &expected;
    let mut out = Vec::new();
    macro_rules! compare {
        ($($field:ident),*) => {$(
            if &found.$field != $field {
                out.push(format!(
                    "{} is {:?}, expected {:?}",
                    stringify!($field),
                    found.$field,
                    $field
                ));
            }
        )*};
    }
    compare!(
        key,
        owner,
        counter,
        checkpoint,
        pending_checkpoint,
        owner_switches_since_checkpoint,
        parent_shard_ids,
        child_shard_ids,
        hash_key_range,
        handoff_to,
        start_timestamp,
        endpoint,
        parked_keys,
        load,
        restart_grace,
        carrier,
        fence,
        signals,
        acked
    );
    out
}

/// `lease` with its sets in order.
fn normalized(lease: &Lease) -> Lease {
    let mut l = lease.clone();
    l.parent_shard_ids.sort();
    l.child_shard_ids.sort();
    l.parked_keys.sort();
    l.parked_keys.dedup();
    l
}

/// Polls `probe` until it answers `Ok(())`, for up to [`EVENTUALLY`]: an eventually
/// consistent read. `probe` answers `Err(why)` while the read does not show it yet.
pub(super) async fn eventually(
    what: &str,
    mut probe: impl AsyncFnMut() -> Result<Result<(), String>, Failure>,
) -> Result<(), Failure> {
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        match probe().await? {
            Ok(()) => return Ok(()),
            Err(why) if Instant::now() >= deadline => {
                return Err(Failure::contract(format!(
                    "{what}, within {EVENTUALLY:?}: {why}"
                )));
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Shard `n`'s id, as Kinesis names it.
pub(super) fn shard(n: u32) -> ShardId {
    ShardId::new(format!("shardId-{n:012}"))
}

/// A worker.
pub(super) fn worker(name: &str) -> WorkerId {
    WorkerId::new(format!("worker-{name}"))
}

/// A stream of a multi-stream application, as KCL Java names it.
pub(super) fn stream() -> StreamId {
    StreamId::new("123456789012", "orders", 1_700_000_000)
}

/// A Kinesis sequence number (56 digits) ending in `n`, at sub-sequence `sub`.
pub(super) fn at(n: u32, sub: u64) -> Checkpoint {
    let digits = format!("4959033827149025660855969253836157109592157598913{n:07}");
    let sequence =
        SequenceNumber::parse(digits).unwrap_or_else(|| SequenceNumber::from(u128::from(n)));
    Checkpoint::Sequence(ExtendedSequenceNumber {
        sequence,
        sub_sequence: sub,
    })
}

/// A time in whole milliseconds (what every store keeps).
pub(super) fn millis(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// A parked-key entry as `Parallel::park_keys` writes it.
pub(super) fn parked(key: u64, sequence: u32) -> String {
    let Checkpoint::Sequence(s) = at(sequence, 0) else {
        return format!("{key:016x}/{sequence}/0");
    };
    format!("{key:016x}/{}/0", s.sequence)
}

/// A load figure with a flow.
pub(super) fn load(milli: u32) -> LeaseLoad {
    let flow = Flow {
        arrival_milli: 250_000,
        read_milli: 240_000,
        behind_millis: 1_500,
        work_milli: milli / 2,
    };
    LeaseLoad::new(milli, 2_000).with_flow(flow)
}

/// The variants of `held` a write conditioned on owner and counter must refuse: the
/// counter before and after the row's, another owner, no owner.
pub(super) fn stale_variants(held: &Lease) -> Vec<(&'static str, Lease)> {
    let mut older = held.clone();
    older.counter -= 1;
    let mut newer = held.clone();
    newer.counter += 1;
    let mut other = held.clone();
    other.owner = Some(worker("z"));
    let mut unowned = held.clone();
    unowned.owner = None;
    vec![
        ("an older counter", older),
        ("a later counter", newer),
        ("another owner", other),
        ("no owner", unowned),
    ]
}

/// Row `key` owned by `owner` at `counter`, in its tenure fenced by `counter - 1`, at a
/// sequence checkpoint: a held lease with nothing else set.
pub(super) fn held(key: ShardId, owner: &str, counter: u64) -> Lease {
    let mut l = Lease::new(key, at(100, 0));
    l.owner = Some(worker(owner));
    l.counter = counter;
    l.fence = Some(FencingToken(counter.saturating_sub(1)));
    l
}

/// Row `key` with every field set: ids of `stream`'s shards if given (a multi-stream row),
/// else plain shard ids.
pub(super) fn full(key: ShardId, stream: Option<&StreamId>) -> Lease {
    let id = |n| match stream {
        Some(s) => s.lease_key(&shard(n)),
        None => shard(n),
    };
    let mut l = held(key, "a", 41);
    l.checkpoint = at(200, 3);
    l.pending_checkpoint = Some(at(250, 5));
    l.owner_switches_since_checkpoint = 2;
    l.parent_shard_ids = vec![id(1), id(0)];
    l.child_shard_ids = vec![id(5), id(4)];
    l.hash_key_range = Some(HashKeyRange {
        start: 1 << 127,
        end: u128::MAX,
    });
    l.handoff_to = Some(worker("b"));
    l.start_timestamp = Some(millis(1_700_000_000_123));
    l.endpoint = Some("http://10.0.0.7:8080/singletons".to_owned());
    l.parked_keys = vec![parked(0xff, 201), parked(0x1234, 202)];
    l.load = Some(load(350));
    l.restart_grace = Some(Duration::from_millis(45_250));
    l.carrier = Some(ShardId::new("kcl-heartbeat-worker-a"));
    l.fence = Some(FencingToken(40));
    l.signals = Some("v1 workers=3 shards=12".to_owned());
    l.acked = Some("2:7,9".to_owned());
    l
}
