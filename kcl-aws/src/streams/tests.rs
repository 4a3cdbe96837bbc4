//! The DynamoDB Streams source against a mocked client (no network): what moto cannot do
//! (paging, closed shards, trimmed positions, a missing stream), the refusals' words, and
//! records both ways.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use aws_sdk_dynamodbstreams::config::http::HttpResponse;
use aws_sdk_dynamodbstreams::config::retry::RetryConfig;
use aws_sdk_dynamodbstreams::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodbstreams::operation::describe_stream::DescribeStreamOutput;
use aws_sdk_dynamodbstreams::operation::get_shard_iterator::GetShardIteratorOutput;
use aws_sdk_dynamodbstreams::primitives::{Blob, DateTime};
use aws_sdk_dynamodbstreams::types::{
    self as sdk, AttributeValue, Identity, OperationType, SequenceNumberRange, StreamViewType,
};
use aws_sdk_dynamodbstreams::{Client, Config};
use aws_smithy_mocks::{MockResponseInterceptor, Rule, RuleMode, create_mock_http_client, mock};
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use kcl_core::{SequenceNumber, ShardId, ShardSource, StartingPosition};

use super::{Change, DynamoDbStreamsSource, change, current_stream};

const ARN: &str =
    "arn:aws:dynamodb:us-east-1:000000000000:table/orders/stream/2026-11-26T00:00:00.000";

fn client(rules: &[&Rule]) -> Client {
    let mut interceptor = MockResponseInterceptor::new().rule_mode(RuleMode::MatchAny);
    for rule in rules {
        interceptor = interceptor.with_rule(rule);
    }
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .retry_config(RetryConfig::disabled())
        .http_client(create_mock_http_client())
        .interceptor(interceptor)
        .build();
    Client::from_conf(config)
}

fn source(rules: &[&Rule]) -> DynamoDbStreamsSource {
    DynamoDbStreamsSource {
        client: client(rules),
        arn: ARN.into(),
        table: "orders".into(),
        latest: None,
    }
}

fn aws_error(code: &str) -> HttpResponse {
    let body = format!(
        r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{code}","message":"from the test"}}"#
    );
    HttpResponse::new(StatusCode::try_from(400).unwrap(), SdkBody::from(body))
}

fn shard(id: &str, parent: Option<&str>, closed: bool) -> sdk::Shard {
    let mut range = SequenceNumberRange::builder().starting_sequence_number("100");
    if closed {
        range = range.ending_sequence_number("199");
    }
    sdk::Shard::builder()
        .shard_id(id)
        .set_parent_shard_id(parent.map(str::to_owned))
        .sequence_number_range(range.build())
        .build()
}

#[tokio::test]
async fn shards_are_listed_across_pages_with_their_parent_and_state() {
    let first = mock!(Client::describe_stream)
        .match_requests(|r| r.exclusive_start_shard_id().is_none())
        .then_output(|| {
            let d = sdk::StreamDescription::builder()
                .shards(shard("shardId-1", None, true))
                .last_evaluated_shard_id("shardId-1")
                .build();
            DescribeStreamOutput::builder()
                .stream_description(d)
                .build()
        });
    let second = mock!(Client::describe_stream)
        .match_requests(|r| r.exclusive_start_shard_id() == Some("shardId-1"))
        .then_output(|| {
            let d = sdk::StreamDescription::builder()
                .shards(shard("shardId-2", Some("shardId-1"), false))
                .build();
            DescribeStreamOutput::builder()
                .stream_description(d)
                .build()
        });
    let shards = source(&[&first, &second]).list_shards().await.unwrap();
    assert_eq!(shards.len(), 2);
    assert!(shards[0].closed && !shards[1].closed);
    assert_eq!(shards[1].parent_shard_ids, [ShardId::new("shardId-1")]);
    assert_eq!(
        (shards[1].hash_key_range.start, shards[1].hash_key_range.end),
        (0, 1)
    );
}

#[tokio::test]
async fn a_trimmed_position_is_read_on_from_the_trim_horizon() {
    let at = mock!(Client::get_shard_iterator)
        .match_requests(|r| {
            r.shard_iterator_type() == Some(&sdk::ShardIteratorType::AtSequenceNumber)
        })
        .then_http_response(|| aws_error("TrimmedDataAccessException"));
    let horizon = mock!(Client::get_shard_iterator)
        .match_requests(|r| r.shard_iterator_type() == Some(&sdk::ShardIteratorType::TrimHorizon))
        .then_output(|| {
            GetShardIteratorOutput::builder()
                .shard_iterator("from-horizon")
                .build()
        });
    let checkpoint = SequenceNumber::parse("150").unwrap();
    let iterator = source(&[&at, &horizon])
        .shard_iterator(
            &ShardId::new("shardId-1"),
            &StartingPosition::AtSequence(checkpoint),
        )
        .await
        .unwrap();
    assert_eq!(
        iterator.0, "shardId-1 from-horizon",
        "tagged with its shard"
    );
    assert_eq!(horizon.num_calls(), 1);
}

