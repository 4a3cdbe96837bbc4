#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stdout)]

use super::*;

/// A sequence number laid out as Kinesis writes them (47 hex digits, 56 decimal ones; the
/// fields read off real ones such as `49590338271490256608559692538361571095921575989136588898`):
/// version 2, the shard's creation second, the shard's index, the second's index in the
/// shard, a byte, the arrival second, and the record's place in its second (real records of
/// one `PutRecords` call are 66 apart there).
fn kinesis(second: u64, in_second: u64) -> SequenceNumber {
    let hex = format!(
        "2{:09x}{:01x}{:016x}{:02x}{:09x}{:09x}",
        1_542_776_258u64,
        6,
        0x6764_8a17 + second,
        0,
        1_545_084_650 + second,
        0x62 + 66 * in_second,
    );
    let mut decimal = vec![0u8]; // least significant first
    for h in hex.chars() {
        let mut carry = h.to_digit(16).unwrap();
        for d in &mut decimal {
            let v = u32::from(*d) * 16 + carry;
            *d = (v % 10) as u8;
            carry = v / 10;
        }
        while carry > 0 {
            decimal.push((carry % 10) as u8);
            carry /= 10;
        }
    }
    let text: String = decimal.iter().rev().map(|d| char::from(b'0' + d)).collect();
    SequenceNumber::parse(text).unwrap()
}

/// Records arriving one a second: every difference crosses a second (the largest there are).
fn at(record: u64, sub: u64) -> ExtendedSequenceNumber {
    ExtendedSequenceNumber {
        sequence: kinesis(record, 0),
        sub_sequence: sub,
    }
}

/// Records arriving 1,000 a second.
fn busy(record: u64) -> ExtendedSequenceNumber {
    ExtendedSequenceNumber::new(kinesis(record / 1000, record % 1000))
}

fn checkpoint(record: u64) -> Checkpoint {
    Checkpoint::Sequence(at(record, 0))
}

#[test]
fn real_looking_sequence_numbers_have_56_digits_and_order_by_record() {
    assert_eq!(
        kinesis(0, 0).as_str(),
        "49590338271490256608559692538361571095921575989136588898",
        "the layout gives back a real one"
    );
    assert_eq!(kinesis(1, 1).as_str().len(), 56);
    assert!(at(2, 0) > at(1, 7));
    assert!(busy(1001) > busy(999));
    assert!(at(1, 7) > at(1, 6));
}

#[test]
fn runs_round_trip_with_sub_sequence_numbers() {
    let set = SparseAcks::from_runs([
        (at(12, 0), at(12, 0)),
        (at(14, 0), at(20, 0)),
        // Inside one aggregate, and from an aggregate's middle into the next record.
        (at(30, 2), at(30, 5)),
        (at(31, 3), at(33, 0)),
        (at(40, 9), at(40, 9)),
    ]);
    let base = checkpoint(10);
    let value = set.encode(&base).unwrap();
    let back = SparseAcks::decode(&value, &base).unwrap();
    assert_eq!(back, set);
    assert!(back.contains(&at(12, 0)));
    assert!(!back.contains(&at(13, 0)));
    assert!(back.contains(&at(17, 0)));
    assert!(back.contains(&at(30, 4)));
    assert!(!back.contains(&at(30, 6)));
    assert!(back.contains(&at(32, 0)));
    assert!(!back.contains(&at(40, 8)));
    assert_eq!(back.highest(), Some(&at(40, 9)));
    assert_eq!(back.runs().len(), 5);
    assert!(
        value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    );
}

#[test]
fn a_value_before_the_first_checkpoint_round_trips() {
    let set = SparseAcks::from_runs([(at(3, 0), at(5, 0)), (at(8, 1), at(8, 1))]);
    for base in [
        Checkpoint::TrimHorizon,
        Checkpoint::Latest,
        Checkpoint::AtTimestamp,
    ] {
        let value = set.encode(&base).unwrap();
        assert_eq!(SparseAcks::decode(&value, &base).unwrap(), set, "{base}");
    }
    assert_eq!(set.encode(&Checkpoint::ShardEnd), None);
}

