//! [`DynamoDbLeaseStore`]: the lease table in DynamoDB, compatible with KCL Java's.
//!
//! Why it is written the way it is:
//! - **Every write is conditional** on what the writer observed (counter, and owner or its
//!   absence), so two workers can never both believe they hold a lease; a failed condition is
//!   [`kcl_core::ErrorKind::Conflict`], which the core reads as "lost the
//!   race" (for a checkpoint: `LeaseLost`).
//! - **Writes touch only our attributes.** Everything but `create` is an `UpdateItem` with
//!   `SET`/`REMOVE` of named attributes, so attributes written by KCL Java (`throughputKBps`,
//!   …) or by other tools survive, with their types. `create` is a `PutItem` guarded by
//!   `attribute_not_exists(leaseKey)`, so it never overwrites a row.
//! - **Reads that decide ownership are consistent** (`Scan` and `GetItem` with
//!   `ConsistentRead`), and the scan follows `LastEvaluatedKey` to the end.
//! - **A row we cannot parse is skipped**, with a warning naming its key, so one bad row does
//!   not stop a fleet.
//! - **The table gets what the coordination uses of it** ([`LeaseStore::ensure_table`]): under
//!   `Coordination::Leader` the `leaseOwner` index and a stream, added to a table that lacks
//!   them unless [`TableSetup::External`] says the table is managed elsewhere. Neither is
//!   needed for correctness: without the index, `owned_by` reads the table (see `index`);
//!   without the stream, observers read the table every interval.
//! - **Every request is counted** ([`kcl_core::lease::usage`]): each asks for
//!   `ReturnConsumedCapacity=TOTAL`, and the units DynamoDB reports are recorded with the
//!   request. A write refused by its condition is counted without units: DynamoDB charges it
//!   but does not report it.
//!
//! The schema (names, conditions, conversions) is in `schema`; table creation in `table`.

mod expr;
mod extras;
mod feed;
mod index;
mod item;
mod schema;
mod table;
mod transact;
mod unreadable;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConsumedCapacity, ReturnConsumedCapacity, ReturnValue,
};
use kcl_core::lease::usage::{Operation, Usage};
use kcl_core::{
    BackendError, CheckpointUpdate, ErrorKind, Lease, LeaseStore, ShardId, TableFeatures, WorkerId,
};

use self::expr::Expr;
use self::schema::{
    CHECKPOINT_OWNER, COND_ABSENT, COND_COUNTER, COND_OWNER, HANDOFF_TO, LEASE_COUNTER, LEASE_KEY,
    LEASE_OWNER, OWNER_SWITCHES_SINCE_CHECKPOINT, VAL_COUNTER, VAL_OWNER,
};
use crate::error::backend_error;
pub use crate::settings::{TableBilling, TableSetup};

/// A [`LeaseStore`] on a DynamoDB table named after the application. See the module docs.
#[derive(Debug, Clone)]
pub struct DynamoDbLeaseStore {
    client: Client,
    table: String,
    billing: TableBilling,
    table_wait: Duration,
    setup: TableSetup,
    usage: Usage,
    index: Arc<index::OwnerIndex>,
    /// The table's stream, read as the change feed; `None` without a DynamoDB Streams client.
    feed: Option<Arc<feed::StreamFeed>>,
    /// Rows the last whole read (and the feed since) could not parse.
    unreadable: Arc<unreadable::Unreadable>,
    /// The keys of the tables processors commit outputs to (see `transact`).
    outputs: Arc<transact::OutputKeys>,
}

