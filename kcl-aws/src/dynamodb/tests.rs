//! Error mapping and request shapes, against a mocked DynamoDB client (no network).
//!
//! Error answers are raw HTTP responses with DynamoDB's JSON error body, so they go through
//! the SDK's real deserializer, as an answer from DynamoDB would.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::operation::scan::ScanOutput;
use aws_sdk_dynamodb::operation::update_item::UpdateItemOutput;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::{Client, Config};
use aws_smithy_mocks::{MockResponseInterceptor, Rule, RuleMode, create_mock_http_client, mock};
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use kcl_core::{
    Checkpoint, CheckpointUpdate, ErrorKind, Lease, LeaseStore, LeaseStoreExtras, ShardId, WorkerId,
};

use super::DynamoDbLeaseStore;
use super::schema;

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

fn store(rules: &[&Rule]) -> DynamoDbLeaseStore {
    DynamoDbLeaseStore::from_client(client(rules), "app")
}

fn aws_error(status: u16, code: &str) -> HttpResponse {
    let body = format!(
        r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{code}","message":"from the test"}}"#
    );
    HttpResponse::new(StatusCode::try_from(status).unwrap(), SdkBody::from(body))
}

fn held() -> Lease {
    let mut lease = Lease::new(
        ShardId::new("shardId-000000000001"),
        Checkpoint::TrimHorizon,
    );
    lease.owner = Some(WorkerId::new("w1"));
    lease.counter = 7;
    lease
}

fn row(lease: &Lease) -> HashMap<String, AttributeValue> {
    schema::to_item(lease)
}

#[tokio::test]
async fn failed_condition_is_a_conflict_and_create_reports_false() {
    let update = mock!(Client::update_item)
        .then_http_response(|| aws_error(400, "ConditionalCheckFailedException"));
    let put = mock!(Client::put_item)
        .then_http_response(|| aws_error(400, "ConditionalCheckFailedException"));
    let store = store(&[&update, &put]);
    let err = store.renew(&held()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert_eq!(err.operation(), "renew");
    let update_cp = CheckpointUpdate::new(Checkpoint::ShardEnd);
    let err = store.checkpoint(&held(), &update_cp).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert!(!store.create(&held()).await.unwrap());
}

#[tokio::test]
async fn throttling_codes_are_throttled() {
    for code in [
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
    ] {
        let code = code.to_owned();
        let scan = mock!(Client::scan).then_http_response(move || aws_error(400, &code));
        let err = store(&[&scan]).list().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Throttled, "{err}");
    }
}

#[tokio::test]
async fn server_errors_are_retryable_and_a_missing_table_is_not_found() {
    let get = mock!(Client::get_item).then_http_response(|| aws_error(500, "InternalServerError"));
    let err = store(&[&get]).get(&ShardId::new("s")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Retryable);

    let get =
        mock!(Client::get_item).then_http_response(|| aws_error(400, "ResourceNotFoundException"));
    let err = store(&[&get]).get(&ShardId::new("s")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.kind().is_permanent());
    assert!(err.to_string().contains("app"), "{err}");
}

#[tokio::test]
async fn renew_is_conditional_on_owner_and_counter_and_returns_the_new_row() {
    let update = mock!(Client::update_item)
        .match_requests(|req| {
            let values = req.expression_attribute_values().unwrap();
            req.condition_expression() == Some(schema::COND_OWNED)
                && values.get(":counter") == Some(&AttributeValue::N("7".into()))
                && values.get(":owner") == Some(&AttributeValue::S("w1".into()))
                && req.update_expression() == Some("SET #leaseCounter = :leaseCounter")
        })
        .then_output(|| {
            let mut after = held();
            after.counter = 8;
            after.handoff_to = Some(WorkerId::new("w2"));
            UpdateItemOutput::builder()
                .set_attributes(Some(row(&after)))
                .build()
        });
    let renewed = store(&[&update]).renew(&held()).await.unwrap();
    assert_eq!(renewed.counter, 8);
    assert_eq!(renewed.handoff_to, Some(WorkerId::new("w2")));
}

