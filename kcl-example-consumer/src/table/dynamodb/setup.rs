//! The table checked at start, before any shard is opened: created if missing (under
//! `--table-setup managed`), its key checked name by name and type by type (a table another
//! tool made would otherwise fail at the first commit, or take writes of another shape), and
//! claimed for one application ([`claim`](crate::table::claim): the application item and the
//! baseline, whose DynamoDB calls are here).

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::BuildError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TableDescription, TableStatus,
};
use futures_util::future::BoxFuture;
use kcl_core::Lease;

use super::{APPLICATION, DynamoDbItems, POSITION, SHARD, WINDOW_START};
use super::{now, number, text};
use crate::table::TableError;
use crate::table::claim::{Claim, Claims};

/// Checks that `table` exists with the right key; creates it (on-demand) if it is missing
/// and `create`, and waits until it is ACTIVE.
///
/// # Errors
/// [`TableError`]: missing (and not `create`), a key of another name or type, a call failed.
pub async fn ensure_table(client: &Client, table: &str, create: bool) -> Result<(), TableError> {
    let call = |operation| {
        let table = table.to_owned();
        move |e: Box<dyn std::error::Error + Send + Sync>| TableError::Call {
            table,
            operation,
            source: e,
        }
    };
    let described = client.describe_table().table_name(table).send().await;
    let missing = matches!(&described, Err(e)
        if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()));
    if missing {
        if !create {
            return Err(TableError::Missing {
                table: table.to_owned(),
                create: crate::table::error::DYNAMODB_SHAPE,
            });
        }
        let (attributes, keys) = schema().map_err(|e| call("CreateTable")(Box::new(e)))?;
        let created = client
            .create_table()
            .table_name(table)
            .billing_mode(BillingMode::PayPerRequest)
            .set_attribute_definitions(Some(attributes))
            .set_key_schema(Some(keys))
            .send()
            .await;
        match created {
            Ok(_) => {}
            // Another worker created it meanwhile.
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_in_use_exception()) => {}
            Err(e) => return Err(call("CreateTable")(Box::new(e))),
        }
    } else {
        let described = described.map_err(|e| call("DescribeTable")(Box::new(e)))?;
        if let Some(description) = described.table() {
            check_key(table, description)?;
        }
    }
    wait_active(client, table).await
}

/// Refuses a key other than `shard` (HASH, S) + `window_start` (RANGE, S), naming the first
/// attribute that differs.
fn check_key(table: &str, description: &TableDescription) -> Result<(), TableError> {
    for (role, kind, expected) in [
        ("partition", KeyType::Hash, SHARD),
        ("sort", KeyType::Range, WINDOW_START),
    ] {
        let found = description
            .key_schema()
            .iter()
            .find(|k| *k.key_type() == kind)
            .map(|k| k.attribute_name().to_owned());
        if found.as_deref() != Some(expected) {
            return Err(TableError::WrongKey {
                table: table.to_owned(),
                role,
                expected,
                found: found.map_or_else(|| "none".to_owned(), |f| format!("`{f}`")),
            });
        }
        let declared = description
            .attribute_definitions()
            .iter()
            .find(|a| a.attribute_name() == expected)
            .map(|a| a.attribute_type().as_str().to_owned());
        if declared.as_deref() != Some("S") {
            return Err(TableError::KeyType {
                table: table.to_owned(),
                attribute: expected,
                expected: "S",
                found: declared.unwrap_or_else(|| "none".to_owned()),
            });
        }
    }
    Ok(())
}

/// The table's key: `shard` (HASH) and `window_start` (RANGE), both strings.
fn schema() -> Result<(Vec<AttributeDefinition>, Vec<KeySchemaElement>), BuildError> {
    let attribute = |name| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
    };
    let key = |name, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
    };
    Ok((
        vec![attribute(SHARD)?, attribute(WINDOW_START)?],
        vec![
            key(SHARD, KeyType::Hash)?,
            key(WINDOW_START, KeyType::Range)?,
        ],
    ))
}