impl DynamoDbLeaseStore {
    /// A store on `table_name` (KCL Java: the application name), with the credentials,
    /// region, endpoints (`AWS_ENDPOINT_URL_DYNAMODB`, `AWS_ENDPOINT_URL_DYNAMODB_STREAMS`),
    /// retry and timeout settings of `config`, and an attempt timeout of 3 s and an operation
    /// timeout of 10 s where `config` sets none.
    ///
    /// The table gets what the worker's coordination uses of it, the default
    /// `Coordination::Leader` an owner index and a stream ([`TableSetup::Managed`]; see
    /// [`with_table_setup`](Self::with_table_setup) for tables managed elsewhere).
    pub fn new(config: &SdkConfig, table_name: impl Into<String>) -> Self {
        let timeouts = crate::timeouts::with_defaults(config, crate::timeouts::DYNAMODB);
        let conf = aws_sdk_dynamodb::config::Builder::from(config)
            .timeout_config(timeouts.clone())
            .build();
        let streams = aws_sdk_dynamodbstreams::config::Builder::from(config)
            .timeout_config(timeouts)
            .build();
        Self::from_client(Client::from_conf(conf), table_name)
            .with_change_feed_client(aws_sdk_dynamodbstreams::Client::from_conf(streams))
    }

    /// A store using an already built client (custom configuration, tests). It has no change
    /// feed until [`with_change_feed_client`](Self::with_change_feed_client) gives it a
    /// DynamoDB Streams client; the owner index it adds and uses as [`new`](Self::new) does.
    pub fn from_client(client: Client, table_name: impl Into<String>) -> Self {
        Self {
            client,
            table: table_name.into(),
            billing: TableBilling::default(),
            table_wait: Duration::from_secs(300),
            setup: TableSetup::default(),
            usage: Usage::default(),
            index: Arc::default(),
            feed: None,
            unreadable: Arc::default(),
            outputs: Arc::default(),
        }
    }

    /// Serves [`LeaseStoreExtras::changes`](kcl_core::LeaseStoreExtras::changes) from the table's DynamoDB stream, read with `client`
    /// ([`new`](Self::new) makes one from its `SdkConfig`). Under `Coordination::Leader` the
    /// leader and the standby then follow the table through the stream instead of reading it
    /// every interval (see the `feed` module docs).
    #[must_use]
    pub fn with_change_feed_client(mut self, client: aws_sdk_dynamodbstreams::Client) -> Self {
        let unreadable = self.unreadable.clone();
        self.feed = Some(Arc::new(feed::StreamFeed::new(
            client,
            &self.table,
            unreadable,
        )));
        self
    }

    /// Sets who looks after the table's shape (default [`TableSetup::Managed`]).
    #[must_use]
    pub fn with_table_setup(mut self, setup: TableSetup) -> Self {
        self.setup = setup;
        self
    }

    /// Sets how a table created by this store is billed (default on-demand).
    #[must_use]
    pub fn with_billing(mut self, billing: TableBilling) -> Self {
        self.billing = billing;
        self
    }

    /// Sets how long [`LeaseStore::ensure_table`] waits for the table to become `ACTIVE`
    /// before it reports a retryable error (default 5 minutes).
    #[must_use]
    pub fn with_table_wait(mut self, wait: Duration) -> Self {
        self.table_wait = wait;
        self
    }

    /// The table name.
    pub fn table_name(&self) -> &str {
        &self.table
    }