/// A role row's candidates read cheaply: `peek` is a `GetItem` without `ConsistentRead`,
/// counted apart; `get` stays consistent. Naming a carrier is a checkpoint that sets
/// `kclCarrier`.
#[tokio::test]
async fn peek_reads_eventually_and_a_checkpoint_names_a_carrier() {
    use aws_sdk_dynamodb::operation::get_item::GetItemOutput;
    use kcl_core::lease::usage::Operation;

    let get = |consistent: bool| {
        mock!(Client::get_item)
            .match_requests(move |req| req.consistent_read() == Some(consistent))
            .then_output(|| {
                GetItemOutput::builder()
                    .set_item(Some(row(&held())))
                    .build()
            })
    };
    let (peek, consistent) = (get(false), get(true));
    let name = mock!(Client::update_item)
        .match_requests(|req| {
            let values = req.expression_attribute_values().unwrap();
            req.update_expression()
                .is_some_and(|e| e.contains("#kclCarrier = :kclCarrier"))
                && values.get(":kclCarrier")
                    == Some(&AttributeValue::S("shardId-000000000003".into()))
        })
        .then_output(|| {
            let mut after = held();
            after.counter = 8;
            after.carrier = Some(ShardId::new("shardId-000000000003"));
            UpdateItemOutput::builder()
                .set_attributes(Some(row(&after)))
                .build()
        });
    let store = store(&[&peek, &consistent, &name]);
    let key = held().key;
    assert_eq!(store.peek(&key).await.unwrap(), Some(held()));
    assert_eq!(store.get(&key).await.unwrap(), Some(held()));
    let mut update = CheckpointUpdate::new(Checkpoint::TrimHorizon);
    update.carrier = Some(ShardId::new("shardId-000000000003"));
    let named = store.checkpoint(&held(), &update).await.unwrap();
    assert_eq!(named.carrier, Some(ShardId::new("shardId-000000000003")));
    let usage = store.usage().unwrap();
    assert_eq!(usage.of(Operation::Peek).requests, 1);
    assert_eq!(usage.of(Operation::Get).requests, 1);
}

#[tokio::test]
async fn take_of_an_unowned_lease_requires_no_owner_and_counts_the_switch() {
    let mut observed = held();
    observed.owner = None;
    let update = mock!(Client::update_item)
        .match_requests(|req| {
            let expr = req.update_expression().unwrap_or_default();
            req.condition_expression() == Some(schema::COND_UNOWNED)
                && expr.contains("#ownerSwitchesSinceCheckpoint = if_not_exists")
                && expr.contains("#handoffTo")
                && !req
                    .expression_attribute_values()
                    .unwrap()
                    .contains_key(":owner")
        })
        .then_output(|| {
            let mut after = held();
            after.counter = 8;
            after.owner = Some(WorkerId::new("w9"));
            UpdateItemOutput::builder()
                .set_attributes(Some(row(&after)))
                .build()
        });
    let taken = store(&[&update])
        .take(&observed, &WorkerId::new("w9"))
        .await
        .unwrap();
    assert_eq!(taken.owner, Some(WorkerId::new("w9")));
}