#[test]
fn overlapping_runs_merge_and_touching_ones_stay_apart() {
    let set = SparseAcks::from_runs([
        (at(5, 0), at(9, 0)),
        (at(1, 0), at(3, 0)),
        (at(3, 0), at(4, 0)),
        (at(7, 0), at(12, 0)),
    ]);
    let runs: Vec<_> = set.runs().map(|(a, b)| (a.clone(), b.clone())).collect();
    assert_eq!(runs, vec![(at(1, 0), at(4, 0)), (at(5, 0), at(12, 0))]);
    let other = SparseAcks::from_runs([(at(13, 0), at(13, 0))]);
    assert_eq!(set.union(&other).runs().len(), 3);
}

#[test]
fn a_moving_checkpoint_drops_what_it_passed() {
    let set = SparseAcks::from_runs([(at(12, 0), at(12, 0)), (at(14, 0), at(20, 0))]);
    assert_eq!(set.clone().past(&checkpoint(10)), set);
    let past = set.clone().past(&checkpoint(16));
    assert_eq!(
        past.runs()
            .map(|(a, b)| (a.clone(), b.clone()))
            .collect::<Vec<_>>(),
        vec![(at(16, 0), at(20, 0))]
    );
    assert!(set.clone().past(&checkpoint(20)).is_empty());
    assert!(set.clone().past(&Checkpoint::ShardEnd).is_empty());
    assert_eq!(
        set.encode(&checkpoint(20)),
        None,
        "nothing past it: removed"
    );
    let value = set.encode(&checkpoint(16)).unwrap();
    assert_eq!(
        SparseAcks::decode(&value, &checkpoint(16)).unwrap(),
        past,
        "written with the checkpoint it goes with"
    );
}

#[test]
fn a_full_set_keeps_the_runs_nearest_the_checkpoint() {
    // Every other record finished: 1,000 single-record runs.
    let set = SparseAcks::from_runs((0..1000).map(|i| (at(2 * i + 2, 0), at(2 * i + 2, 0))));
    let base = checkpoint(0);
    let (value, kept) = set.encode_within(&base, SparseAcks::MAX_ENCODED);
    let value = value.unwrap();
    assert!(value.len() <= SparseAcks::MAX_ENCODED);
    assert!(kept > 50 && kept < 1000, "kept {kept}");
    let back = SparseAcks::decode(&value, &base).unwrap();
    assert_eq!(back.runs().len(), kept);
    assert!(back.contains(&at(2, 0)), "the nearest kept");
    assert!(!back.contains(&at(2000, 0)), "the furthest left out");
    let highest = back.highest().unwrap();
    assert_eq!(*highest, at(2 * kept as u64, 0));
    // Every bound is kept, to the character.
    for max in [60, 61, 62, 63, 100, 101] {
        let (value, kept) = set.encode_within(&base, max);
        let value = value.unwrap();
        assert!(value.len() <= max, "{} > {max}", value.len());
        assert_eq!(
            SparseAcks::decode(&value, &base).unwrap().runs().len(),
            kept
        );
    }
    assert_eq!(
        set.encode_within(&base, 50),
        (None, 0),
        "not even one run fits"
    );
}

/// Characters of a value with `runs`, less those of one with the first run only, per run
/// after the first; and how many fit in the bound.
fn per_run(
    base: &Checkpoint,
    runs: &[(ExtendedSequenceNumber, ExtendedSequenceNumber)],
) -> (f64, usize) {
    let chars = |runs: &[(ExtendedSequenceNumber, ExtendedSequenceNumber)]| {
        let set = SparseAcks::from_runs(runs.to_vec());
        set.encode_within(base, usize::MAX).0.unwrap().len()
    };
    let each = (chars(runs) - chars(&runs[..1])) as f64 / (runs.len() - 1) as f64;
    let set = SparseAcks::from_runs(runs.to_vec());
    (each, set.encode_within(base, SparseAcks::MAX_ENCODED).1)
}