    /// The DynamoDB client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn key(&self, key: &ShardId) -> (String, AttributeValue) {
        (
            LEASE_KEY.to_owned(),
            AttributeValue::S(key.as_str().to_owned()),
        )
    }

    /// The keys of `owner`'s leases from the owner index (eventually consistent).
    async fn query_owner_index(&self, owner: &WorkerId) -> Result<Vec<ShardId>, BackendError> {
        let mut keys = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let result = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(schema::OWNER_INDEX)
                .key_condition_expression(COND_OWNER)
                .expression_attribute_names(schema::placeholder(LEASE_OWNER), LEASE_OWNER)
                .expression_attribute_values(
                    VAL_OWNER,
                    AttributeValue::S(owner.as_str().to_owned()),
                )
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await;
            self.count(Operation::OwnedBy, &result, |o| {
                (o.consumed_capacity(), o.count())
            });
            let what = format!("index {} of table {}", schema::OWNER_INDEX, self.table);
            let out = result.map_err(|e| backend_error("owned_by", what, e))?;
            keys.extend(out.items().iter().filter_map(|item| {
                item.get(LEASE_KEY)
                    .and_then(|v| v.as_s().ok())
                    .map(|k| ShardId::new(k.clone()))
            }));
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => return Ok(keys),
            }
        }
    }

    /// Counts a request that reached DynamoDB (an answer, or an error DynamoDB returned) with
    /// the capacity it reported.
    fn count<T, E, R>(
        &self,
        operation: Operation,
        result: &Result<T, SdkError<E, R>>,
        capacity: impl FnOnce(&T) -> (Option<&ConsumedCapacity>, i32),
    ) {
        let (reported, rows) = match result {
            Ok(out) => capacity(out),
            Err(SdkError::ServiceError(_)) => (None, 0),
            Err(_) => return,
        };
        let rows = u64::try_from(rows).unwrap_or(0);
        let units = reported.map_or(0.0, |c| {
            let split = if operation.is_read() {
                c.read_capacity_units
            } else {
                c.write_capacity_units
            };
            split.or(c.capacity_units).unwrap_or(0.0)
        });
        if operation.is_read() {
            self.usage.record_read(operation, rows, units, 0.0);
        } else {
            self.usage.record(operation, 0.0, units);
        }
    }

    /// One conditional `UpdateItem` returning the row as stored after the write.
    async fn update(
        &self,
        operation: Operation,
        key: &ShardId,
        expr: Expr,
    ) -> Result<Lease, BackendError> {
        let operation_name = operation.as_str();
        let (k, v) = self.key(key);
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(k, v)
            .update_expression(expr.update_expression())
            .condition_expression(expr.condition)
            .set_expression_attribute_names(Some(expr.names))
            .set_expression_attribute_values(Some(expr.values))
            .return_values(ReturnValue::AllNew)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        self.count(operation, &result, |o| (o.consumed_capacity(), 0));
        let out = result.map_err(|e| backend_error(operation_name, self.what(key), e))?;
        let Some(item) = out.attributes else {
            return Err(BackendError::new(
                ErrorKind::Retryable,
                operation_name,
                format!("{}: the answer carried no attributes", self.what(key)),
            ));
        };
        schema::from_item(&item).map_err(|e| {
            BackendError::new(
                ErrorKind::Fatal,
                operation_name,
                format!(
                    "{}: the row written cannot be read back: {e}",
                    self.what(key)
                ),
            )
        })
    }

    /// Every row: a consistent Scan for `List`, an eventually consistent one (half the units)
    /// for `Snapshot`.
    async fn scan(&self, operation: Operation) -> Result<Vec<Lease>, BackendError> {
        let mut leases = Vec::new();
        let mut unreadable = std::collections::BTreeMap::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let result = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(operation == Operation::List)
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await;
            self.count(operation, &result, |o| (o.consumed_capacity(), o.count()));
            let what = format!("table {}", self.table);
            let out = result.map_err(|e| backend_error(operation.as_str(), what, e))?;
            let rows = out.items.iter().flatten();
            for item in rows.filter(|item| !schema::is_foreign_entity(item)) {
                match schema::from_item(item) {
                    Ok(lease) => leases.push(lease),
                    Err(error) => {
                        let key = schema::key_of(item);
                        tracing::debug!(table = %self.table, lease_key = key.unwrap_or("<none>"), %error, "lease row cannot be parsed; skipped");
                        unreadable.insert(key.map(str::to_owned), error.to_string());
                    }
                }
            }
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        leases.sort_by(|a, b| a.key.cmp(&b.key));
        self.unreadable.replace(unreadable);
        if let Some(feed) = &self.feed {
            feed.table_read(leases.iter().map(kcl_core::lease::usage::item_size).sum());
        }
        Ok(leases)
    }

    /// One row: consistently for `get`, eventually (half a unit) for `peek`.
    async fn get_item(
        &self,
        key: &ShardId,
        consistent: bool,
    ) -> Result<Option<Lease>, BackendError> {
        let (k, v) = self.key(key);
        let result = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(k, v)
            .consistent_read(consistent)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        let operation = if consistent {
            Operation::Get
        } else {
            Operation::Peek
        };
        self.count(operation, &result, |o| {
            (o.consumed_capacity(), i32::from(o.item.is_some()))
        });
        let out = result.map_err(|e| backend_error(operation.as_str(), self.what(key), e))?;
        let lease = out.item.as_ref().filter(|i| !schema::is_foreign_entity(i));
        let parsed = lease.map(schema::from_item);
        Ok(parsed.and_then(|lease| {
            lease
                .inspect_err(|error| tracing::debug!(table = %self.table, %key, %error, "lease row cannot be parsed"))
                .ok()
        }))
    }

    fn what(&self, key: &ShardId) -> String {
        format!("lease {key} in table {}", self.table)
    }
}

