//! Creating the lease table, or checking the one that is there, and waiting until `ACTIVE`.
//!
//! The table KCL Java creates has only `leaseKey` (S) as hash key and on-demand billing; we
//! create the same, so either library can use a table the other created. An existing table is
//! used as long as its hash key is `leaseKey`. The `leaseOwner` index is added as KCL Java 3.x
//! adds it (same name, keys and projection), so that either library finds it usable.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, CreateGlobalSecondaryIndexAction, GlobalSecondaryIndexUpdate,
    KeySchemaElement, KeyType, Projection, ProjectionType, ProvisionedThroughput,
    ScalarAttributeType, StreamSpecification, StreamViewType, TableDescription, TableStatus,
};
use kcl_core::{BackendError, ErrorKind};
use tokio::time::{Instant, sleep};

use super::TableBilling;
use super::schema::{LEASE_KEY, LEASE_OWNER, OWNER_INDEX};
use crate::error::{Cause, backend_error};

const OPERATION: &str = "ensure_table";

/// The first wait between two looks at a table being created: short, because a table often
/// becomes `ACTIVE` within milliseconds (emulators, small tables), and a new application should
/// not wait a fixed half-second for its first record.
const FIRST_POLL: Duration = Duration::from_millis(10);

/// How much each wait grows over the one before. A table that becomes `ACTIVE` after `t` is
/// seen at most `0.2 × t + 10 ms` later (110 ms for a table created in half a second).
/// Doubling would cost up to `t`: on dynalite, whose tables take 500 ms, doubling from 10 ms
/// saw them after 664 ms (median of 7), later than a fixed 500 ms poll (513 ms); 1.2× sees
/// them after 550 ms, and tables that are `ACTIVE` at once after 8 ms (the fixed poll: up to
/// 511 ms).
const GROWTH: f64 = 1.2;

/// The longest wait between two looks, reached after about 3 s: a table that takes
/// DynamoDB's seconds costs two DescribeTable calls a second.
const MAX_POLL: Duration = Duration::from_millis(500);

/// The waits between looks at a table being created.
fn polls() -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(FIRST_POLL), |wait| {
        Some(wait.mul_f64(GROWTH).min(MAX_POLL))
    })
}

/// The longest wait before asking again for a change the table refused as busy.
const BUSY_MAX: Duration = Duration::from_secs(2);

/// The waits before asking again for a change the table refused as busy (another worker's
/// change under way, a throttled control plane): from 100 ms, doubling up to [`BUSY_MAX`],
/// jittered so that workers starting together do not ask in step. Without them a busy
/// `ACTIVE` table was asked again at once, thousands of `UpdateTable` calls a second.
fn busy_waits() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(BUSY_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// What [`ensure`] may do to the table beyond waiting for it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Shape {
    /// Create it if it is missing.
    pub(crate) create: bool,
    /// Add the `leaseOwner` index if it lacks one.
    pub(crate) add_index: bool,
    /// Enable a `NEW_IMAGE` stream if it has none.
    pub(crate) enable_stream: bool,
}

/// A change `ensure` makes, one at a time (DynamoDB takes one per `UpdateTable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Stream,
    Index,
}

/// The changes asked for, and those given up on (refused for good: no permission).
#[derive(Debug, Default)]
struct Changes {
    asked: Vec<Change>,
    given_up: Vec<Change>,
}

impl Changes {
    /// The next change `table` still needs, unless asked for already or given up on.
    fn next(&self, shape: Shape, table: &TableDescription) -> Option<Change> {
        let streaming = table
            .stream_specification()
            .is_some_and(|s| s.stream_enabled());
        let wanted = [
            (Change::Stream, shape.enable_stream && !streaming),
            (Change::Index, shape.add_index && !has_owner_index(table)),
        ];
        wanted
            .into_iter()
            .find(|(c, needed)| *needed && !self.asked.contains(c) && !self.given_up.contains(c))
            .map(|(c, _)| c)
    }
}