/// A lease kept through its owner's restart: the owner's last write is a checkpoint write
/// of the row as it is, conditional on owner and counter, that sets `restartGraceMillis`;
/// the take that resumes it (or any take, or release) removes the attribute. That take
/// names the owner again (an adoption): it keeps a handoff request (`handoffTo`) the
/// leader may have written meanwhile.
#[tokio::test]
async fn a_restart_mark_is_a_fenced_checkpoint_write_and_a_take_removes_it() {
    let mark = mock!(Client::update_item)
        .match_requests(|req| {
            let expr = req.update_expression().unwrap_or_default();
            let values = req.expression_attribute_values().unwrap();
            // Owner and counter, and the checkpoint held (a commit moves it alone).
            req.condition_expression()
                .is_some_and(|c| c.starts_with(schema::COND_OWNED) && c.contains(":before"))
                && values.get(":counter") == Some(&AttributeValue::N("7".into()))
                && values.get(":before")
                    == Some(&AttributeValue::S(held().checkpoint.as_str().to_owned()))
                && values.get(":restartGraceMillis") == Some(&AttributeValue::N("60000".into()))
                && expr.contains("#restartGraceMillis = :restartGraceMillis")
        })
        .then_output(|| {
            let mut after = held();
            after.counter = 8;
            after.restart_grace = Some(std::time::Duration::from_secs(60));
            UpdateItemOutput::builder()
                .set_attributes(Some(row(&after)))
                .build()
        });
    let mut update = CheckpointUpdate::new(held().checkpoint);
    update.restart_grace = Some(std::time::Duration::from_secs(60));
    let kept = store(&[&mark]).checkpoint(&held(), &update).await.unwrap();
    assert_eq!(kept.restart_grace, Some(std::time::Duration::from_secs(60)));
    assert_eq!(mark.num_calls(), 1);

    let resume = mock!(Client::update_item)
        .match_requests(|req| {
            let expr = req.update_expression().unwrap_or_default();
            req.condition_expression() == Some(schema::COND_OWNED)
                && expr.contains("REMOVE ")
                && expr.contains("#restartGraceMillis")
                && !expr.contains(":restartGraceMillis")
                && !expr.contains("#handoffTo")
        })
        .then_output(|| {
            let mut after = held();
            after.counter = 9;
            UpdateItemOutput::builder()
                .set_attributes(Some(row(&after)))
                .build()
        });
    let resumed = store(&[&resume])
        .take(&kept, &WorkerId::new("w1"))
        .await
        .unwrap();
    assert_eq!(resumed.restart_grace, None);
    assert_eq!(resume.num_calls(), 1);
}

/// Issue 34, item 7: a reset is one `UpdateItem`, conditional on the owner and counter
/// observed, that makes the placeholder the owner and writes the checkpoint; a failed
/// condition is a conflict.
#[tokio::test]
async fn a_reset_is_one_conditional_update_of_owner_and_checkpoint() {
    let update = mock!(Client::update_item)
        .match_requests(|req| {
            let expr = req.update_expression().unwrap_or_default();
            let values = req.expression_attribute_values().unwrap();
            req.condition_expression() == Some(schema::COND_OWNED)
                && values.get(":counter") == Some(&AttributeValue::N("7".into()))
                && values.get(":owner") == Some(&AttributeValue::S("w1".into()))
                && values.get(":leaseOwner") == Some(&AttributeValue::S("kcl-admin/reset".into()))
                && values.get(":checkpoint") == Some(&AttributeValue::S("LATEST".into()))
                && values.get(":leaseCounter") == Some(&AttributeValue::N("8".into()))
                && expr.contains("#ownerSwitchesSinceCheckpoint = :ownerSwitchesSinceCheckpoint")
                && expr.contains("REMOVE #handoffTo")
                && expr.contains("#pendingCheckpoint")
        })
        .then_output(|| {
            let mut after = held();
            after.counter = 8;
            after.owner = Some(WorkerId::new("kcl-admin/reset"));
            after.checkpoint = Checkpoint::Latest;
            UpdateItemOutput::builder()
                .set_attributes(Some(row(&after)))
                .build()
        });
    let owner = WorkerId::new("kcl-admin/reset");
    let to = CheckpointUpdate::new(Checkpoint::Latest);
    let after = store(&[&update]).reset(&held(), &owner, &to).await.unwrap();
    assert_eq!(after.owner, Some(owner.clone()));
    assert_eq!(after.checkpoint, Checkpoint::Latest);
    assert_eq!(update.num_calls(), 1);

    let refused = mock!(Client::update_item)
        .then_http_response(|| aws_error(400, "ConditionalCheckFailedException"));
    let err = store(&[&refused])
        .reset(&held(), &owner, &to)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
}