impl LeaseStore for DynamoDbLeaseStore {
    /// The index costs a write only when a lease changes owner, not on renewals or
    /// checkpoints; the stream is free to have, and its reads are billed per request.
    async fn ensure_table(&self, wanted: TableFeatures) -> Result<TableFeatures, BackendError> {
        let manage = self.setup == TableSetup::Managed;
        if wanted.change_feed && self.feed.is_none() {
            tracing::info!(
                table = %self.table,
                "no change feed: the store was built from a DynamoDB client alone \
                 (`with_change_feed_client` gives it a DynamoDB Streams client)"
            );
        }
        let shape = table::Shape {
            create: manage,
            add_index: manage && wanted.owner_index,
            enable_stream: manage && wanted.change_feed && self.feed.is_some(),
        };
        let found = table::ensure(
            &self.client,
            &self.table,
            self.billing,
            self.table_wait,
            shape,
        );
        let found = found.await?;
        let feed = wanted.change_feed && self.feed.as_ref().is_some_and(|f| f.adopt(&found));
        let index = wanted.owner_index && table::has_owner_index(&found);
        if wanted.owner_index {
            self.index.found(index);
        }
        Ok(TableFeatures::NONE
            .with_owner_index(index)
            .with_change_feed(feed))
    }

    async fn owned_by(&self, owner: &WorkerId) -> Result<Vec<ShardId>, BackendError> {
        if self.index.worth_querying() {
            match self.query_owner_index(owner).await {
                Ok(keys) => {
                    self.index.worked(&self.table);
                    return Ok(keys);
                }
                Err(error) if index::OwnerIndex::falls_back_on(&error) => {
                    self.index.failed(&self.table, &error);
                }
                Err(error) => return Err(error),
            }
        }
        Ok(kcl_core::lease::keys_owned_by(
            self.snapshot().await?,
            owner,
        ))
    }

    async fn list(&self) -> Result<Vec<Lease>, BackendError> {
        self.scan(Operation::List).await
    }

    async fn snapshot(&self) -> Result<Vec<Lease>, BackendError> {
        self.scan(Operation::Snapshot).await
    }

    async fn get(&self, key: &ShardId) -> Result<Option<Lease>, BackendError> {
        self.get_item(key, true).await
    }

    async fn peek(&self, key: &ShardId) -> Result<Option<Lease>, BackendError> {
        self.get_item(key, false).await
    }

