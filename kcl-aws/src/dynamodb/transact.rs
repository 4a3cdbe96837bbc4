//! [`Transact`] on DynamoDB: a processor's writes and its checkpoint in one
//! `TransactWriteItems`, fenced by the lease row.
//!
//! Why it is written the way it is (the protocol is `kcl_core::outputs`'):
//! - **The lease row's update is one more action of the transaction**, the last one, so that
//!   a cancellation reason's index is the index of the processor's write it names. It writes
//!   the checkpoint as a plain checkpoint does but leaves `leaseCounter` alone, and its
//!   condition is the owner, the fence (`kclFence`) and the checkpoint the row held before:
//!   never the counter, which the renewer bumps every third of the failover time.
//! - **The idempotency token is DynamoDB's `ClientRequestToken`**: a retry of a commit whose
//!   answer was lost returns success without applying twice (for 10 minutes); after that,
//!   or where the token is not kept (moto), the checkpoint condition refuses the retry and
//!   the core reads the row to learn that it applied.
//! - **The lease table is kcl's**: a write to it is refused before anything is sent.
//! - **Two actions on one item are refused by DynamoDB**, so [`Transact::measure`] names the
//!   item each write touches and the core splits such writes into different transactions.
//!   A `Put` carries its whole item and not which attributes are the key: the store knows a
//!   table's key once told ([`DynamoDbLeaseStore::with_output_table`]) or once it read the
//!   table's description ([`DynamoDbLeaseStore::describe_output_tables`]); a `Put` to a
//!   table it knows nothing of names no item.
//! - **A cancelled transaction is read off its cancellation reasons** in one place
//!   ([`Verdict`]): the lease row's failed condition is the lease moved (or the commit applied
//!   earlier), a write's failed condition is that write refused, a write's `ValidationError`
//!   is that write invalid, a conflict with another write in progress is retried, as is
//!   throttling. A request refused whole with a `ValidationException` (an item over 400 KB, a
//!   malformed key or number, two actions on one item) is invalid without a write named: the
//!   core commits its records one at a time to find the one at fault. A table missing, a
//!   token reused, access denied are not the writes' fault: an outage, failed as the store's
//!   error, never a record given up. The other side of a conflict, a
//!   renewal's `UpdateItem` refused with `TransactionConflictException` while another
//!   process's transaction holds the row, is `Retryable` as every such error is (`error`):
//!   the renewer keeps the lease while it is valid and tries again a quarter interval later.
//! - **What it costs**: DynamoDB charges a transactional write two write units per KB of
//!   each item, the lease row's included: a commit of `n` writes of items under 1 KB is
//!   `2 (n + 1)` units, against `n + 1` for the same writes and a checkpoint outside a
//!   transaction. The units DynamoDB reports are counted as `Operation::CommitOutputs`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError, RwLock};

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::{
    TransactWriteItemsError, TransactWriteItemsOutput,
};
use aws_sdk_dynamodb::types::{
    AttributeValue, CancellationReason, ReturnConsumedCapacity, TransactWriteItem, Update,
};
use kcl_core::lease::usage::Operation;
use kcl_core::outputs::{Commit, CommitError, Limits, Measure, Transact};
use kcl_core::{BackendError, ErrorKind};

use super::DynamoDbLeaseStore;
use super::expr::Expr;
use super::item::{Carried, action, canonical, item_size, value_size};
use super::schema::{self, FENCE, LEASE_OWNER};
use crate::error::backend_error;

/// Actions in one `TransactWriteItems`.
const ACTIONS: usize = 100;
/// The aggregate size of the items of one transaction, read conservatively as decimal
/// megabytes (4 MB).
const TRANSACTION_BYTES: usize = 4_000_000;
/// Room left for the lease row: the largest item DynamoDB stores (400 KB). Whatever the row
/// holds (parked keys, children, kcl's own attributes), DynamoDB refuses to make it larger,
/// so the processor's writes can never push the transaction over its limit through it.
const LEASE_ROW_ROOM: usize = 400 * 1024;
/// The operation named in errors and usage.
const OPERATION: &str = "commit_outputs";
/// What DynamoDB says of a transaction with two actions on one item.
const ONE_ITEM_TWICE: &str = "multiple operations on one item";