/// Waits (up to a minute) until `table` is ACTIVE.
async fn wait_active(client: &Client, table: &str) -> Result<(), TableError> {
    let limit = Duration::from_secs(60);
    let start = tokio::time::Instant::now();
    loop {
        let out = client.describe_table().table_name(table).send().await;
        let status = out
            .ok()
            .and_then(|o| o.table().and_then(|t| t.table_status().cloned()));
        if status == Some(TableStatus::Active) {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(TableError::NotActive {
                table: table.to_owned(),
                waited: limit,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

impl Claims for DynamoDbItems {
    fn read_claim(&self) -> BoxFuture<'_, Result<Claim, TableError>> {
        Box::pin(read_claim(self))
    }

    fn create_claim(&self) -> BoxFuture<'_, Result<Claim, TableError>> {
        Box::pin(create_claim(self))
    }

    fn record_baseline<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, TableError>> {
        Box::pin(record_baseline(self, lease))
    }

    fn baseline_done(&self) -> BoxFuture<'_, Result<(), TableError>> {
        Box::pin(async move {
            self.client
                .update_item()
                .table_name(&self.table)
                .key(SHARD, text(APPLICATION))
                .key(WINDOW_START, text(APPLICATION))
                .update_expression("SET #b = :done")
                .condition_expression("#app = :app")
                .expression_attribute_names("#b", "baseline")
                .expression_attribute_names("#app", "application")
                .expression_attribute_values(":done", text("done"))
                .expression_attribute_values(":app", text(&self.application))
                .send()
                .await
                .map_err(|e| call(self, "UpdateItem", e))?;
            Ok(())
        })
    }
}

async fn read_claim(items: &DynamoDbItems) -> Result<Claim, TableError> {
    let out = items
        .client
        .get_item()
        .table_name(&items.table)
        .key(SHARD, text(APPLICATION))
        .key(WINDOW_START, text(APPLICATION))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| call(items, "GetItem", e))?;
    let Some(item) = out.item() else {
        return Ok(Claim::Absent);
    };
    let field = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
    Ok(match field("application") {
        Some(app) if app != items.application => Claim::Other(app),
        _ if field("baseline").as_deref() == Some("done") => Claim::Done,
        _ => Claim::Pending,
    })
}

/// Creates the application item, `pending`; if another worker did first, what it says.
async fn create_claim(items: &DynamoDbItems) -> Result<Claim, TableError> {
    let put = items
        .client
        .put_item()
        .table_name(&items.table)
        .item(SHARD, text(APPLICATION))
        .item(WINDOW_START, text(APPLICATION))
        .item("application", text(&items.application))
        .item("created_by", text(&items.worker))
        .item("created_at", now())
        .item("baseline", text("pending"))
        .condition_expression("attribute_not_exists(#s)")
        .expression_attribute_names("#s", SHARD)
        .send()
        .await;
    match put {
        Ok(_) => {
            tracing::info!(
                table = items.table,
                application = items.application,
                "the exactly-once table's first use by this application: claimed for it"
            );
            Ok(Claim::Pending)
        }
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
        {
            read_claim(items).await
        }
        Err(e) => Err(call(items, "PutItem", e)),
    }
}

/// `lease`'s checkpoint as its shard's position, if the table has none; true if written.
async fn record_baseline(items: &DynamoDbItems, lease: &Lease) -> Result<bool, TableError> {
    let put = items
        .client
        .update_item()
        .table_name(&items.table)
        .key(SHARD, text(lease.key.as_str()))
        .key(WINDOW_START, text(POSITION))
        .update_expression("SET #cp = :cp, #sub = :sub, #app = :app, #at = :at, #base = :true")
        .condition_expression("attribute_not_exists(#s)")
        .expression_attribute_names("#s", SHARD)
        .expression_attribute_names("#cp", "checkpoint")
        .expression_attribute_names("#sub", "sub_sequence")
        .expression_attribute_names("#app", "application")
        .expression_attribute_names("#at", "updated_at")
        .expression_attribute_names("#base", "baseline")
        .expression_attribute_values(":cp", text(lease.checkpoint.as_str()))
        .expression_attribute_values(":sub", number(lease.checkpoint.sub_sequence()))
        .expression_attribute_values(":app", text(&items.application))
        .expression_attribute_values(":at", now())
        .expression_attribute_values(":true", aws_sdk_dynamodb::types::AttributeValue::Bool(true))
        .send()
        .await;
    match put {
        Ok(_) => Ok(true),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
        {
            Ok(false)
        }
        Err(e) => Err(call(items, "UpdateItem", e)),
    }
}

fn call<E>(items: &DynamoDbItems, operation: &'static str, error: E) -> TableError
where
    E: std::error::Error + Send + Sync + 'static,
{
    TableError::Call {
        table: items.table.clone(),
        operation,
        source: Box::new(error),
    }
}