/// Waits until `table` is `ACTIVE` and shaped as `shape` allows, at most `wait`: creates it if
/// missing, then adds the stream and the index one at a time, waiting for `ACTIVE` between
/// them. Workers starting together race for these changes: a change refused because the table
/// is busy (another worker's) is asked again after a growing wait ([`busy_waits`]) until
/// `wait` is up, then given up with a warning; one refused for good (no permission) is given
/// up with a warning at once; either way the table is used without it. Returns the table's
/// description.
pub(crate) async fn ensure(
    client: &Client,
    table: &str,
    billing: TableBilling,
    wait: Duration,
    shape: Shape,
) -> Result<TableDescription, BackendError> {
    let deadline = Instant::now() + wait;
    let what = format!("lease table {table}");
    let mut created = false;
    let mut changes = Changes::default();
    let mut polls = polls();
    let mut busy = busy_waits();
    loop {
        match client.describe_table().table_name(table).send().await {
            Ok(out) => {
                let description = described(out.table);
                check_key_schema(table, description.key_schema())?;
                match description.table_status() {
                    Some(TableStatus::Active) => match changes.next(shape, &description) {
                        None => return Ok(description),
                        Some(change) => {
                            if !change_table(client, table, billing, change, &mut changes).await {
                                // Refused for now (busy): asked again after a growing wait,
                                // and given up at the deadline (the table used without it).
                                let busy = &mut busy;
                                wait_or_give_up(table, change, &mut changes, busy, deadline, wait)
                                    .await;
                            }
                            continue;
                        }
                    },
                    Some(TableStatus::Creating | TableStatus::Updating | TableStatus::Deleting)
                    | None => {}
                    Some(other) => {
                        let why = format!("{what} is {}, not usable", other.as_str());
                        return Err(BackendError::new(ErrorKind::Fatal, OPERATION, why));
                    }
                }
            }
            Err(e) if Cause::of(&e) != Cause::NotFound => {
                return Err(backend_error(OPERATION, &what, e));
            }
            Err(_) if !shape.create => return Err(not_to_create(&what)),
            Err(_) if !created => {
                create_table(client, table, billing).await?;
                created = true;
                continue;
            }
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(BackendError::new(
                ErrorKind::Retryable,
                OPERATION,
                format!("{what} is not ACTIVE after {wait:?}"),
            ));
        }
        let wait = polls.next().unwrap_or(MAX_POLL);
        sleep(wait.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// A change the table refused for now (busy): waits a growing while, or past `deadline`
/// gives it up with a warning (the table used without it).
async fn wait_or_give_up(
    table: &str,
    change: Change,
    changes: &mut Changes,
    busy: &mut impl Iterator<Item = Duration>,
    deadline: Instant,
    wait: Duration,
) {
    if Instant::now() >= deadline {
        tracing::warn!(
            table,
            ?change,
            "the lease table stayed busy for {wait:?}; continuing without the change"
        );
        changes.given_up.push(change);
        return;
    }
    let pause = busy.next().unwrap_or(BUSY_MAX);
    sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
}

/// A missing table the store is set not to create.
fn not_to_create(what: &str) -> BackendError {
    BackendError::new(
        ErrorKind::Fatal,
        OPERATION,
        format!(
            "{what} does not exist, and the store is set not to create it \
             (TableSetup::External): create it where the table is managed \
             (hash key `{LEASE_KEY}`, type S), or use TableSetup::Managed"
        ),
    )
}

/// Asks for one change; returns whether it is settled (asked for, or given up). Busy
/// (another worker's change under way): `false`, looked at again after a wait
/// ([`busy_waits`]). Refused for good: given up, with a warning.
async fn change_table(
    client: &Client,
    table: &str,
    billing: TableBilling,
    change: Change,
    changes: &mut Changes,
) -> bool {
    let result = match change {
        Change::Stream => enable_stream(client, table).await,
        Change::Index => add_owner_index(client, table, billing).await,
    };
    match result {
        Ok(()) => {
            let done = match change {
                Change::Stream => "enabled the lease table's stream (NEW_IMAGE)",
                Change::Index => {
                    "adding the leaseOwner index (DynamoDB builds it in the background)"
                }
            };
            tracing::info!(table, "{done}");
            changes.asked.push(change);
            true
        }
        Err(error) if error.kind().is_transient() => {
            tracing::debug!(%error, ?change, "the lease table is busy; looking again after a wait");
            false
        }
        Err(error) => {
            let feature = match change {
                Change::Stream => "enabling the lease table's stream",
                Change::Index => "adding the leaseOwner index",
            };
            tracing::warn!(%error, "{feature} failed; continuing without it");
            changes.given_up.push(change);
            true
        }
    }
}

/// Enables a `NEW_IMAGE` stream, the change feed's source (see `feed`).
async fn enable_stream(client: &Client, table: &str) -> Result<(), BackendError> {
    let spec = StreamSpecification::builder()
        .stream_enabled(true)
        .stream_view_type(StreamViewType::NewImage)
        .build()
        .map_err(|e| BackendError::new(ErrorKind::Fatal, OPERATION, e.to_string()))?;
    client
        .update_table()
        .table_name(table)
        .stream_specification(spec)
        .send()
        .await
        .map_err(|e| backend_error(OPERATION, format!("lease table {table}"), e))?;
    Ok(())
}

/// A table's description, or an empty one where an answer carried none.
fn described(table: Option<TableDescription>) -> TableDescription {
    table.unwrap_or_else(|| TableDescription::builder().build())
}

/// Whether the table has the `leaseOwner` index (built or being built).
pub(crate) fn has_owner_index(table: &TableDescription) -> bool {
    table
        .global_secondary_indexes()
        .iter()
        .any(|i| i.index_name() == Some(OWNER_INDEX))
}

/// Adds the `leaseOwner` index as KCL Java 3.x does (`leaseOwner` hash, `leaseKey` range, keys
/// only). Does not wait for it to be built: DynamoDB backfills it in the background (minutes
/// on a large table), and until then `owned_by` reads the table.
async fn add_owner_index(
    client: &Client,
    table: &str,
    billing: TableBilling,
) -> Result<(), BackendError> {
    let what = format!("lease table {table}");
    let invalid = |e: aws_sdk_dynamodb::error::BuildError| {
        BackendError::new(ErrorKind::Fatal, OPERATION, e.to_string())
    };
    let key = |name: &str, key_type: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(key_type)
            .build()
            .map_err(invalid)
    };
    let attribute = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(invalid)
    };
    let mut index = CreateGlobalSecondaryIndexAction::builder()
        .index_name(OWNER_INDEX)
        .key_schema(key(LEASE_OWNER, KeyType::Hash)?)
        .key_schema(key(LEASE_KEY, KeyType::Range)?)
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::KeysOnly)
                .build(),
        );
    if let TableBilling::Provisioned {
        read_capacity_units,
        write_capacity_units,
    } = billing
    {
        index = index.provisioned_throughput(
            ProvisionedThroughput::builder()
                .read_capacity_units(read_capacity_units)
                .write_capacity_units(write_capacity_units)
                .build()
                .map_err(invalid)?,
        );
    }
    let added = client
        .update_table()
        .table_name(table)
        .attribute_definitions(attribute(LEASE_OWNER)?)
        .attribute_definitions(attribute(LEASE_KEY)?)
        .global_secondary_index_updates(
            GlobalSecondaryIndexUpdate::builder()
                .create(index.build().map_err(invalid)?)
                .build(),
        )
        .send()
        .await;
    added
        .map(drop)
        .map_err(|e| backend_error(OPERATION, &what, e))
}