/// The key attributes of the tables the processor writes, for naming the item of a `Put`.
#[derive(Debug, Default)]
pub(super) struct OutputKeys {
    known: RwLock<HashMap<String, Vec<String>>>,
    /// Tables whose key could not be read, and when.
    failed: Mutex<HashMap<String, std::time::Instant>>,
}

/// How long a table whose key could not be read is left unknown before it is read again (a
/// throttled or failed `DescribeTable` is not for good; a missing permission is said again
/// at this pace).
const DESCRIBE_AGAIN: std::time::Duration = std::time::Duration::from_secs(60);

impl OutputKeys {
    fn insert(&self, table: String, key: Vec<String>) {
        let mut known = self.known.write().unwrap_or_else(PoisonError::into_inner);
        known.insert(table, key);
    }

    /// Whether the key of `table` is known, or could not be read lately.
    fn tried(&self, table: &str) -> bool {
        let known = self.known.read().unwrap_or_else(PoisonError::into_inner);
        known.contains_key(table)
            || self
                .failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(table)
                .is_some_and(|at| at.elapsed() < DESCRIBE_AGAIN)
    }

    /// `table`'s key could not be read: not tried again for a while.
    fn failed(&self, table: &str) {
        let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        failed.insert(table.to_owned(), std::time::Instant::now());
    }

    fn of(&self, table: &str) -> Option<Vec<String>> {
        let known = self.known.read().unwrap_or_else(PoisonError::into_inner);
        known.get(table).cloned()
    }
}

impl DynamoDbLeaseStore {
    /// Tells the store the key attributes of `table` (its partition key, and its sort key if
    /// it has one), a table [`Transact::commit`] writes to: two `Put`s of one item then go
    /// into different transactions (DynamoDB refuses two actions on one item in one).
    /// `Update`, `Delete` and `ConditionCheck` name their key themselves.
    #[must_use]
    pub fn with_output_table(self, table: impl Into<String>, key: &[&str]) -> Self {
        let key = key.iter().map(|k| (*k).to_owned()).collect();
        self.outputs.insert(table.into(), key);
        self
    }