#[tokio::test]
async fn list_pages_through_the_scan_and_skips_rows_it_cannot_parse() {
    let first = mock!(Client::scan)
        .match_requests(|req| {
            req.exclusive_start_key().is_none() && req.consistent_read() == Some(true)
        })
        .then_output(|| {
            let mut bad = row(&held());
            bad.insert(schema::LEASE_COUNTER.into(), AttributeValue::S("x".into()));
            bad.insert(
                schema::LEASE_KEY.into(),
                AttributeValue::S("shardId-bad".into()),
            );
            ScanOutput::builder()
                .items(row(&held()))
                .items(bad)
                .last_evaluated_key(schema::LEASE_KEY, AttributeValue::S("shardId-bad".into()))
                .build()
        });
    let second = mock!(Client::scan)
        .match_requests(|req| req.exclusive_start_key().is_some())
        .then_output(|| {
            let mut other = held();
            other.key = ShardId::new("shardId-000000000002");
            ScanOutput::builder().items(row(&other)).build()
        });
    let leases = store(&[&first, &second]).list().await.unwrap();
    let keys: Vec<&str> = leases.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, ["shardId-000000000001", "shardId-000000000002"]);
    assert_eq!(first.num_calls(), 1);
    assert_eq!(second.num_calls(), 1);
}

#[tokio::test]
async fn requests_are_counted_with_the_capacity_dynamodb_reports() {
    use aws_sdk_dynamodb::types::ConsumedCapacity;
    use kcl_core::lease::usage::Operation;

    let page = |units: f64| {
        ScanOutput::builder()
            .items(row(&held()))
            .consumed_capacity(
                ConsumedCapacity::builder()
                    .table_name("app")
                    .capacity_units(units)
                    .build(),
            )
            .build()
    };
    let scan = mock!(Client::scan)
        .sequence()
        .output(move || page(1.5))
        .output(move || page(2.0))
        .build();
    let refused = mock!(Client::update_item)
        .then_http_response(|| aws_error(400, "ConditionalCheckFailedException"));
    let store = store(&[&scan, &refused]);
    store.list().await.unwrap();
    store.list().await.unwrap();
    assert!(store.renew(&held()).await.is_err());
    let usage = store.usage().unwrap();
    let list = usage.of(Operation::List);
    assert_eq!(
        (list.requests, list.read_units, list.write_units),
        (2, 3.5, 0.0)
    );
    let renew = usage.of(Operation::Renew);
    assert_eq!(
        (renew.requests, renew.write_units),
        (1, 0.0),
        "a refused write is counted; DynamoDB does not report its units"
    );
}

