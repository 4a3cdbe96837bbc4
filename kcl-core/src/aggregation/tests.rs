//! Deaggregation against records made by the reference aggregation library (PyPI
//! `aws-kinesis-agg` 1.2.3; `tests/fixtures/kpl-aggregated.json`, built by
//! `tests/fixtures/kpl-make_fixture.py`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::*;
use crate::types::SequenceNumber;

struct Case {
    name: String,
    input: Record,
    expected: Vec<(String, Option<String>, Vec<u8>)>,
}

fn cases() -> Vec<Case> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kpl-aggregated.json"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let decode = |v: &serde_json::Value| STANDARD.decode(v.as_str().unwrap()).unwrap();
    let text_of = |v: &serde_json::Value| v.as_str().map(str::to_owned);
    json.as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let mut input = Record::new(
                SequenceNumber::from(1000 + i as u128),
                text_of(&case["partition_key"]).unwrap(),
                decode(&case["data_b64"]),
            );
            if let Some(key) = text_of(&case["explicit_hash_key"]) {
                input = input.with_explicit_hash_key(key);
            }
            let expected = case["records"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        text_of(&r["partition_key"]).unwrap(),
                        text_of(&r["explicit_hash_key"]),
                        decode(&r["data_b64"]),
                    )
                })
                .collect();
            Case {
                name: text_of(&case["case"]).unwrap(),
                input,
                expected,
            }
        })
        .collect()
}

#[test]
fn every_fixture_case_yields_its_user_records_in_order() {
    let cases = cases();
    assert_eq!(cases.len(), 9, "the fixture's cases");
    for case in cases {
        let out = deaggregate(case.input.clone());
        assert_eq!(out.len(), case.expected.len(), "{}", case.name);
        let passes_through = case.name == "plain" || case.name == "bad-md5";
        for (sub, (record, (key, hash_key, data))) in out.iter().zip(&case.expected).enumerate() {
            let at = format!("{} record {sub}", case.name);
            assert_eq!(&record.partition_key, key, "{at}");
            assert_eq!(record.data.as_ref(), data.as_slice(), "{at}");
            assert_eq!(record.sequence_number, case.input.sequence_number, "{at}");
            assert_eq!(
                record.approximate_arrival, case.input.approximate_arrival,
                "{at}"
            );
            if passes_through {
                assert_eq!(record, &case.input, "{at}: passed through unchanged");
            } else {
                assert_eq!(record.sub_sequence_number, sub as u64, "{at}");
                assert_eq!(&record.explicit_hash_key, hash_key, "{at}");
            }
        }
    }
}

#[test]
fn aggregate_makes_what_the_reference_library_makes() {
    let mut compared = 0;
    for case in cases() {
        if case.name == "plain" || case.name == "bad-md5" {
            continue;
        }
        let users: Vec<_> = case
            .expected
            .iter()
            .map(|(key, hash_key, data)| (key.clone(), hash_key.clone(), Bytes::from(data.clone())))
            .collect();
        assert_eq!(aggregate(&users), case.input.data, "{}", case.name);
        compared += 1;
    }
    assert_eq!(compared, 7, "every aggregate of the fixture");
}

#[test]
fn a_bad_digest_or_body_passes_the_record_through_whole() {
    let case = cases()
        .into_iter()
        .find(|c| c.name == "ten-same-key#0")
        .unwrap();
    assert_eq!(deaggregate(case.input.clone()).len(), 10);
    // One byte of the body changed: the digest no longer matches.
    let mut data = case.input.data.to_vec();
    data[MAGIC.len() + 2] ^= 0x01;
    let tampered = Record::new(case.input.sequence_number.clone(), "orders", data);
    assert_eq!(deaggregate(tampered.clone()), vec![tampered]);
    // A body that is not an AggregatedRecord, with a matching digest.
    let body = b"\xff\xff\xff not protobuf";
    let mut data = MAGIC.to_vec();
    data.extend_from_slice(body);
    data.extend_from_slice(&Md5::digest(body));
    let garbage = Record::new(case.input.sequence_number.clone(), "orders", data);
    assert_eq!(deaggregate(garbage.clone()), vec![garbage]);
    // Too short to hold a digest.
    let short = Record::new(case.input.sequence_number.clone(), "orders", MAGIC.to_vec());
    assert_eq!(deaggregate(short.clone()), vec![short]);
    // The magic and the digest of an empty body, nothing between: KCL Java wants more than
    // a digest after the magic, so this is a user record, not an aggregate of none.
    let mut data = MAGIC.to_vec();
    data.extend_from_slice(&Md5::digest(b""));
    let bare = Record::new(case.input.sequence_number, "orders", data);
    assert_eq!(deaggregate(bare.clone()), vec![bare]);
}

