//! # kcl-aws
//!
//! The AWS backends of [`kcl_core`]: [`KinesisShardSource`] reads a Kinesis stream through
//! aws-sdk-kinesis, [`DynamoDbStreamsSource`] a DynamoDB table's stream (as the Java DynamoDB
//! Streams Kinesis Adapter does, see [`streams`]), [`DynamoDbLeaseStore`] keeps the lease table
//! in DynamoDB through aws-sdk-dynamodb, in KCL Java's schema so that a fleet can move from KCL
//! Java without losing its checkpoints.
//!
//! Both are built from an [`aws_config::SdkConfig`], so credentials, region, retries and
//! endpoints (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_KINESIS`, `AWS_ENDPOINT_URL_DYNAMODB`)
//! come from the standard AWS chain, exactly as for any other Rust AWS client. Where that
//! config sets no operation or attempt timeout, `new` adds them (Kinesis: 5 s an attempt,
//! 10 s an operation; DynamoDB: 3 s and 10 s), so that no call can hang a worker.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use kcl_aws::{DynamoDbLeaseStore, KinesisShardSource};
//!
//! let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let source = KinesisShardSource::new(&sdk, "orders"); // a name or an ARN
//! let store = DynamoDbLeaseStore::new(&sdk, "orders-app"); // table = application name
//! # let _ = (source, store);
//! # Ok(())
//! # }
//! ```
//!
//! Every SDK error is classified in one place (the private `error` module) into the
//! core's [`ErrorKind`](kcl_core::ErrorKind): a failed condition is a conflict (a lost lease),
//! throttling is throttling, an expired iterator is reopened by the core, a missing stream or
//! table is fatal and named in the message.
//!
//! Two tools beside the consumer API, each behind a feature of its name (off by default):
//! `producer::put_records` writes records, for demos and tests; `cost` says what the lease
//! table will cost a fleet, by mode and next to KCL Java 3.x's bill.
//!
//! Behind the feature `dead-letters` (off by default; it brings in aws-sdk-sqs and
//! aws-sdk-s3), `dead_letter` holds the sinks of records a failure policy gives up on (SQS,
//! S3, Kinesis, a local file), their JSON format, and the readers `kcl-admin dead-letters`
//! lists and redrives from.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod any;
#[cfg(feature = "cost")]
#[cfg_attr(docsrs, doc(cfg(feature = "cost")))]
pub mod cost;
#[cfg(feature = "dead-letters")]
#[cfg_attr(docsrs, doc(cfg(feature = "dead-letters")))]
pub mod dead_letter;
pub mod dynamodb;
mod error;
pub mod kinesis;
#[cfg(feature = "producer")]
#[cfg_attr(docsrs, doc(cfg(feature = "producer")))]
pub mod producer;
mod settings;
pub mod streams;
mod timeouts;

pub use any::AnySource;
pub use dynamodb::DynamoDbLeaseStore;
pub use kinesis::{KinesisShardSource, StreamRef};
pub use settings::{TableBilling, TableSetup};
pub use streams::DynamoDbStreamsSource;
