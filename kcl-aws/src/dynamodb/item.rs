//! An item as DynamoDB counts it in a transaction: its identity (two actions on one item are
//! refused) and its size (against the transaction's 4 MB), read off the writes a processor
//! hands to `commit_outputs`.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};

/// What a write carries that its size and item are read from.
pub(super) enum Carried<'a> {
    Put(&'a HashMap<String, AttributeValue>),
    Update(&'a Update),
    Key(&'a HashMap<String, AttributeValue>),
}

/// The table a write writes and what it carries; `None` without an action.
pub(super) fn action(write: &TransactWriteItem) -> Option<(&str, Carried<'_>)> {
    if let Some(put) = write.put() {
        return Some((put.table_name(), Carried::Put(put.item())));
    }
    if let Some(update) = write.update() {
        return Some((update.table_name(), Carried::Update(update)));
    }
    if let Some(delete) = write.delete() {
        return Some((delete.table_name(), Carried::Key(delete.key())));
    }
    write
        .condition_check()
        .map(|check| (check.table_name(), Carried::Key(check.key())))
}

/// The item's identity: the table and the key's attributes in name order, each value with
/// its type (numbers normalized, as DynamoDB compares them).
pub(super) fn canonical(table: &str, key: HashMap<&String, &AttributeValue>) -> String {
    let mut attributes: Vec<(&String, &AttributeValue)> = key.into_iter().collect();
    attributes.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = format!("{table:?}");
    for (name, value) in attributes {
        let value = match value {
            AttributeValue::S(s) => format!("S{s:?}"),
            AttributeValue::N(n) => format!("N{}", normalized(n)),
            AttributeValue::B(b) => format!("B{:?}", b.as_ref()),
            other => format!("{other:?}"),
        };
        out.push_str(&format!(" {name:?}={value}"));
    }
    out
}

/// A number's significant digits, with its sign and the position of its decimal point
/// (`1.50`, `01.5` and `1.5` are one number to DynamoDB).
fn normalized(n: &str) -> String {
    let (sign, digits) = match n.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", n.strip_prefix('+').unwrap_or(n)),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let whole = whole.trim_start_matches('0');
    let fraction = fraction.trim_end_matches('0');
    match (whole.is_empty(), fraction.is_empty()) {
        (true, true) => "0".to_owned(),
        (_, true) => format!("{sign}{whole}"),
        (_, false) => format!("{sign}{whole}.{fraction}"),
    }
}

/// An item's size as DynamoDB counts it: each attribute's name and value.
pub(super) fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter()
        .map(|(name, value)| name.len() + value_size(value))
        .sum()
}

/// A value's size as DynamoDB counts it: strings and binaries their bytes, numbers a byte
/// per two significant digits and one more, lists and maps 3 bytes and a byte per element.
pub(super) fn value_size(value: &AttributeValue) -> usize {
    let number = |n: &str| {
        let digits = normalized(n).bytes().filter(u8::is_ascii_digit).count();
        digits.div_ceil(2) + 1
    };
    match value {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => number(n),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Ss(set) => set.iter().map(String::len).sum(),
        AttributeValue::Ns(set) => set.iter().map(|n| number(n)).sum(),
        AttributeValue::Bs(set) => set.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(list) => 3 + list.iter().map(|v| value_size(v) + 1).sum::<usize>(),
        AttributeValue::M(map) => {
            3 + map
                .iter()
                .map(|(k, v)| k.len() + value_size(v) + 1)
                .sum::<usize>()
        }
        // `Bool`, `Null`, and any type newer than this code: one byte.
        _ => 1,
    }
}
