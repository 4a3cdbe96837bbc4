//! Error mapping and paging, against a mocked Kinesis client (no network).
//!
//! Error answers are raw HTTP responses with Kinesis's JSON error body, so they go through the
//! SDK's real deserializer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use aws_sdk_kinesis::config::http::HttpResponse;
use aws_sdk_kinesis::config::retry::RetryConfig;
use aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_kinesis::operation::get_records::GetRecordsOutput;
use aws_sdk_kinesis::operation::list_shards::ListShardsOutput;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{self as sdk, ChildShard, SequenceNumberRange};
use aws_sdk_kinesis::{Client, Config};
use aws_smithy_mocks::{MockResponseInterceptor, Rule, RuleMode, create_mock_http_client, mock};
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use kcl_core::{ErrorKind, ShardId, ShardIterator, ShardSource, StartingPosition};

use super::{KinesisShardSource, StreamRef};

fn source(rules: &[&Rule]) -> KinesisShardSource {
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
    KinesisShardSource::from_client(Client::from_conf(config), "orders")
}

fn aws_error(status: u16, code: &str) -> HttpResponse {
    let body = format!(r#"{{"__type":"{code}","message":"from the test"}}"#);
    HttpResponse::new(StatusCode::try_from(status).unwrap(), SdkBody::from(body))
}

fn range(start: &str, end: &str) -> sdk::HashKeyRange {
    sdk::HashKeyRange::builder()
        .starting_hash_key(start)
        .ending_hash_key(end)
        .build()
        .unwrap()
}

fn shard(id: &str, parent: Option<&str>, closed: bool) -> sdk::Shard {
    let mut seq = SequenceNumberRange::builder().starting_sequence_number("1");
    if closed {
        seq = seq.ending_sequence_number("99");
    }
    let mut b = sdk::Shard::builder()
        .shard_id(id)
        .hash_key_range(range("0", "340282366920938463463374607431768211455"))
        .sequence_number_range(seq.build().unwrap());
    if let Some(p) = parent {
        b = b.parent_shard_id(p);
    }
    b.build().unwrap()
}

#[test]
fn stream_ref_tells_arns_from_names() {
    assert_eq!(
        StreamRef::from("arn:aws:kinesis:us-east-1:123456789012:stream/s"),
        StreamRef::Arn("arn:aws:kinesis:us-east-1:123456789012:stream/s".into())
    );
    assert_eq!(StreamRef::from("s"), StreamRef::Name("s".into()));
}

#[tokio::test]
async fn expired_iterator_maps_to_expired_iterator() {
    let rule = mock!(Client::get_records)
        .then_http_response(|| aws_error(400, "ExpiredIteratorException"));
    let err = source(&[&rule])
        .get_records(&ShardIterator("it".into()), 100)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ExpiredIterator);
}

#[tokio::test]
async fn throughput_and_kms_throttling_are_throttled() {
    for code in [
        "ProvisionedThroughputExceededException",
        "KMSThrottlingException",
    ] {
        let code = code.to_owned();
        let rule = mock!(Client::get_records).then_http_response(move || aws_error(400, &code));
        let err = source(&[&rule])
            .get_records(&ShardIterator("it".into()), 100)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Throttled);
    }
    let rule = mock!(Client::get_shard_iterator)
        .then_http_response(|| aws_error(400, "LimitExceededException"));
    let err = source(&[&rule])
        .shard_iterator(&ShardId::new("s"), &StartingPosition::TrimHorizon)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Throttled);
}

#[tokio::test]
async fn a_missing_stream_or_shard_is_not_found_and_named() {
    let rule = mock!(Client::list_shards)
        .then_http_response(|| aws_error(400, "ResourceNotFoundException"));
    let err = source(&[&rule]).list_shards().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.kind().is_permanent());
    assert!(err.to_string().contains("stream orders"), "{err}");

    // A closed shard whose records all aged out: the worker checks the stream and ends it.
    let rule = mock!(Client::get_shard_iterator)
        .then_http_response(|| aws_error(400, "ResourceNotFoundException"));
    let err = source(&[&rule])
        .shard_iterator(
            &ShardId::new("shardId-000000000007"),
            &StartingPosition::TrimHorizon,
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("shardId-000000000007"), "{err}");
}

#[tokio::test]
async fn list_shards_pages_with_the_token_alone() {
    let first = mock!(Client::list_shards)
        .match_requests(|req| req.stream_name() == Some("orders") && req.next_token().is_none())
        .then_output(|| {
            ListShardsOutput::builder()
                .shards(shard("shardId-000000000000", None, true))
                .next_token("page-2")
                .build()
        });
    let second = mock!(Client::list_shards)
        .match_requests(|req| req.next_token() == Some("page-2") && req.stream_name().is_none())
        .then_output(|| {
            ListShardsOutput::builder()
                .shards(shard(
                    "shardId-000000000001",
                    Some("shardId-000000000000"),
                    false,
                ))
                .build()
        });
    let shards = source(&[&first, &second]).list_shards().await.unwrap();
    assert_eq!(shards.len(), 2);
    assert!(shards[0].closed);
    assert!(!shards[1].closed);
    assert_eq!(
        shards[1].parent_shard_ids,
        [ShardId::new("shardId-000000000000")]
    );
    assert_eq!(shards[1].hash_key_range.end, u128::MAX);
}

#[tokio::test]
async fn shard_end_has_no_iterator_and_names_the_children() {
    let rule = mock!(Client::get_records)
        .match_requests(|req| req.limit() == Some(5))
        .then_output(|| {
            GetRecordsOutput::builder()
                .records(
                    sdk::Record::builder()
                        .sequence_number("49590338271490256608559692538361571095921575989136588898")
                        .data(Blob::new("hi"))
                        .partition_key("k")
                        .build()
                        .unwrap(),
                )
                .millis_behind_latest(0)
                .child_shards(
                    ChildShard::builder()
                        .shard_id("shardId-000000000002")
                        .parent_shards("shardId-000000000000")
                        .hash_key_range(range("0", "10"))
                        .build()
                        .unwrap(),
                )
                .build()
                .unwrap()
        });
    let batch = source(&[&rule])
        .get_records(&ShardIterator("it".into()), 5)
        .await
        .unwrap();
    assert_eq!(batch.records.len(), 1);
    assert_eq!(batch.records[0].partition_key, "k");
    assert_eq!(batch.next_iterator, None);
    assert_eq!(batch.millis_behind_latest, Some(0));
    assert_eq!(
        batch.child_shards[0].id,
        ShardId::new("shardId-000000000002")
    );
    assert_eq!(batch.child_shards[0].hash_key_range.end, 10);
}
