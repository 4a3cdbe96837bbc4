//! Decimal arithmetic on sequence numbers (up to 129 digits: wider than any integer type).
//!
//! Kinesis writes sequence numbers in decimal, 56 digits and more; the differences between
//! records of one shard fit in 128 bits, and they are what a value stores, so only a
//! difference and a sum are needed, digit by digit.

use crate::types::SequenceNumber;

/// Least significant first, without leading zeros.
fn digits(s: &str) -> Vec<u8> {
    let mut d: Vec<u8> = s.bytes().rev().map(|b| b - b'0').collect();
    while d.len() > 1 && d.last() == Some(&0) {
        d.pop();
    }
    d
}

fn number(mut d: Vec<u8>) -> Option<SequenceNumber> {
    while d.len() > 1 && d.last() == Some(&0) {
        d.pop();
    }
    SequenceNumber::parse(
        d.iter()
            .rev()
            .map(|d| char::from(b'0' + d))
            .collect::<String>(),
    )
}

/// `a - b`, if it is not negative and fits in 128 bits.
pub(super) fn minus(a: &SequenceNumber, b: &SequenceNumber) -> Option<u128> {
    if a < b {
        return None;
    }
    let (a, b) = (digits(a.as_str()), digits(b.as_str()));
    let mut result = Vec::with_capacity(a.len());
    let mut borrow = 0u8;
    for (i, &x) in a.iter().enumerate() {
        let y = b.get(i).copied().unwrap_or(0) + borrow;
        let (digit, next) = if x >= y { (x - y, 0) } else { (x + 10 - y, 1) };
        result.push(digit);
        borrow = next;
    }
    result
        .iter()
        .rev()
        .try_fold(0u128, |n, &d| n.checked_mul(10)?.checked_add(u128::from(d)))
}

/// `a + n`.
pub(super) fn plus(a: &SequenceNumber, n: u128) -> Option<SequenceNumber> {
    let (a, n) = (digits(a.as_str()), digits(&n.to_string()));
    let mut result = Vec::with_capacity(a.len().max(n.len()) + 1);
    let mut carry = 0u8;
    for i in 0..a.len().max(n.len()) {
        let sum = a.get(i).copied().unwrap_or(0) + n.get(i).copied().unwrap_or(0) + carry;
        result.push(sum % 10);
        carry = sum / 10;
    }
    if carry > 0 {
        result.push(carry);
    }
    number(result)
}