#[test]
fn sizes_of_real_looking_sequence_numbers() {
    let base = checkpoint(0);
    let header = SparseAcks::from_runs([(at(1, 0), at(1, 0))])
        .encode(&base)
        .unwrap();
    let singles: Vec<_> = (1..=1000).map(|i| (at(2 * i, 0), at(2 * i, 0))).collect();
    let (single, singles_fit) = per_run(&base, &singles);
    let runs: Vec<_> = (1..=1000)
        .map(|i| (at(10 * i + 1, 0), at(10 * i + 9, 0)))
        .collect();
    let (run, runs_fit) = per_run(&base, &runs);
    let subs: Vec<_> = (1..=1000).map(|i| (at(5, 2 * i), at(5, 2 * i))).collect();
    let (sub, _) = per_run(&base, &subs);
    let busy_base = Checkpoint::Sequence(busy(0));
    let busy_singles: Vec<_> = (1..=1000).map(|i| (busy(2 * i), busy(2 * i))).collect();
    let (busy_single, busy_singles_fit) = per_run(&busy_base, &busy_singles);
    let busy_runs: Vec<_> = (1..=1000)
        .map(|i| (busy(10 * i + 1), busy(10 * i + 9)))
        .collect();
    let (busy_run, busy_runs_fit) = per_run(&busy_base, &busy_runs);
    println!(
        "kclAcked, 56-digit sequence numbers, in characters: {} for the checkpoint and one \
         record; a further single record {single:.1} and a run {run:.1} at one record a \
         second, {busy_single:.1} and {busy_run:.1} at 1,000 a second; a user record of an \
         aggregate {sub:.1}. In {} characters: {singles_fit} singles or {runs_fit} runs at \
         one a second, {busy_singles_fit} or {busy_runs_fit} at 1,000 a second",
        header.len(),
        SparseAcks::MAX_ENCODED
    );
    assert!(
        single <= 20.0 && run <= 40.0 && sub <= 4.0,
        "{single} {run} {sub}"
    );
    assert!(
        busy_single <= 5.0 && busy_run <= 9.0,
        "{busy_single} {busy_run}"
    );
    assert!(singles_fit >= 100 && runs_fit >= 50);
}

#[test]
fn a_value_written_with_another_checkpoint_is_stale() {
    let set = SparseAcks::from_runs([(at(12, 0), at(12, 0))]);
    let value = set.encode(&checkpoint(10)).unwrap();
    assert!(matches!(
        SparseAcks::decode(&value, &checkpoint(11)),
        Err(SparseAcksError::Stale { .. })
    ));
    assert!(matches!(
        SparseAcks::decode(&value, &Checkpoint::TrimHorizon),
        Err(SparseAcksError::Stale { .. })
    ));
    let before = set.encode(&Checkpoint::TrimHorizon).unwrap();
    assert!(matches!(
        SparseAcks::decode(&before, &Checkpoint::Latest),
        Err(SparseAcksError::Stale { .. })
    ));
}

#[test]
fn corrupt_values_are_errors_never_panics() {
    let base = checkpoint(10);
    let set = SparseAcks::from_runs([(at(12, 0), at(12, 0)), (at(14, 1), at(20, 3))]);
    let value = set.encode(&base).unwrap();
    for bad in ["", "!", "a", "AAAA=", "not base64 at all"] {
        assert!(SparseAcks::decode(bad, &base).is_err(), "{bad:?}");
    }
    // Every truncation, and every character changed: an error or another set, never a panic.
    let bytes = base64::decode(&value).unwrap();
    for end in 0..bytes.len() {
        let cut = base64::encode(&bytes[..end]);
        let _ = SparseAcks::decode(&cut, &base);
    }
    for i in 0..bytes.len() {
        for flip in [0x01, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= flip;
            let _ = SparseAcks::decode(&base64::encode(&b), &base);
        }
    }
    // Runs out of order, a run ending before it starts.
    let mut backwards = bytes[..31].to_vec();
    put_varint(&mut backwards, 0);
    put_varint(&mut backwards, 1);
    assert!(matches!(
        SparseAcks::decode(
            &base64::encode(&[bytes.clone(), backwards[31..].to_vec()].concat()),
            &base
        ),
        Err(SparseAcksError::Malformed(_))
    ));
    let mut empty_run = bytes[..31].to_vec();
    put_varint(&mut empty_run, 5);
    put_varint(&mut empty_run, 0);
    put_varint(&mut empty_run, 0);
    put_varint(&mut empty_run, 0);
    assert!(SparseAcks::decode(&base64::encode(&empty_run), &base).is_err());
    assert!(matches!(
        SparseAcks::decode(&base64::encode(&[9]), &base),
        Err(SparseAcksError::Malformed("unknown tag"))
    ));
}