    async fn create(&self, lease: &Lease) -> Result<bool, BackendError> {
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(schema::to_item(lease)))
            .condition_expression(COND_ABSENT)
            .expression_attribute_names(schema::placeholder(LEASE_KEY), LEASE_KEY)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        self.count(Operation::Create, &result, |o| (o.consumed_capacity(), 0));
        match result {
            Ok(_) => Ok(true),
            Err(e) => {
                let error = backend_error("create", self.what(&lease.key), e);
                if error.kind() == ErrorKind::Conflict {
                    Ok(false)
                } else {
                    Err(error)
                }
            }
        }
    }

    async fn renew(&self, held: &Lease) -> Result<Lease, BackendError> {
        let mut e = Expr::held(held);
        e.set(LEASE_COUNTER, schema::number(held.counter + 1));
        e.load(held.load);
        self.update(Operation::Renew, &held.key, e).await
    }

    async fn take(&self, observed: &Lease, new_owner: &WorkerId) -> Result<Lease, BackendError> {
        let mut e = Expr::held(observed);
        e.set(
            LEASE_OWNER,
            AttributeValue::S(new_owner.as_str().to_owned()),
        )
        .set(LEASE_COUNTER, schema::number(observed.counter + 1))
        .set(schema::FENCE, schema::number(observed.counter + 1))
        .remove(CHECKPOINT_OWNER)
        .remove(schema::RESTART_GRACE);
        // An adoption (the row names the taker already) keeps a handoff request: the leader
        // may have asked for the lease to move on before its target took it.
        if observed.owner.as_ref() != Some(new_owner) {
            e.increment(OWNER_SWITCHES_SINCE_CHECKPOINT)
                .remove(HANDOFF_TO);
        }
        self.update(Operation::Take, &observed.key, e).await
    }

    async fn release(&self, held: &Lease) -> Result<(), BackendError> {
        let mut e = Expr::held(held);
        e.set(LEASE_COUNTER, schema::number(held.counter + 1))
            .remove(LEASE_OWNER)
            .remove(HANDOFF_TO)
            .remove(schema::RESTART_GRACE);
        self.update(Operation::Release, &held.key, e)
            .await
            .map(drop)
    }

    async fn request_handoff(
        &self,
        observed: &Lease,
        to: Option<&WorkerId>,
    ) -> Result<(), BackendError> {
        let mut e = Expr::owner_as(observed);
        // A missing row has no owner either: without this, an unowned `observed` would make
        // a row of the key and `handoffTo` alone, which no reader can parse.
        let key = e.name(schema::LEASE_KEY);
        e.and(&format!("attribute_exists({key})"));
        match to {
            Some(to) => e.set(HANDOFF_TO, AttributeValue::S(to.as_str().to_owned())),
            None => e.remove(HANDOFF_TO),
        };
        self.update(Operation::RequestHandoff, &observed.key, e)
            .await
            .map(drop)
    }

    async fn checkpoint(
        &self,
        held: &Lease,
        update: &CheckpointUpdate,
    ) -> Result<Lease, BackendError> {
        // Also on the checkpoint held: a commit moves it without the counter (see
        // `LeaseStore::checkpoint`).
        let mut e = Expr::held(held);
        let at = e.checkpoint_is(&held.checkpoint);
        e.and(&at);
        e.checkpoint(&held.key, update, held.counter);
        e.load(held.load);
        self.update(Operation::Checkpoint, &held.key, e).await
    }

    async fn reset(
        &self,
        observed: &Lease,
        owner: &WorkerId,
        update: &CheckpointUpdate,
    ) -> Result<Lease, BackendError> {
        // One UpdateItem: the take and the checkpoint, conditional on the owner and counter
        // observed.
        let mut e = Expr::held(observed);
        e.set(LEASE_OWNER, AttributeValue::S(owner.as_str().to_owned()))
            .set(schema::FENCE, schema::number(observed.counter + 1))
            .remove(HANDOFF_TO)
            .remove(CHECKPOINT_OWNER);
        // A take ends a restart grace, unless the update sets one (one path cannot be both
        // set and removed in an expression).
        if update.restart_grace.is_none() {
            e.remove(schema::RESTART_GRACE);
        }
        e.checkpoint(&observed.key, update, observed.counter);
        self.update(Operation::Reset, &observed.key, e).await
    }

    async fn delete(&self, lease: &Lease) -> Result<(), BackendError> {
        let (k, v) = self.key(&lease.key);
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(k, v)
            .condition_expression(COND_COUNTER)
            .expression_attribute_names(schema::placeholder(LEASE_COUNTER), LEASE_COUNTER)
            .expression_attribute_values(VAL_COUNTER, schema::number(lease.counter))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        self.count(Operation::Delete, &result, |o| (o.consumed_capacity(), 0));
        result
            .map_err(|e| backend_error("delete", self.what(&lease.key), e))
            .map(drop)
    }
}

#[cfg(test)]
mod tests;