fn check_key_schema(table: &str, keys: &[KeySchemaElement]) -> Result<(), BackendError> {
    let hash = keys
        .iter()
        .find(|k| k.key_type == KeyType::Hash)
        .map(|k| k.attribute_name.as_str());
    match (hash, keys.len()) {
        (Some(LEASE_KEY), 1) | (None, 0) => Ok(()),
        _ => Err(BackendError::new(
            ErrorKind::Fatal,
            OPERATION,
            format!(
                "table {table} exists but is not a lease table: its key must be only `{LEASE_KEY}` (HASH)"
            ),
        )),
    }
}

async fn create_table(
    client: &Client,
    table: &str,
    billing: TableBilling,
) -> Result<(), BackendError> {
    let invalid = |e: aws_sdk_dynamodb::error::BuildError| {
        BackendError::new(ErrorKind::Fatal, OPERATION, e.to_string())
    };
    let mut request = client
        .create_table()
        .table_name(table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(LEASE_KEY)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(invalid)?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(LEASE_KEY)
                .key_type(KeyType::Hash)
                .build()
                .map_err(invalid)?,
        );
    request = match billing {
        TableBilling::OnDemand => request.billing_mode(BillingMode::PayPerRequest),
        TableBilling::Provisioned {
            read_capacity_units,
            write_capacity_units,
        } => request
            .billing_mode(BillingMode::Provisioned)
            .provisioned_throughput(
                ProvisionedThroughput::builder()
                    .read_capacity_units(read_capacity_units)
                    .write_capacity_units(write_capacity_units)
                    .build()
                    .map_err(invalid)?,
            ),
    };
    tracing::info!(table, ?billing, "creating the lease table");
    match request.send().await {
        Ok(_) => Ok(()),
        Err(e) => {
            // Another worker creating it at the same moment is fine: wait for it.
            if aws_sdk_dynamodb::error::ProvideErrorMetadata::code(&e)
                == Some("ResourceInUseException")
            {
                Ok(())
            } else {
                Err(backend_error(OPERATION, format!("lease table {table}"), e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_seen_active_at_most_a_fifth_of_its_creation_time_late_plus_the_first_wait() {
        // When each look happens, counted from the first one (right after CreateTable).
        let looks: Vec<Duration> = polls()
            .take(100)
            .scan(Duration::ZERO, |at, wait| {
                *at += wait;
                Some(*at)
            })
            .collect();
        for ms in 1..=10_000 {
            let active = Duration::from_millis(ms);
            let seen = looks.iter().find(|&&at| at >= active).copied();
            let late = seen.map(|at| at - active);
            let bound = (active.mul_f64(GROWTH - 1.0) + FIRST_POLL).min(MAX_POLL);
            assert!(
                late.is_some_and(|late| late <= bound),
                "ACTIVE after {active:?}, seen {late:?} later"
            );
        }
        let waits: Vec<Duration> = polls().take(30).collect();
        assert_eq!(waits[0], FIRST_POLL);
        assert_eq!(waits[29], MAX_POLL, "{waits:?}");
    }
}