#[test]
fn base64_round_trips_every_length() {
    for n in 0..40u8 {
        let bytes: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
        assert_eq!(base64::decode(&base64::encode(&bytes)).unwrap(), bytes);
    }
    assert_eq!(base64::encode(b"\xfb\xff"), "-_8");
    assert!(base64::decode("-_9").is_none(), "stray low bits");
}

#[test]
fn decimal_differences_wider_than_any_integer() {
    let a = kinesis(5, 0);
    let b = kinesis(9, 7);
    let d = decimal::minus(&b, &a).unwrap();
    assert_eq!(d, (4u128 << 80) + (4u128 << 36) + 66 * 7);
    assert_eq!(decimal::plus(&a, d).unwrap(), b);
    assert_eq!(decimal::minus(&a, &b), None);
    let huge = SequenceNumber::parse("1".repeat(60)).unwrap();
    let one = SequenceNumber::parse("1").unwrap();
    assert_eq!(decimal::minus(&huge, &one), None, "past 128 bits");
    assert_eq!(
        decimal::plus(&SequenceNumber::parse("999").unwrap(), 1).unwrap(),
        SequenceNumber::parse("1000").unwrap()
    );
}

fn runs_of(set: &SparseAcks) -> Vec<(ExtendedSequenceNumber, ExtendedSequenceNumber)> {
    set.runs().map(|(a, b)| (a.clone(), b.clone())).collect()
}

#[test]
fn the_watermark_gives_the_runs_finished_past_it() {
    let w = std::sync::Arc::new(Watermark::default());
    let mut acks = w
        .reserve(Some(at(0, 0)), (1..=6).map(|i| at(i, 0)))
        .into_acks();
    let sixth = acks.pop().unwrap();
    let fifth = acks.pop().unwrap();
    let _fourth = acks.pop().unwrap();
    let third = acks.pop().unwrap();
    let second = acks.pop().unwrap();
    second.done();
    third.done();
    fifth.done();
    assert_eq!(w.finished_ever(), 3);
    let set = w.sparse(&checkpoint(0));
    assert_eq!(
        runs_of(&set),
        vec![(at(2, 0), at(3, 0)), (at(5, 0), at(5, 0))]
    );
    assert!(w.sparse(&Checkpoint::ShardEnd).is_empty());
    sixth.done();
    assert_eq!(runs_of(&w.sparse(&checkpoint(0)))[1], (at(5, 0), at(6, 0)));
    drop(acks);
}

#[test]
fn inherited_records_are_skipped_carried_on_and_joined() {
    let w = std::sync::Arc::new(Watermark::default());
    w.inherit(SparseAcks::from_runs([
        (at(2, 0), at(2, 0)),
        (at(4, 0), at(4, 0)),
    ]));
    assert!(w.finished_before(&at(2, 0)));
    assert!(!w.finished_before(&at(3, 0)));
    assert!(!w.finished_before(&at(9, 0)), "past the highest");
    // 1 and 3 delivered again, 2 skipped: 3 comes after 2.
    let pairs = [(Some(at(0, 0)), at(1, 0), 0), (Some(at(2, 0)), at(3, 0), 1)];
    let mut acks = w.reserve_each(pairs.into_iter()).into_acks();
    assert_eq!(w.held(), 3, "1, 2 (skipped) and 3 behind the unfinished 1");
    w.skipped(1);
    assert_eq!(w.held(), 4, "and 4, skipped after them");
    assert_eq!(
        runs_of(&w.sparse(&checkpoint(0))),
        vec![(at(2, 0), at(2, 0)), (at(4, 0), at(4, 0))],
        "the inherited ones, carried on"
    );
    acks.pop().unwrap().done();
    assert_eq!(
        runs_of(&w.sparse(&checkpoint(0))),
        vec![(at(2, 0), at(3, 0)), (at(4, 0), at(4, 0))],
        "3 joins the skipped 2 before it"
    );
    acks.pop().unwrap().done();
    assert_eq!(w.position(Some(&at(3, 0))), Some(at(3, 0)));
    assert_eq!(w.held(), 0, "nothing unfinished: nothing held");
    assert_eq!(
        runs_of(&w.sparse(&checkpoint(3))),
        vec![(at(4, 0), at(4, 0))],
        "passed by the checkpoint: gone"
    );
}