#[tokio::test]
async fn a_missing_stream_is_refused_naming_the_arn() {
    let rule = mock!(Client::describe_stream)
        .then_http_response(|| aws_error("ResourceNotFoundException"));
    let error = DynamoDbStreamsSource::open(client(&[&rule]), ARN.into())
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(ARN) && text.contains("no DynamoDB stream"),
        "{text}"
    );
    assert!(!error.kind().is_transient());
}

#[tokio::test]
async fn a_stream_of_another_table_is_refused_naming_both() {
    let rule = mock!(Client::describe_stream).then_output(|| {
        let d = sdk::StreamDescription::builder()
            .table_name("orders")
            .build();
        DescribeStreamOutput::builder()
            .stream_description(d)
            .build()
    });
    let opened = DynamoDbStreamsSource::open(client(&[&rule]), ARN.into())
        .await
        .unwrap();
    assert_eq!(opened.table(), "orders");
    let text = opened
        .clone()
        .expect_table("payments")
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("table orders's, not table payments's"),
        "{text}"
    );
    assert!(opened.expect_table("orders").is_ok());
}

#[test]
fn a_table_without_a_stream_or_with_a_disabled_one_is_refused_saying_what_to_do() {
    use aws_sdk_dynamodb::types::{StreamSpecification, TableDescription};
    let none = current_stream("orders", Some(TableDescription::builder().build())).unwrap_err();
    assert!(
        none.contains("table orders has no DynamoDB stream: enable one"),
        "{none}"
    );
    let spec = |on| {
        StreamSpecification::builder()
            .stream_enabled(on)
            .build()
            .unwrap()
    };
    let disabled = TableDescription::builder()
        .latest_stream_arn(ARN)
        .stream_specification(spec(false))
        .build();
    let text = current_stream("orders", Some(disabled)).unwrap_err();
    assert!(
        text.contains("is disabled: enable the table's stream again"),
        "{text}"
    );
    assert!(text.contains("give its ARN instead of the table"), "{text}");
    let enabled = TableDescription::builder()
        .latest_stream_arn(ARN)
        .stream_specification(spec(true))
        .build();
    assert_eq!(current_stream("orders", Some(enabled)).unwrap(), ARN);
}

fn image(pairs: &[(&str, AttributeValue)]) -> HashMap<String, AttributeValue> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

