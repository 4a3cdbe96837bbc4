//! `deploy/iam-policy.json` allows every AWS action kcl-aws calls and nothing else.
//!
//! The actions are read off the source: every `client.<operation>()` of an SDK client in
//! `src/`, in PascalCase, under the IAM prefix of its service (`kinesis:` for `src/kinesis*`,
//! `dynamodb:` for `src/dynamodb/`, DynamoDB Streams included). A new SDK call without a
//! policy statement fails here, and so does a statement nobody needs any more.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::Path;

fn pascal(snake: &str) -> String {
    snake
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

/// `kinesis:ListShards`-style actions of every SDK call in `path`, a `.rs` file or a folder
/// of them (unit tests left out).
fn called(path: &Path, prefix: &str, into: &mut BTreeSet<String>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            called(&entry.unwrap().path(), prefix, into);
        }
        return;
    }
    let name = path.file_name().unwrap().to_string_lossy();
    if !name.ends_with(".rs") || name == "tests.rs" {
        return;
    }
    let text: String = std::fs::read_to_string(path)
        .unwrap()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    for call in text.split("client.").skip(1) {
        let Some((operation, _)) = call.split_once("()") else {
            continue;
        };
        let snake = operation
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '_');
        if snake && !operation.is_empty() {
            into.insert(format!("{prefix}:{}", action(&pascal(operation))));
        }
    }
}

/// The IAM action an SDK operation needs on the lease table. There is no
/// `dynamodb:TransactWriteItems`: IAM authorizes each action of a transaction by its own
/// permission, and kcl's action in one is the lease row's update (the processor's output
/// tables need what its own writes do: docs/exactly-once.md).
fn action(operation: &str) -> &str {
    match operation {
        "TransactWriteItems" => "UpdateItem",
        other => other,
    }
}

fn allowed(policy: &serde_json::Value) -> BTreeSet<String> {
    let mut actions = BTreeSet::new();
    for statement in policy["Statement"].as_array().unwrap() {
        assert_eq!(statement["Effect"], "Allow", "{statement}");
        match &statement["Action"] {
            serde_json::Value::String(action) => {
                actions.insert(action.clone());
            }
            serde_json::Value::Array(list) => {
                actions.extend(list.iter().map(|a| a.as_str().unwrap().to_owned()));
            }
            other => panic!("Action {other}"),
        }
    }
    actions
}

/// The policy in `deploy/<file>`: what it allows.
fn policy(file: &str) -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("deploy")
        .join(file);
    allowed(&serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap())
}

/// Fails naming what `file` lacks of `calls`, and what it allows beyond them.
fn exactly(file: &str, calls: &BTreeSet<String>) {
    let allowed = policy(file);
    let missing: Vec<_> = calls.difference(&allowed).collect();
    let unused: Vec<_> = allowed.difference(calls).collect();
    assert!(
        missing.is_empty(),
        "kcl-aws calls, {file} does not allow: {missing:?}"
    );
    assert!(
        unused.is_empty(),
        "{file} allows, kcl-aws never calls: {unused:?}"
    );
}

#[test]
fn the_dynamodb_streams_policy_allows_exactly_what_its_source_and_the_lease_table_call() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut calls = BTreeSet::new();
    called(&src.join("dynamodb"), "dynamodb", &mut calls);
    called(&src.join("streams"), "dynamodb", &mut calls);
    assert!(calls.contains("dynamodb:DescribeStream"), "{calls:?}");
    exactly("iam-policy-dynamodb-streams.json", &calls);
}

#[test]
fn the_policy_allows_exactly_what_kcl_aws_calls() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut calls = BTreeSet::new();
    called(&src.join("dynamodb"), "dynamodb", &mut calls);
    called(&src.join("kinesis"), "kinesis", &mut calls);
    assert!(calls.contains("kinesis:GetRecords"), "{calls:?}");
    assert!(calls.contains("dynamodb:UpdateItem"), "{calls:?}");

    exactly("iam-policy.json", &calls);
}
