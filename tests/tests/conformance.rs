//! The conformance suite of every `LeaseStore` (`kcl_core::conformance`) against
//! `kcl_aws::DynamoDbLeaseStore` on moto, through the real SDK: each test on a table of its
//! own (with the owner index and a stream, read as the change feed), and the commit checks
//! of its exactly-once outputs (`TransactWriteItems`) on an output table beside it.
//!
//! Where a store does not do what the in-memory store (the reference) does, the check can be
//! listed in `known_failures`: it still runs, says how it fails, and fails the day it passes.
//! DynamoDB's store conforms in full.

#![allow(clippy::expect_used, clippy::panic)]

use std::future::Future;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use kcl_aws::DynamoDbLeaseStore;
use kcl_core::BoxError;
use kcl_core::conformance::TransactFixture;
use kcl_integration_tests::{Context, items};

/// A store on a fresh table of its own; `None` skips the test (emulators missing and
/// `KCL_SKIP_INTEGRATION=1`, never under `CI=true`).
async fn fresh_store() -> Option<DynamoDbLeaseStore> {
    match Context::new("conformance").await {
        Ok(ctx) => Some(ctx?.store_with_feed().await),
        Err(e) => panic!("{e:#}"),
    }
}

kcl_core::lease_store_conformance!(fresh_store().await);

/// DynamoDB's commits, on an output table keyed by `id` whose items count in `n`.
#[derive(Debug)]
struct DynamoDbCommits {
    ctx: Context,
    store: DynamoDbLeaseStore,
    out: String,
}

/// A store on a fresh table and a fresh output table; `None` skips the test.
async fn fresh_commits() -> Option<DynamoDbCommits> {
    let ctx = match Context::new("conformance-commits").await {
        Ok(ctx) => ctx?,
        Err(e) => panic!("{e:#}"),
    };
    let out = format!("{}-out", ctx.table);
    items::create(&ctx, &out, false)
        .await
        .expect("create the output table");
    let store = ctx.store().with_output_table(out.clone(), &["id"]);
    Some(DynamoDbCommits { ctx, store, out })
}

impl TransactFixture for DynamoDbCommits {
    type Store = DynamoDbLeaseStore;

    fn store(&self) -> &DynamoDbLeaseStore {
        &self.store
    }

    fn add(&self, item: &str) -> TransactWriteItem {
        let update = Update::builder()
            .table_name(&self.out)
            .key("id", AttributeValue::S(item.to_owned()))
            .update_expression("ADD #n :one")
            .expression_attribute_names("#n", "n")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .build()
            .expect("an Update with a table, a key and an expression");
        TransactWriteItem::builder().update(update).build()
    }

    fn create(&self, item: &str) -> TransactWriteItem {
        let put = Put::builder()
            .table_name(&self.out)
            .item("id", AttributeValue::S(item.to_owned()))
            .condition_expression("attribute_not_exists(id)")
            .build()
            .expect("a Put with a table and an item");
        TransactWriteItem::builder().put(put).build()
    }

    fn item(&self, item: &str) -> impl Future<Output = Result<Option<i64>, BoxError>> + Send {
        let (client, table, id) = (self.ctx.dynamodb.clone(), self.out.clone(), item.to_owned());
        async move {
            let out = client
                .get_item()
                .table_name(table)
                .key("id", AttributeValue::S(id))
                .consistent_read(true)
                .send()
                .await?;
            let Some(found) = out.item else {
                return Ok(None);
            };
            let n = match found.get("n") {
                Some(AttributeValue::N(n)) => n.parse()?,
                _ => 0,
            };
            Ok(Some(n))
        }
    }

    /// moto keeps no `ClientRequestToken`s (DynamoDB does, for 10 minutes).
    fn keeps_tokens(&self) -> bool {
        false
    }
}

mod commits {
    use super::fresh_commits;

    kcl_core::transact_conformance!(fresh_commits().await);
}