#[test]
fn a_batch_keeps_its_order_across_aggregated_and_plain_records() {
    let cases = cases();
    let batch: Vec<Record> = cases.iter().map(|c| c.input.clone()).collect();
    let expected: usize = cases.iter().map(|c| c.expected.len()).sum();
    let out = deaggregate_for_shard(batch, None);
    assert_eq!(out.len(), expected);
    assert!(
        out.windows(2).all(|w| w[0].position() < w[1].position()),
        "positions strictly increase"
    );
}

#[test]
fn an_aggregate_with_a_user_record_outside_the_shards_range_is_dropped_whole() {
    let cases = cases();
    let case = cases
        .iter()
        .find(|c| c.name == "explicit-hash-keys#0")
        .unwrap();
    let keys: Vec<u128> = case
        .expected
        .iter()
        .map(|(_, key, _)| key.as_deref().unwrap().parse().unwrap())
        .collect();
    let (low, high) = (*keys.iter().min().unwrap(), *keys.iter().max().unwrap());
    assert!(low < high, "the fixture's keys spread over a range");
    let deagg = |range: HashKeyRange| deaggregate_for_shard(vec![case.input.clone()], Some(&range));
    // A shard serving every key of the aggregate: all 64 user records.
    assert_eq!(
        deagg(HashKeyRange {
            start: low,
            end: high
        })
        .len(),
        64
    );
    assert_eq!(deagg(HashKeyRange::FULL).len(), 64);
    // A child shard that lost the top key to its sibling: the whole aggregate goes.
    assert!(
        deagg(HashKeyRange {
            start: low,
            end: high - 1
        })
        .is_empty()
    );
    assert!(
        deagg(HashKeyRange {
            start: low + 1,
            end: high
        })
        .is_empty()
    );
    // Without a known range nothing is checked.
    assert_eq!(
        deaggregate_for_shard(vec![case.input.clone()], None).len(),
        64
    );

    // Partition keys count by their MD5: "orders" routes to exactly its own hash.
    let orders = cases.iter().find(|c| c.name == "ten-same-key#0").unwrap();
    let hash = u128::from_be_bytes(Md5::digest(b"orders").into());
    let only = HashKeyRange {
        start: hash,
        end: hash,
    };
    assert_eq!(
        deaggregate_for_shard(vec![orders.input.clone()], Some(&only)).len(),
        10
    );
    let beside = HashKeyRange {
        start: hash.wrapping_add(1),
        end: u128::MAX,
    };
    assert!(deaggregate_for_shard(vec![orders.input.clone()], Some(&beside)).is_empty());
    // An ordinary record is never checked: Kinesis put it in this shard.
    let plain = cases.iter().find(|c| c.name == "plain").unwrap();
    assert_eq!(
        deaggregate_for_shard(vec![plain.input.clone()], Some(&beside)).len(),
        1
    );
}

/// An aggregate of `users` (partition key index, explicit hash key index, data) over the
/// given tables, framed as the KPL frames it.
fn framed(pks: &[&str], ehks: &[&str], users: &[(u64, Option<u64>, &str)]) -> Record {
    let aggregate = AggregatedRecord {
        partition_key_table: pks.iter().map(|k| (*k).to_owned()).collect(),
        explicit_hash_key_table: ehks.iter().map(|k| (*k).to_owned()).collect(),
        records: users
            .iter()
            .map(|&(pk, ehk, data)| UserRecord {
                partition_key_index: pk,
                explicit_hash_key_index: ehk,
                data: Bytes::copy_from_slice(data.as_bytes()),
            })
            .collect(),
    };
    let body = aggregate.encode_to_vec();
    let mut data = MAGIC.to_vec();
    data.extend_from_slice(&body);
    data.extend_from_slice(&Md5::digest(&body));
    Record::new(SequenceNumber::from(5u128), "outer", data)
}

#[test]
fn an_aggregate_naming_keys_it_lacks_passes_through_whole() {
    let good = framed(&["a", "b"], &["42"], &[(0, None, "x"), (1, Some(0), "y")]);
    let users = deaggregate(good);
    assert_eq!(users.len(), 2, "the frame itself is right");
    assert_eq!(users[1].explicit_hash_key.as_deref(), Some("42"));
    for bad in [
        // A partition key index past the table.
        framed(&["a"], &[], &[(0, None, "x"), (1, None, "y")]),
        // An explicit hash key index past the table.
        framed(&["a"], &["42"], &[(0, None, "x"), (0, Some(1), "y")]),
        // An explicit hash key that is not a 128-bit number.
        framed(&["a"], &["forty-two"], &[(0, None, "x"), (0, Some(0), "y")]),
        framed(
            &["a"],
            &["340282366920938463463374607431768211456"],
            &[(0, Some(0), "x")],
        ),
    ] {
        assert_eq!(deaggregate(bad.clone()), vec![bad.clone()]);
        // With a range too: passed through, not dropped as outside it.
        let range = HashKeyRange {
            start: 1,
            end: u128::MAX,
        };
        assert_eq!(
            deaggregate_for_shard(vec![bad.clone()], Some(&range)),
            vec![bad]
        );
    }
}
