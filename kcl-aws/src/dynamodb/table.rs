//! Creating the lease table, or checking the one that is there, and waiting until `ACTIVE`.
//!
//! The table KCL Java creates has only `leaseKey` (S) as hash key and on-demand billing; we
//! create the same, so either library can use a table the other created. An existing table is
//! used as it is (KCL Java 3.x adds a `leaseOwner` index; we neither need nor remove it), as
//! long as its hash key is `leaseKey`.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ProvisionedThroughput,
    ScalarAttributeType, TableStatus,
};
use kcl_core::{BackendError, ErrorKind};
use tokio::time::{Instant, sleep};

use super::TableBilling;
use super::schema::LEASE_KEY;
use crate::error::{Cause, backend_error};

const OPERATION: &str = "ensure_table";

/// How often table status is polled while it is being created.
const POLL: Duration = Duration::from_millis(500);

/// Creates `table` unless it exists and waits until it is `ACTIVE`, at most `wait`.
pub(crate) async fn ensure(
    client: &Client,
    table: &str,
    billing: TableBilling,
    wait: Duration,
) -> Result<(), BackendError> {
    let deadline = Instant::now() + wait;
    let what = format!("lease table {table}");
    let mut created = false;
    loop {
        match client.describe_table().table_name(table).send().await {
            Ok(out) => {
                let description = out.table.as_ref();
                let keys = description.and_then(|d| d.key_schema.as_deref());
                check_key_schema(table, keys.unwrap_or_default())?;
                match description.and_then(|d| d.table_status.as_ref()) {
                    Some(TableStatus::Active) => return Ok(()),
                    Some(TableStatus::Creating | TableStatus::Updating | TableStatus::Deleting)
                    | None => {}
                    Some(other) => {
                        return Err(BackendError::new(
                            ErrorKind::Fatal,
                            OPERATION,
                            format!("{what} is {}, not usable", other.as_str()),
                        ));
                    }
                }
            }
            Err(e) => {
                if Cause::of(&e) != Cause::NotFound {
                    return Err(backend_error(OPERATION, &what, e));
                }
                if !created {
                    create(client, table, billing).await?;
                    created = true;
                    continue;
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(BackendError::new(
                ErrorKind::Retryable,
                OPERATION,
                format!("{what} is not ACTIVE after {wait:?}"),
            ));
        }
        sleep(POLL).await;
    }
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

async fn create(client: &Client, table: &str, billing: TableBilling) -> Result<(), BackendError> {
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