    /// Reads the key attributes of `tables` (`DescribeTable`, which the worker's role then
    /// needs on them), as [`with_output_table`](Self::with_output_table) sets them.
    ///
    /// # Errors
    /// The first table that cannot be described (missing, access denied, unreachable).
    pub async fn describe_output_tables(
        &self,
        tables: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<(), BackendError> {
        for table in tables {
            let table = table.as_ref();
            let out = self
                .client
                .describe_table()
                .table_name(table)
                .send()
                .await
                .map_err(|e| backend_error("describe_table", format!("table {table}"), e))?;
            let key = out
                .table()
                .map(|t| t.key_schema().iter().map(|k| k.attribute_name().to_owned()))
                .into_iter()
                .flatten()
                .collect();
            self.outputs.insert(table.to_owned(), key);
        }
        Ok(())
    }

    /// Reads the key of every table a `Put` of `writes` writes that the store does not know
    /// yet ([`describe_output_tables`](Self::describe_output_tables)), so that two `Put`s of
    /// one item go into different transactions without the application saying anything. A
    /// table that cannot be described is said at WARN and left unknown for a minute, then
    /// read again: meanwhile its `Put`s name no item, and two of one item in one transaction
    /// fail, naming the remedy.
    async fn learn_put_keys(&self, writes: &[&TransactWriteItem]) {
        let unknown: BTreeSet<&str> = writes
            .iter()
            .filter_map(|w| w.put().map(|put| put.table_name()))
            .filter(|table| !self.outputs.tried(table))
            .collect();
        for table in unknown {
            if let Err(error) = self.describe_output_tables([table]).await {
                tracing::warn!(
                    table,
                    error = %kcl_core::error_chain(&error),
                    "cannot read the key of an output table (DescribeTable): two Puts of one \
                     item in one transaction will fail; allow DescribeTable on it, or name its \
                     key with DynamoDbLeaseStore::with_output_table"
                );
                self.outputs.failed(table);
            }
        }
    }

    /// Whether `table` (a name or an ARN) is the lease table.
    fn is_lease_table(&self, table: &str) -> bool {
        table == self.table
            || table
                .rsplit_once(":table/")
                .is_some_and(|(_, name)| name == self.table)
    }

    /// Refuses, before anything is sent, a write without an action and a write to the lease
    /// table (its rows are kcl's): invalid, naming the write, so that its record fails
    /// rather than the commit for ever.
    fn check_writes(&self, writes: &[TransactWriteItem]) -> Result<(), CommitError> {
        for (index, write) in writes.iter().enumerate() {
            let fatal = |reason: String| CommitError::Invalid {
                index: Some(index),
                reason,
            };
            match action(write) {
                None => {
                    return Err(fatal(format!(
                        "output write {index} has no action (one of Put, Update, Delete, ConditionCheck)"
                    )));
                }
                Some((table, _)) if self.is_lease_table(table) => {
                    return Err(fatal(format!(
                        "output write {index} writes table {table}, the lease table: its rows are \
                     kcl's; write the outputs to a table of their own"
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The lease row's action: `commit.update` written without moving the counter, if the
    /// row still holds this tenure's owner, fence and checkpoint.
    fn lease_row(
        commit: &Commit<'_, TransactWriteItem>,
        table: &str,
    ) -> Result<TransactWriteItem, CommitError> {
        let mut e = Expr::default();
        e.checkpoint_uncounted(commit.shard, commit.update);
        let owner = e.name(LEASE_OWNER);
        let fence = e.name(FENCE);
        let at = e.checkpoint_is(commit.before);
        let condition = format!("{owner} = :owner AND {fence} = :fence AND {at}");
        let values = [
            (
                ":owner",
                AttributeValue::S(commit.owner.as_str().to_owned()),
            ),
            (":fence", schema::number(commit.fence.0)),
        ];
        for (placeholder, value) in values {
            e.values.insert(placeholder.to_owned(), value);
        }
        let update = Update::builder()
            .table_name(table)
            .key(
                schema::LEASE_KEY,
                AttributeValue::S(commit.shard.as_str().to_owned()),
            )
            .update_expression(e.update_expression())
            .condition_expression(condition)
            .set_expression_attribute_names(Some(e.names))
            .set_expression_attribute_values(Some(e.values))
            .build()
            .map_err(|error| {
                CommitError::Store(BackendError::new(
                    ErrorKind::Fatal,
                    OPERATION,
                    format!(
                        "the update of lease {} cannot be built: {error}",
                        commit.shard
                    ),
                ))
            })?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Counts one `TransactWriteItems` that reached DynamoDB, with the write units it
    /// reported (one entry per table).
    fn count_commit<R>(
        &self,
        result: &Result<TransactWriteItemsOutput, SdkError<TransactWriteItemsError, R>>,
    ) {
        let units = match result {
            Ok(out) => out
                .consumed_capacity()
                .iter()
                .map(|c| c.write_capacity_units.or(c.capacity_units).unwrap_or(0.0))
                .sum(),
            Err(SdkError::ServiceError(_)) => 0.0,
            Err(_) => return,
        };
        self.usage.record(Operation::CommitOutputs, 0.0, units);
    }
}

impl Transact for DynamoDbLeaseStore {
    type Write = TransactWriteItem;

    async fn prepare(&self, writes: &[&TransactWriteItem]) {
        self.learn_put_keys(writes).await;
    }

    /// 99 writes (100 actions less the lease row's) and 4 MB less 400 KB (the lease row's
    /// room: no item is larger) of items as [`measure`](Self::measure) counts them.
    fn limits(&self) -> Limits {
        Limits {
            writes: ACTIONS - 1,
            bytes: TRANSACTION_BYTES - LEASE_ROW_ROOM,
        }
    }

    /// The size DynamoDB counts for the item a write carries (attribute names and values): a
    /// `Put`'s item; an `Update`'s key, the values it sets and the names it uses (the item
    /// after it may be larger); a `Delete`'s or `ConditionCheck`'s key. The item is the
    /// table and the key's attributes, rendered canonically.
    fn measure(&self, write: &TransactWriteItem) -> Measure {
        let Some((table, carried)) = action(write) else {
            return Measure {
                bytes: 0,
                item: None,
            };
        };
        let bytes = match carried {
            Carried::Put(item) => item_size(item),
            Carried::Update(update) => {
                let names = update.expression_attribute_names().into_iter().flatten();
                let values = update.expression_attribute_values().into_iter().flatten();
                item_size(update.key())
                    + names.map(|(_, name)| name.len()).sum::<usize>()
                    + values.map(|(_, value)| value_size(value)).sum::<usize>()
            }
            Carried::Key(key) => item_size(key),
        };
        let item = match carried {
            Carried::Put(item) => self.outputs.of(table).map(|key| {
                let key: HashMap<&String, &AttributeValue> =
                    item.iter().filter(|(name, _)| key.contains(name)).collect();
                canonical(table, key)
            }),
            Carried::Update(update) => Some(canonical(table, update.key().iter().collect())),
            Carried::Key(key) => Some(canonical(table, key.iter().collect())),
        };
        Measure { bytes, item }
    }

    async fn commit(&self, commit: Commit<'_, TransactWriteItem>) -> Result<(), CommitError> {
        self.check_writes(&commit.writes)?;
        let lease_row = Self::lease_row(&commit, &self.table)?;
        let writes = commit.writes.len();
        let mut actions = commit.writes;
        actions.push(lease_row);
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(actions))
            .client_request_token(commit.token.as_str())
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        self.count_commit(&result);
        let what = format!(
            "{writes} output writes with the checkpoint of lease {} in table {}",
            commit.shard, self.table
        );
        match result {
            Ok(_) => Ok(()),
            Err(error) => Err(Verdict::of(error, writes, &commit.token, &what).into_error(&what)),
        }
    }
}

/// What a failed `TransactWriteItems` means for the commit. Every failure is reduced to one
/// of these, and [`into_error`](Self::into_error) maps them with one exhaustive `match`.
#[derive(Debug)]
enum Verdict {
    /// The lease row's condition failed: the lease moved, or an earlier attempt applied.
    LeaseRow,
    /// Output write `index`'s own condition failed; nothing applied.
    Refused { index: usize, reason: String },
    /// DynamoDB refuses the writes as invalid (write `index`, if a cancellation reason named
    /// one; a request's `ValidationException` names none): nothing applied, and the same
    /// writes never can.
    Invalid {
        index: Option<usize>,
        reason: String,
    },
    /// Another write to one of the items was in progress (`TransactionConflict`, on the
    /// lease row a renewal of another process or an operator's write): retried.
    Conflict(String),
    /// Capacity (`ProvisionedThroughputExceeded`, `ThrottlingError`): retried, slower.
    Throttled(String),
    /// Retrying the same request cannot help, and no write of the processor's is at fault: a
    /// table missing, a token reused for another request, the lease row's update invalid, a
    /// cancellation reason this code does not know.
    Fatal(String),
    /// Not a cancellation: the error as every other call of the store maps it.
    Other(BackendError),
}

/// One cancellation reason, most decisive last (see [`Verdict::cancelled`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Reason {
    /// `None`: this action was fine; another one cancelled the transaction.
    Passed,
    Conflict,
    Throttled,
    ConditionFailed,
    /// `ValidationError`: this action is invalid.
    Invalid,
    /// Nothing a retry or a record's give-up fixes (`ItemCollectionSizeLimitExceeded`, a code
    /// newer than this code).
    Fatal,
}

impl Reason {
    fn from_code(code: Option<&str>) -> Self {
        match code {
            None | Some("None") => Self::Passed,
            Some("TransactionConflict") => Self::Conflict,
            Some("ProvisionedThroughputExceeded" | "ThrottlingError" | "RequestLimitExceeded") => {
                Self::Throttled
            }
            Some("ConditionalCheckFailed") => Self::ConditionFailed,
            Some("ValidationError") => Self::Invalid,
            // `ItemCollectionSizeLimitExceeded` (a table's limit, not a record's fault), and
            // codes newer than this code: nothing says a retry could pass.
            Some(_) => Self::Fatal,
        }
    }
}

impl Verdict {
    fn of(
        error: SdkError<TransactWriteItemsError, aws_sdk_dynamodb::config::http::HttpResponse>,
        writes: usize,
        token: &str,
        what: &str,
    ) -> Self {
        match error.as_service_error() {
            Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) => {
                Self::cancelled(cancelled.cancellation_reasons(), writes)
            }
            // An earlier attempt with this token is still being applied (one that timed out
            // here): retried, as DynamoDB asks, until it has landed or not.
            Some(TransactWriteItemsError::TransactionInProgressException(e)) => {
                Self::Conflict(format!(
                    "an earlier attempt of this commit is still in progress ({})",
                    e.message().unwrap_or("TransactionInProgressException")
                ))
            }
            // An outage (a table deleted, a wrong name in a deploy), never a record at fault.
            Some(TransactWriteItemsError::ResourceNotFoundException(e)) => Self::Fatal(format!(
                "a table written does not exist, the lease table or an output table ({})",
                e.message().unwrap_or("ResourceNotFoundException")
            )),
            Some(TransactWriteItemsError::IdempotentParameterMismatchException(e)) => {
                Self::Fatal(format!(
                    "idempotency token {token} was used within 10 minutes by a transaction with \
                     other writes ({}): a commit's writes must be the same at every attempt",
                    e.message()
                        .unwrap_or("IdempotentParameterMismatchException")
                ))
            }
            // The request refused whole: an item over 400 KB, a malformed key or number, two
            // actions on one item (a `Put` to a table whose key the store does not know).
            _ if error.code() == Some("ValidationException")
                || error.message().is_some_and(|m| m.contains(ONE_ITEM_TWICE)) =>
            {
                let detail = error.message().unwrap_or("(no message)");
                Self::Invalid {
                    index: None,
                    reason: format!("ValidationException: {detail}"),
                }
            }
            _ => Self::Other(backend_error(OPERATION, what, error)),
        }
    }

    /// Reads the reasons of a cancelled transaction of `writes` output writes and the lease
    /// row (the last action). The lease row's failed condition wins over everything (the
    /// tenure is over, whatever else was wrong); then a reason no retry can fix (one that is
    /// no write's fault first, then the first invalid write); then the first write refused
    /// by its condition; then throttling; then a conflict.
    fn cancelled(reasons: &[CancellationReason], writes: usize) -> Self {
        let read = |i: usize| {
            reasons
                .get(i)
                .map_or(Reason::Passed, |r| Reason::from_code(r.code()))
        };
        if read(writes) == Reason::ConditionFailed {
            return Self::LeaseRow;
        }
        let message = |i: usize| {
            let reason = reasons.get(i);
            let code = reason.and_then(CancellationReason::code).unwrap_or("None");
            let message = reason.and_then(CancellationReason::message).unwrap_or("");
            let action = if i == writes {
                "the lease row".to_owned()
            } else {
                format!("output write {i}")
            };
            format!("{action}: {code} {message}").trim_end().to_owned()
        };
        let worst = (0..=writes).max_by_key(|&i| (read(i), std::cmp::Reverse(i)));
        match worst.map(|i| (i, read(i))) {
            Some((i, Reason::Fatal)) => {
                Self::Fatal(format!("transaction cancelled: {}", message(i)))
            }
            // The lease row's update invalid: no write of the processor's is at fault.
            Some((i, Reason::Invalid)) if i == writes => {
                Self::Fatal(format!("transaction cancelled: {}", message(i)))
            }
            Some((index, Reason::Invalid)) => Self::Invalid {
                index: Some(index),
                reason: format!("transaction cancelled: {}", message(index)),
            },
            Some((index, Reason::ConditionFailed)) => Self::Refused {
                index,
                reason: message(index),
            },
            Some((i, Reason::Throttled)) => Self::Throttled(message(i)),
            Some((i, Reason::Conflict)) => Self::Conflict(message(i)),
            Some((_, Reason::Passed)) | None => {
                Self::Conflict("transaction cancelled without a reason".to_owned())
            }
        }
    }

    /// The commit's error. The one exhaustive match of the module.
    fn into_error(self, what: &str) -> CommitError {
        let store = |kind, message: String| {
            CommitError::Store(BackendError::new(
                kind,
                OPERATION,
                format!("{what}: {message}"),
            ))
        };
        match self {
            Self::LeaseRow => CommitError::LeaseRow,
            Self::Refused { index, reason } => CommitError::Refused { index, reason },
            Self::Invalid { index, reason } => CommitError::Invalid {
                index,
                reason: hinted(reason),
            },
            Self::Conflict(message) => store(ErrorKind::Retryable, message),
            Self::Throttled(message) => store(ErrorKind::Throttled, message),
            Self::Fatal(message) => store(ErrorKind::Fatal, message),
            Self::Other(error) => CommitError::Store(error),
        }
    }
}

/// Says what to do about two actions on one item, the refusal a processor most likely
/// meets (its `Put`s to a table whose key the store was not told).
fn hinted(message: String) -> String {
    if message.contains(ONE_ITEM_TWICE) {
        format!(
            "{message} (two writes of one item in one transaction: tell the store the key of \
             the tables written with Put (`DynamoDbLeaseStore::with_output_table` or \
             `describe_output_tables`), so that they go into different transactions)"
        )
    } else {
        message
    }
}

#[cfg(test)]
mod tests;