#[test]
fn a_record_reads_back_as_the_change_it_was() {
    let keys = image(&[("id", AttributeValue::S("a".into()))]);
    let old = image(&[
        ("id", AttributeValue::S("a".into())),
        ("n", AttributeValue::N("1.5".into())),
        ("blob", AttributeValue::B(Blob::new(vec![0, 1, 255]))),
        ("tags", AttributeValue::Ss(vec!["x".into(), "y".into()])),
        ("nums", AttributeValue::Ns(vec!["1".into(), "2".into()])),
        (
            "list",
            AttributeValue::L(vec![AttributeValue::Bool(true), AttributeValue::Null(true)]),
        ),
        (
            "map",
            AttributeValue::M(image(&[("inner", AttributeValue::S("v".into()))])),
        ),
    ]);
    let stream_record = sdk::StreamRecord::builder()
        .set_keys(Some(keys.clone()))
        .set_old_image(Some(old.clone()))
        .sequence_number("300000000000000000001")
        .size_bytes(42)
        .stream_view_type(StreamViewType::NewAndOldImages)
        .approximate_creation_date_time(DateTime::from_secs(1_764_115_200))
        .build();
    let ttl = Identity::builder()
        .principal_id("dynamodb.amazonaws.com")
        .r#type("Service")
        .build();
    let wire = sdk::Record::builder()
        .event_id("e-1")
        .event_name(OperationType::Remove)
        .dynamodb(stream_record)
        .user_identity(ttl.clone())
        .build();
    let record = change::record(&wire).unwrap();
    assert_eq!(record.partition_key, r#"{"id":{"S":"a"}}"#);
    let json: serde_json::Value = serde_json::from_slice(&record.data).unwrap();
    // The adapter's JSON: the creation time in milliseconds.
    assert_eq!(
        json["dynamodb"]["ApproximateCreationDateTime"],
        1_764_115_200_000_i64
    );
    let change = Change::parse(&record).unwrap();
    assert_eq!(change.event, OperationType::Remove);
    assert_eq!(change.keys, keys);
    assert_eq!(change.old_image, Some(old));
    assert_eq!(change.new_image, None);
    assert_eq!(change.sequence_number, "300000000000000000001");
    assert_eq!(change.approximate_creation.timestamp(), 1_764_115_200);
    assert_eq!(change.view_type, Some(StreamViewType::NewAndOldImages));
    assert_eq!(change.user_identity, Some(ttl));
    assert!(change.is_ttl_deletion());

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Order {
        id: String,
        n: f64,
        tags: Vec<String>,
    }
    let order: Order = change.old_image_as().unwrap().unwrap();
    assert_eq!(order.id, "a");
    assert!((order.n - 1.5).abs() < f64::EPSILON);
    assert_eq!(order.tags.len(), 2);
    assert!(change.new_image_as::<Order>().unwrap().is_none());
}

#[test]
fn data_that_is_not_a_change_is_an_error_naming_the_record() {
    let record = kcl_core::Record::new(
        SequenceNumber::parse("7").unwrap(),
        "pk",
        bytes::Bytes::from_static(b"{\"order\":1}"),
    );
    let text = Change::parse(&record).unwrap_err().to_string();
    assert!(
        text.contains("record 7 is not a DynamoDB stream record"),
        "{text}"
    );
}

#[tokio::test]
async fn a_replaced_disabled_or_deleted_table_stream_is_reported_once_each() {
    use aws_sdk_dynamodb::operation::describe_table::DescribeTableOutput;
    use aws_sdk_dynamodb::types::{StreamSpecification, TableDescription};
    let table = |arn: &'static str, on: bool| {
        move || {
            let spec = StreamSpecification::builder()
                .stream_enabled(on)
                .build()
                .unwrap();
            let d = TableDescription::builder()
                .latest_stream_arn(arn)
                .stream_specification(spec)
                .build();
            DescribeTableOutput::builder().table(d).build()
        }
    };
    const NEW: &str =
        "arn:aws:dynamodb:us-east-1:000000000000:table/orders/stream/2026-11-27T00:00:00.000";
    let answers = mock!(aws_sdk_dynamodb::Client::describe_table)
        .sequence()
        .output(table(ARN, true))
        .output(table(NEW, true))
        .output(table(NEW, true))
        .output(table(NEW, false))
        .http_response(|| aws_error("ResourceNotFoundException"))
        .build();
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "t", "t", None, None, "t",
        ))
        .http_client(create_mock_http_client())
        .interceptor(MockResponseInterceptor::new().with_rule(&answers))
        .build();
    let mut source = source(&[]);
    source.latest = Some(std::sync::Arc::new(super::Latest {
        dynamodb: aws_sdk_dynamodb::Client::from_conf(config),
        reported: std::sync::Mutex::new(None),
    }));
    use super::Superseded::{By, Disabled, TableGone};
    assert_eq!(
        source.watch_latest().await,
        None,
        "still the current stream"
    );
    assert_eq!(source.watch_latest().await, Some(By(NEW.into())));
    assert_eq!(source.watch_latest().await, None, "reported once");
    // The replacement disabled in turn: the table has no current stream.
    assert_eq!(source.watch_latest().await, Some(Disabled));
    assert_eq!(source.watch_latest().await, Some(TableGone));
}

#[tokio::test]
async fn read_errors_become_what_the_worker_does_about_them() {
    use kcl_core::{ErrorKind, ShardIterator};
    for (code, kind) in [
        // Reopened after the last record read; a trimmed reopen then reads on (see above).
        ("ExpiredIteratorException", ErrorKind::ExpiredIterator),
        ("TrimmedDataAccessException", ErrorKind::ExpiredIterator),
        // More than two readers on a shard, or a limit above 1,000.
        ("LimitExceededException", ErrorKind::Throttled),
        ("InternalServerError", ErrorKind::Retryable),
        // A shard the service no longer has: the worker ends it.
        ("ResourceNotFoundException", ErrorKind::NotFound),
    ] {
        let rule = mock!(Client::get_records).then_http_response(move || aws_error(code));
        let error = source(&[&rule])
            .get_records(&ShardIterator("shardId-1 it".into()), 5000)
            .await
            .unwrap_err();
        assert_eq!(error.kind(), kind, "{code}: {error}");
    }
}

