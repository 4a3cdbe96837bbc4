//! The store's [`LeaseStoreExtras`]: parked keys (unparking, redrive requests), the change
//! feed, usage and unreadable rows.

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use kcl_core::lease::feed::{FeedPosition, FeedRead};
use kcl_core::lease::usage::{Operation, Usage};
use kcl_core::{BackendError, ErrorKind, LeaseStoreExtras, ShardId};

use super::{DynamoDbLeaseStore, schema};
use crate::error::backend_error;

impl LeaseStoreExtras for DynamoDbLeaseStore {
    /// The table's stream (`StreamSpecification`), enabled by `ensure_table`.
    fn offers_change_feed(&self) -> bool {
        true
    }

    /// `DELETE parkedKeys :entries`, on the row if it exists: the counter is left alone, so
    /// the holder's fenced writes go on; it sees the change in its next renewal.
    async fn unpark(&self, key: &ShardId, entries: &[String]) -> Result<(), BackendError> {
        if entries.is_empty() {
            return Ok(());
        }
        let (k, v) = self.key(key);
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(k, v)
            .update_expression("DELETE #parked :entries")
            .condition_expression("attribute_exists(#key)")
            .expression_attribute_names("#parked", schema::PARKED_KEYS)
            .expression_attribute_names("#key", schema::LEASE_KEY)
            .expression_attribute_values(":entries", AttributeValue::Ss(entries.to_vec()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        self.count(Operation::Unpark, &result, |o| (o.consumed_capacity(), 0));
        result
            .map_err(|e| backend_error("unpark", self.what(key), e))
            .map(drop)
    }

    /// `ADD parkedKeys :request` if `contains(parkedKeys, :parked)`: the counter and the owner
    /// are left alone (whoever holds the row, its fenced writes go on, and it sees the request
    /// at its next read of the row); a row that no longer parks the key (or is gone) is
    /// `false`.
    async fn request_redrive(
        &self,
        key: &ShardId,
        parked: &str,
        request: &str,
    ) -> Result<bool, BackendError> {
        let (k, v) = self.key(key);
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(k, v)
            .update_expression("ADD #parked :request")
            .condition_expression("contains(#parked, :parked)")
            .expression_attribute_names("#parked", schema::PARKED_KEYS)
            .expression_attribute_values(":request", AttributeValue::Ss(vec![request.to_owned()]))
            .expression_attribute_values(":parked", AttributeValue::S(parked.to_owned()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        self.count(Operation::RequestRedrive, &result, |o| {
            (o.consumed_capacity(), 0)
        });
        match result.map_err(|e| backend_error("request_redrive", self.what(key), e)) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::Conflict => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn changes(&self, from: Option<&FeedPosition>) -> Result<FeedRead, BackendError> {
        match &self.feed {
            Some(feed) => feed.read(from, &self.usage).await,
            None => Ok(FeedRead::Unavailable),
        }
    }

    fn usage(&self) -> Option<Usage> {
        Some(self.usage.clone())
    }

    fn unreadable(&self) -> Vec<kcl_core::lease::UnreadableRow> {
        self.unreadable.rows()
    }
}