#[tokio::test]
async fn owned_by_queries_the_owner_index_and_reads_the_table_without_it() {
    use aws_sdk_dynamodb::operation::query::QueryOutput;

    let key_only = |key: &str| {
        HashMap::from([(
            schema::LEASE_KEY.to_owned(),
            AttributeValue::S(key.to_owned()),
        )])
    };
    let indexed = mock!(Client::query)
        .match_requests(|r| r.index_name() == Some(schema::OWNER_INDEX))
        .then_output(move || {
            QueryOutput::builder()
                .items(key_only("shardId-000000000001"))
                .items(key_only("shardId-000000000002"))
                .count(2)
                .build()
        });
    let found = store(&[&indexed])
        .owned_by(&WorkerId::new("w1"))
        .await
        .unwrap();
    assert_eq!(
        found,
        [
            ShardId::new("shardId-000000000001"),
            ShardId::new("shardId-000000000002")
        ]
    );

    // Missing, being built or not allowed (real DynamoDB: ValidationException or
    // AccessDeniedException; emulators: ResourceNotFoundException): read the table instead,
    // and do not ask the index again at every call.
    for code in [
        "ValidationException",
        "AccessDeniedException",
        "ResourceNotFoundException",
    ] {
        let missing = mock!(Client::query).then_http_response(move || aws_error(400, code));
        let mut other = held();
        other.key = ShardId::new("shardId-000000000009");
        other.owner = Some(WorkerId::new("w2"));
        let rows = vec![row(&held()), row(&other)];
        let scan = mock!(Client::scan)
            .then_output(move || ScanOutput::builder().set_items(Some(rows.clone())).build());
        let store = store(&[&missing, &scan]);
        for _ in 0..3 {
            let found = store.owned_by(&WorkerId::new("w1")).await.unwrap();
            assert_eq!(
                found,
                [held().key],
                "{code}: only w1's lease, from the table"
            );
        }
        assert_eq!(
            missing.num_calls(),
            1,
            "{code}: the index is not asked again at once"
        );
        assert_eq!(scan.num_calls(), 3, "{code}");
    }

    // Throttling is not a missing index: it is reported, and the table is not read.
    let throttled = mock!(Client::query)
        .then_http_response(|| aws_error(400, "ProvisionedThroughputExceededException"));
    let scan = mock!(Client::scan).then_output(|| ScanOutput::builder().build());
    let error = store(&[&throttled, &scan])
        .owned_by(&WorkerId::new("w1"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Throttled);
    assert_eq!(scan.num_calls(), 0);
}

#[tokio::test]
async fn a_small_table_is_read_whole_rather_than_followed_through_its_stream() {
    use aws_sdk_dynamodb::types::{StreamSpecification, StreamViewType, TableDescription};
    use aws_sdk_dynamodbstreams::operation::describe_stream::DescribeStreamOutput;
    use aws_sdk_dynamodbstreams::operation::get_records::GetRecordsOutput;
    use aws_sdk_dynamodbstreams::operation::get_shard_iterator::GetShardIteratorOutput;
    use aws_sdk_dynamodbstreams::types::{Shard, StreamDescription};
    use kcl_core::lease::feed::FeedRead;

    let arn = "arn:aws:dynamodb:us-east-1:000000000000:table/app/stream/1";
    let described = mock!(aws_sdk_dynamodbstreams::Client::describe_stream).then_output(|| {
        let shard = Shard::builder().shard_id("shardId-1").build();
        let stream = StreamDescription::builder().shards(shard).build();
        DescribeStreamOutput::builder()
            .stream_description(stream)
            .build()
    });
    let iterator = mock!(aws_sdk_dynamodbstreams::Client::get_shard_iterator).then_output(|| {
        GetShardIteratorOutput::builder()
            .shard_iterator("it-1")
            .build()
    });
    let records = mock!(aws_sdk_dynamodbstreams::Client::get_records).then_output(|| {
        GetRecordsOutput::builder()
            .next_shard_iterator("it-2")
            .build()
    });
    let interceptor = MockResponseInterceptor::new()
        .rule_mode(RuleMode::MatchAny)
        .with_rule(&described)
        .with_rule(&iterator)
        .with_rule(&records);
    let streams = aws_sdk_dynamodbstreams::Client::from_conf(
        aws_sdk_dynamodbstreams::Config::builder()
            .behavior_version(aws_sdk_dynamodbstreams::config::BehaviorVersion::latest())
            .region(aws_sdk_dynamodbstreams::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodbstreams::config::Credentials::new(
                "test", "test", None, None, "test",
            ))
            .http_client(create_mock_http_client())
            .interceptor(interceptor)
            .build(),
    );
    let store = store(&[]).with_change_feed_client(streams);
    let feed = store.feed.clone().unwrap();
    let spec = StreamSpecification::builder()
        .stream_enabled(true)
        .stream_view_type(StreamViewType::NewImage)
        .build()
        .unwrap();
    let table = TableDescription::builder()
        .stream_specification(spec)
        .latest_stream_arn(arn)
        .build();
    assert!(feed.adopt(&table));

    // Not read yet, or 8 KB: a whole read costs less than a GetRecords.
    assert_eq!(store.changes(None).await.unwrap(), FeedRead::Unavailable);
    feed.table_read(8 * 1024);
    assert_eq!(store.changes(None).await.unwrap(), FeedRead::Unavailable);
    assert_eq!(described.num_calls(), 0, "the stream is not looked at");
    // Over 12 KB: the stream.
    feed.table_read(13 * 1024);
    let FeedRead::Restart(position) = store.changes(None).await.unwrap() else {
        panic!("a table over 12 KB is followed through its stream");
    };
    assert_eq!(described.num_calls(), 1);
    // Back under 12 KB but over 8 KB: still followed; under 8 KB: read whole again.
    feed.table_read(10 * 1024);
    let followed = store.changes(Some(&position)).await.unwrap();
    assert!(matches!(followed, FeedRead::Changes(..)), "{followed:?}");
    assert_eq!(records.num_calls(), 1);
    feed.table_read(7 * 1024);
    assert_eq!(
        store.changes(Some(&position)).await.unwrap(),
        FeedRead::Unavailable
    );
}

/// Issue 34, item 8: an `UpdateTable` refused as transient (another worker's change under
/// way) on an `ACTIVE` table is asked again after a wait, not at once, and given up at the
/// deadline (the table used without the change), not asked forever.
#[tokio::test]
async fn a_busy_update_table_is_asked_again_after_a_wait_and_given_up_at_the_deadline() {
    use aws_sdk_dynamodb::operation::describe_table::DescribeTableOutput;
    use aws_sdk_dynamodb::types::{KeySchemaElement, KeyType, TableDescription, TableStatus};

    let describe = mock!(Client::describe_table).then_output(|| {
        let key = KeySchemaElement::builder()
            .attribute_name(schema::LEASE_KEY)
            .key_type(KeyType::Hash)
            .build()
            .unwrap();
        let table = TableDescription::builder()
            .table_name("app")
            .table_status(TableStatus::Active)
            .key_schema(key)
            .build();
        DescribeTableOutput::builder().table(table).build()
    });
    let update =
        mock!(Client::update_table).then_http_response(|| aws_error(400, "ResourceInUseException"));
    let client = client(&[&describe, &update]);
    let shape = super::table::Shape {
        create: false,
        add_index: false,
        enable_stream: true,
    };
    let wait = std::time::Duration::from_secs(2);
    let started = std::time::Instant::now();
    let ensured = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        super::table::ensure(&client, "app", super::TableBilling::OnDemand, wait, shape),
    )
    .await;
    let took = started.elapsed();
    assert!(
        ensured.is_ok(),
        "still asking after 10 s ({} UpdateTable calls)",
        update.num_calls()
    );
    let description = ensured.unwrap().unwrap();
    assert_eq!(description.table_status(), Some(&TableStatus::Active));
    assert!(took >= wait, "gave up after {took:?}");
    assert!(
        update.num_calls() <= 12,
        "{} UpdateTable calls in {took:?}",
        update.num_calls()
    );
}