#[tokio::test]
async fn get_records_asks_for_at_most_1000() {
    use aws_sdk_dynamodbstreams::operation::get_records::GetRecordsOutput;
    let capped = mock!(Client::get_records)
        .match_requests(|r| r.limit() == Some(1000))
        .then_output(|| {
            GetRecordsOutput::builder()
                .next_shard_iterator("next")
                .build()
        });
    let batch = source(&[&capped])
        .get_records(&kcl_core::ShardIterator("shardId-1 it".into()), 10_000)
        .await
        .unwrap();
    assert_eq!(
        batch.next_iterator.map(|i| i.0).as_deref(),
        Some("shardId-1 next")
    );
    assert!(batch.records.is_empty() && batch.millis_behind_latest.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_shard_end_names_the_children_the_stream_lists_for_it() {
    use aws_sdk_dynamodbstreams::operation::get_records::GetRecordsOutput;
    use aws_sdk_dynamodbstreams::types::ShardFilterType;
    let end = mock!(Client::get_records)
        .match_requests(|r| r.shard_iterator() == Some("last"))
        .then_output(|| GetRecordsOutput::builder().build());
    let asked = |r: &aws_sdk_dynamodbstreams::operation::describe_stream::DescribeStreamInput| {
        r.shard_filter().is_some_and(|f| {
            f.r#type() == Some(&ShardFilterType::ChildShards) && f.shard_id() == Some("shardId-1")
        })
    };
    // Not listed at first (the service is eventually consistent), then with a stranger that
    // an emulator ignoring the filter would add.
    let children = mock!(Client::describe_stream)
        .match_requests(asked)
        .sequence()
        .output(|| {
            let d = sdk::StreamDescription::builder().build();
            DescribeStreamOutput::builder()
                .stream_description(d)
                .build()
        })
        .output(|| {
            let d = sdk::StreamDescription::builder()
                .shards(shard("shardId-2", Some("shardId-1"), false))
                .shards(shard("shardId-9", Some("shardId-8"), false))
                .build();
            DescribeStreamOutput::builder()
                .stream_description(d)
                .build()
        })
        .build();
    let batch = source(&[&end, &children])
        .get_records(&kcl_core::ShardIterator("shardId-1 last".into()), 100)
        .await
        .unwrap();
    assert!(batch.next_iterator.is_none());
    let ids: Vec<&str> = batch.child_shards.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["shardId-2"]);
    assert_eq!(children.num_calls(), 2);

    let error = source(&[])
        .get_records(&kcl_core::ShardIterator("no-shard-in-front".into()), 100)
        .await
        .unwrap_err();
    assert!(error.kind().is_permanent(), "{error}");
}

/// `to_json` takes an item of any shape: every attribute type, numbers kept exact (as text
/// beyond what a JSON number holds), binary as base64; `item_json` is the new image, or the
/// old one for a removal.
#[test]
fn any_item_reads_as_plain_json() {
    use serde_json::json;
    let item: HashMap<String, AttributeValue> = [
        ("s", AttributeValue::S("text".into())),
        ("i", AttributeValue::N("-42".into())),
        ("d", AttributeValue::N("1.5".into())),
        (
            "big",
            AttributeValue::N("12345678901234567890123456789".into()),
        ),
        ("t", AttributeValue::Bool(true)),
        ("none", AttributeValue::Null(true)),
        ("b", AttributeValue::B(Blob::new(b"hi".to_vec()))),
        ("ss", AttributeValue::Ss(vec!["a".into(), "b".into()])),
        ("ns", AttributeValue::Ns(vec!["1".into(), "2.25".into()])),
        ("bs", AttributeValue::Bs(vec![Blob::new(b"x".to_vec())])),
        (
            "l",
            AttributeValue::L(vec![
                AttributeValue::S("x".into()),
                AttributeValue::N("3".into()),
            ]),
        ),
        (
            "m",
            AttributeValue::M([("k".to_owned(), AttributeValue::Bool(false))].into()),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let want = json!({
        "s": "text", "i": -42, "d": 1.5, "big": "12345678901234567890123456789",
        "t": true, "none": null, "b": "aGk=", "ss": ["a", "b"], "ns": [1, 2.25], "bs": ["eA=="],
        "l": ["x", 3], "m": {"k": false},
    });
    assert_eq!(super::to_json(&item), want);

    let old: HashMap<String, AttributeValue> =
        [("id".to_owned(), AttributeValue::S("gone".into()))].into();
    let mut change = Change {
        event_id: "e".into(),
        event: OperationType::Remove,
        keys: old.clone(),
        new_image: None,
        old_image: Some(old),
        sequence_number: "1".into(),
        approximate_creation: chrono::Utc::now(),
        size_bytes: None,
        view_type: None,
        user_identity: None,
    };
    assert_eq!(change.item_json(), Some(json!({"id": "gone"})));
    change.event = OperationType::Insert;
    change.new_image = Some(item);
    assert_eq!(change.item_json(), Some(want));
    change.new_image = None;
    change.old_image = None;
    assert_eq!(change.item_json(), None);
}
