//! Sizes, items, refusals before sending and the reading of cancellation reasons (no
//! network: the emulator tests are `tests/tests/transact.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{ConditionCheck, Delete, Put};
use aws_sdk_dynamodb::{Client, Config};

use super::*;

fn store() -> DynamoDbLeaseStore {
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .build();
    DynamoDbLeaseStore::from_client(Client::from_conf(config), "app")
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

fn put(table: &str, id: &str, extra: &[(&str, AttributeValue)]) -> TransactWriteItem {
    let mut put = Put::builder().table_name(table).item("id", s(id));
    for (name, value) in extra {
        put = put.item(*name, value.clone());
    }
    TransactWriteItem::builder()
        .put(put.build().unwrap())
        .build()
}

fn add(table: &str, id: &str) -> TransactWriteItem {
    let update = Update::builder()
        .table_name(table)
        .key("id", s(id))
        .update_expression("ADD #n :one")
        .expression_attribute_names("#n", "n")
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .build()
        .unwrap();
    TransactWriteItem::builder().update(update).build()
}

fn delete(table: &str, id: &str) -> TransactWriteItem {
    let delete = Delete::builder()
        .table_name(table)
        .key("id", s(id))
        .build()
        .unwrap();
    TransactWriteItem::builder().delete(delete).build()
}

fn check(table: &str, id: &str) -> TransactWriteItem {
    let check = ConditionCheck::builder()
        .table_name(table)
        .key("id", s(id))
        .condition_expression("attribute_exists(id)")
        .build()
        .unwrap();
    TransactWriteItem::builder().condition_check(check).build()
}

#[test]
fn limits_leave_the_lease_row_one_action_and_the_largest_item() {
    let limits = store().limits();
    assert_eq!(limits.writes, 99);
    assert_eq!(limits.bytes, 4_000_000 - 409_600);
}

#[test]
fn sizes_count_names_and_values_as_dynamodb_does() {
    let store = store();
    // "id" 2 + "k-1" 3; "n" 1 + 12345 (5 digits: 3 bytes + 1); "ok" 2 + 1; "b" 1 + 4 bytes.
    let write = put(
        "out",
        "k-1",
        &[
            ("n", AttributeValue::N("12345".into())),
            ("ok", AttributeValue::Bool(true)),
            ("b", AttributeValue::B(vec![1, 2, 3, 4].into())),
        ],
    );
    assert_eq!(store.measure(&write).bytes, 5 + 5 + 3 + 5);
    // A list: 3 bytes, and each element with one byte more.
    let list = AttributeValue::L(vec![s("ab"), AttributeValue::N("7".into())]);
    assert_eq!(value_size(&list), 3 + (2 + 1) + (2 + 1));
    // The update's key, the names it uses and the values it sets.
    assert_eq!(store.measure(&add("out", "k-1")).bytes, 5 + 1 + 2);
    assert_eq!(store.measure(&delete("out", "k-1")).bytes, 5);
}

#[test]
fn a_write_names_its_item_by_table_and_key() {
    let store = store();
    let item = |w: &TransactWriteItem| store.measure(w).item;
    let update = item(&add("out", "k-1")).unwrap();
    assert_eq!(item(&delete("out", "k-1")), Some(update.clone()));
    assert_eq!(item(&check("out", "k-1")), Some(update.clone()));
    assert_ne!(item(&add("out", "k-2")), Some(update.clone()));
    assert_ne!(item(&add("other", "k-1")), Some(update.clone()));
    // A put names its item once the store knows the table's key.
    assert_eq!(item(&put("out", "k-1", &[])), None);
    let store = store.with_output_table("out", &["id"]);
    let extra = [("n", AttributeValue::N("3".into()))];
    assert_eq!(store.measure(&put("out", "k-1", &extra)).item, Some(update));
    // Numbers are one number however written.
    let key = |n: &str| {
        let key = HashMap::from([("n".to_owned(), AttributeValue::N(n.to_owned()))]);
        canonical("t", key.iter().collect())
    };
    assert_eq!(key("01.50"), key("1.5"));
    assert_ne!(key("15"), key("1.5"));
    assert_eq!(key("-0.0"), key("0"));
}

#[test]
fn writes_to_the_lease_table_are_refused_before_sending() {
    let store = store();
    // Invalid, naming the write: its record fails, not the commit for ever.
    let fatal = |writes: &[TransactWriteItem]| match store.check_writes(writes) {
        Err(CommitError::Invalid {
            index: Some(_),
            reason,
        }) => reason,
        other => panic!("{other:?}"),
    };
    let message = fatal(&[add("out", "a"), put("app", "shardId-0", &[])]);
    assert!(
        message.contains("output write 1 writes table app, the lease table"),
        "{message}"
    );
    let arn = "arn:aws:dynamodb:us-east-1:123456789012:table/app";
    assert!(fatal(&[delete(arn, "x")]).contains("output write 0"));
    assert!(fatal(&[TransactWriteItem::builder().build()]).contains("no action"));
    assert!(
        store
            .check_writes(&[add("out", "a"), check("app-out", "b")])
            .is_ok()
    );
}

fn reasons(codes: &[&str]) -> Vec<CancellationReason> {
    codes
        .iter()
        .map(|code| {
            CancellationReason::builder()
                .code(*code)
                .message("m")
                .build()
        })
        .collect()
}

fn read(codes: &[&str], writes: usize) -> CommitError {
    Verdict::cancelled(&reasons(codes), writes).into_error("test")
}

fn kind(error: &CommitError) -> Option<ErrorKind> {
    match error {
        CommitError::Store(e) => Some(e.kind()),
        _ => None,
    }
}

#[test]
fn cancellation_reasons_decide_the_answer() {
    // The lease row is the last action.
    let lease_row = read(&["None", "None", "ConditionalCheckFailed"], 2);
    assert!(matches!(lease_row, CommitError::LeaseRow), "{lease_row:?}");
    // It wins over a write's own refusal and over an invalid write.
    let both = read(
        &[
            "ValidationError",
            "ConditionalCheckFailed",
            "ConditionalCheckFailed",
        ],
        2,
    );
    assert!(matches!(both, CommitError::LeaseRow), "{both:?}");
    // The first write refused, by its index.
    let refused = read(
        &[
            "None",
            "ConditionalCheckFailed",
            "ConditionalCheckFailed",
            "None",
        ],
        3,
    );
    match refused {
        CommitError::Refused { index, reason } => {
            assert_eq!(index, 1);
            assert!(
                reason.contains("output write 1: ConditionalCheckFailed"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    let conflict = read(&["None", "TransactionConflict"], 1);
    assert_eq!(kind(&conflict), Some(ErrorKind::Retryable));
    assert!(
        conflict
            .to_string()
            .contains("the lease row: TransactionConflict"),
        "{conflict}"
    );
    assert_eq!(
        kind(&read(&["TransactionConflict", "None"], 1)),
        Some(ErrorKind::Retryable)
    );
    let throttled = read(&["ThrottlingError", "TransactionConflict"], 1);
    assert_eq!(kind(&throttled), Some(ErrorKind::Throttled));
    assert_eq!(
        kind(&read(&["ProvisionedThroughputExceeded", "None"], 1)),
        Some(ErrorKind::Throttled)
    );
    // A refusal is not retried away: it wins over a conflict.
    let refused = read(
        &["TransactionConflict", "ConditionalCheckFailed", "None"],
        2,
    );
    assert!(
        matches!(refused, CommitError::Refused { index: 1, .. }),
        "{refused:?}"
    );
    // An invalid write: named by its index, over a write refused by its condition.
    let invalid = read(
        &["None", "ValidationError", "ConditionalCheckFailed", "None"],
        3,
    );
    match &invalid {
        CommitError::Invalid {
            index: Some(1),
            reason,
        } => assert!(
            reason.contains("output write 1: ValidationError m"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    // Nothing a retry can fix and no write's fault: the store's error (an outage), over an
    // invalid write too; the lease row's update invalid is no write's fault either.
    for codes in [
        &["ItemCollectionSizeLimitExceeded", "None"][..],
        &["ValidationError", "SomethingNew", "None"],
        &["None", "ValidationError"],
    ] {
        let error = read(codes, codes.len() - 1);
        assert_eq!(kind(&error), Some(ErrorKind::Fatal), "{codes:?}: {error:?}");
    }
    // No reason at all: retried, then the core reads the row.
    assert_eq!(kind(&read(&[], 1)), Some(ErrorKind::Retryable));
}

/// A client whose `TransactWriteItems` answers `status` with `body` (DynamoDB's JSON error),
/// through the SDK's own deserializer.
fn answering(status: u16, body: String) -> Client {
    use aws_sdk_dynamodb::config::http::HttpResponse;
    use aws_smithy_mocks::{MockResponseInterceptor, RuleMode, create_mock_http_client, mock};
    let rule = mock!(Client::transact_write_items).then_http_response(move || {
        let status = aws_smithy_runtime_api::http::StatusCode::try_from(status).unwrap();
        HttpResponse::new(status, aws_smithy_types::body::SdkBody::from(body.clone()))
    });
    let interceptor = MockResponseInterceptor::new()
        .rule_mode(RuleMode::MatchAny)
        .with_rule(&rule);
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled())
        .http_client(create_mock_http_client())
        .interceptor(interceptor)
        .build();
    Client::from_conf(config)
}

/// What a commit of two output writes and the lease row maps DynamoDB's answer to.
async fn answer(status: u16, code: &str, extra: &str) -> CommitError {
    let body = format!(
        r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{code}","message":"from the test"{extra}}}"#
    );
    let sent = answering(status, body)
        .transact_write_items()
        .set_transact_items(Some(vec![
            add("out", "a"),
            add("out", "b"),
            add("app", "s"),
        ]))
        .send()
        .await;
    let error = sent.expect_err("an error answer");
    Verdict::of(error, 2, "token", "test").into_error("test")
}

#[tokio::test]
async fn validation_exceptions_are_invalid_and_outages_are_the_stores_error() {
    // The request refused whole: invalid, no write named.
    let large = answer(400, "ValidationException", "").await;
    assert!(
        matches!(&large, CommitError::Invalid { index: None, reason } if reason.contains("ValidationException: from the test")),
        "{large:?}"
    );
    // Two actions on one item: invalid too, saying how to avoid it.
    let body = format!(r#","Message":"Transaction request cannot include {ONE_ITEM_TWICE}""#);
    let twice = answer(400, "ValidationException", &body).await;
    match &twice {
        CommitError::Invalid {
            index: None,
            reason,
        } => assert!(reason.contains("with_output_table"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // A cancellation reason naming the write.
    let reasons = r#","CancellationReasons":[{"Code":"None"},{"Code":"ValidationError","Message":"Item size has exceeded the maximum allowed size"},{"Code":"None"}]"#;
    let named = answer(400, "TransactionCanceledException", reasons).await;
    match &named {
        CommitError::Invalid {
            index: Some(1),
            reason,
        } => assert!(reason.contains("Item size has exceeded"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // A table missing, a token reused, access denied: an outage, the store's error, whose
    // records must not be given up.
    for code in [
        "ResourceNotFoundException",
        "IdempotentParameterMismatchException",
        "AccessDeniedException",
    ] {
        let error = answer(400, code, "").await;
        assert_eq!(kind(&error), Some(ErrorKind::Fatal), "{code}: {error:?}");
    }
    let busy = answer(500, "InternalServerError", "").await;
    assert_eq!(kind(&busy), Some(ErrorKind::Retryable), "{busy:?}");
}
