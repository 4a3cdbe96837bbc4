//! What a Kinesis sequence number says of where it comes from. Kinesis does not document its
//! sequence numbers, but they have a layout (the one kinesalite and kinesis-mock copy, and
//! the numbers in AWS's own examples have): written in hex, 47 digits, `2` first and last,
//! the creation time of the shard (epoch seconds) in digits 1–9, the shard's index (the
//! number in `shardId-000000000001`) in digits 38–45, and its last hex digit once more in
//! digit 10. A number whose two copies of the index agree is read; any other is not (a
//! DynamoDB stream's, or a layout Kinesis changed), and nothing is concluded from it.

use kcl_core::ShardId;

/// Where a sequence number comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Origin {
    /// When its shard was created, in seconds since the epoch.
    pub(crate) shard_created: u64,
    /// Its shard's index: `shardId-{index:012}`.
    pub(crate) shard_index: u64,
}

impl Origin {
    /// The shard id of `shard_index`, as Kinesis names shards.
    pub(crate) fn shard(&self) -> ShardId {
        ShardId::new(format!("shardId-{:012}", self.shard_index))
    }

    /// When its shard was created, for messages.
    pub(crate) fn created_text(&self) -> String {
        i64::try_from(self.shard_created)
            .ok()
            .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
            .map_or_else(|| format!("{}s", self.shard_created), |t| t.to_rfc3339())
    }
}

/// What `sequence` (decimal digits) says of its shard, if it has the layout.
pub(crate) fn origin(sequence: &str) -> Option<Origin> {
    let hex = to_hex(sequence)?;
    let digits = hex.as_bytes();
    if digits.len() != 47 || digits[0] != b'2' || digits[46] != b'2' || digits[10] != digits[45] {
        return None;
    }
    Some(Origin {
        shard_created: u64::from_str_radix(hex.get(1..10)?, 16).ok()?,
        shard_index: u64::from_str_radix(hex.get(38..46)?, 16).ok()?,
    })
}

/// `decimal` in lowercase hex, without leading zeros; `None` if it is not all digits.
fn to_hex(decimal: &str) -> Option<String> {
    if decimal.is_empty() || !decimal.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Long division by 16 of the decimal digits, the remainders being the hex digits.
    let mut digits: Vec<u32> = decimal.bytes().map(|b| u32::from(b - b'0')).collect();
    let mut hex = Vec::new();
    while digits.iter().any(|d| *d != 0) {
        let mut rest = 0;
        for d in &mut digits {
            let value = rest * 10 + *d;
            *d = value / 16;
            rest = value % 16;
        }
        hex.push(char::from_digit(rest, 16)?);
        let zeros = digits.iter().take_while(|d| **d == 0).count();
        digits.drain(..zeros);
    }
    if hex.is_empty() {
        hex.push('0');
    }
    Some(hex.into_iter().rev().collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn decimal_to_hex() {
        assert_eq!(to_hex("0").unwrap(), "0");
        assert_eq!(to_hex("255").unwrap(), "ff");
        assert_eq!(
            to_hex("340282366920938463463374607431768211455").unwrap(),
            "f".repeat(32)
        );
        assert!(to_hex("12a").is_none());
    }

    #[test]
    fn a_kinesis_sequence_number_names_its_shard() {
        // From AWS's documentation: shard 6, created 2018-11-21.
        let seq = "49590338271490256608559692538361571095921575989136588898";
        let six = origin(seq).unwrap();
        assert_eq!(six.shard_index, 6);
        assert_eq!(six.shard().as_str(), "shardId-000000000006");
        assert_eq!(six.created_text(), "2018-11-21T04:57:38+00:00");
        // kinesis-mock's, shard 1.
        let seq = "49680669339115268240055844514090353283127892686695038994";
        assert_eq!(origin(seq).unwrap().shard_index, 1);
        // Not the layout: nothing concluded.
        assert!(origin("123").is_none());
        assert!(origin("49579844037727333356165064238440708846556371693205002242").is_none());
    }
}