/// A redrive's request is `ADD` to the parked keys, on the condition that the row still
/// parks the key, touching nothing else (no counter, no owner); a failed condition is `false`;
/// both are counted as `request_redrive`.
#[tokio::test]
async fn a_redrive_request_is_added_only_to_a_row_that_still_parks_the_key() {
    use kcl_core::lease::usage::Operation;

    let park = "00000000deadbeef/4959/0";
    let request = "00000000deadbeef/redrive/3/shardId-000000000001";
    let added = mock!(Client::update_item)
        .match_requests(move |req| {
            let values = req.expression_attribute_values().unwrap();
            let names = req.expression_attribute_names().unwrap();
            req.update_expression() == Some("ADD #parked :request")
                && req.condition_expression() == Some("contains(#parked, :parked)")
                && names.get("#parked").map(String::as_str) == Some("parkedKeys")
                && names.len() == 1
                && values.get(":request") == Some(&AttributeValue::Ss(vec![request.to_owned()]))
                && values.get(":parked") == Some(&AttributeValue::S(park.to_owned()))
                && values.len() == 2
        })
        .then_output(|| UpdateItemOutput::builder().build());
    let refused = mock!(Client::update_item)
        .then_http_response(|| aws_error(400, "ConditionalCheckFailedException"));
    let key = ShardId::new("shardId-000000000001");

    let asked = store(&[&added]);
    assert!(asked.request_redrive(&key, park, request).await.unwrap());
    assert_eq!(added.num_calls(), 1, "the request's shape");
    let unparked = store(&[&refused]);
    assert!(!unparked.request_redrive(&key, park, request).await.unwrap());
    let usage = unparked.usage().unwrap().of(Operation::RequestRedrive);
    assert_eq!(usage.requests, 1);

    let throttled =
        mock!(Client::update_item).then_http_response(|| aws_error(400, "ThrottlingException"));
    let store = self::store(&[&throttled]);
    let err = store
        .request_redrive(&key, park, request)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Throttled);
    assert_eq!(err.operation(), "request_redrive");
}
