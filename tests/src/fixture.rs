//! DynamoDB wire JSON (`{"S": "…"}`, `{"N": "…"}`, …) to SDK values, for fixtures captured
//! from KCL Java.

use std::collections::HashMap;

use anyhow::{Context as _, bail};
use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

/// One item.
pub type Item = HashMap<String, AttributeValue>;

/// Converts one wire-JSON item.
pub fn item(json: &Value) -> anyhow::Result<Item> {
    let object = json.as_object().context("an item is a JSON object")?;
    object
        .iter()
        .map(|(name, v)| {
            Ok((
                name.clone(),
                value(v).with_context(|| format!("attribute {name}"))?,
            ))
        })
        .collect()
}

/// Converts one wire-JSON attribute value.
pub fn value(json: &Value) -> anyhow::Result<AttributeValue> {
    let object = json.as_object().context("a value is a JSON object")?;
    let Some((kind, v)) = object.iter().next() else {
        bail!("empty attribute value");
    };
    let strings = |v: &Value| -> anyhow::Result<Vec<String>> {
        v.as_array()
            .context("a set is an array")?
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_owned)
                    .context("set members are strings")
            })
            .collect()
    };
    Ok(match kind.as_str() {
        "S" => AttributeValue::S(v.as_str().context("S is a string")?.to_owned()),
        "N" => AttributeValue::N(v.as_str().context("N is a string")?.to_owned()),
        "SS" => AttributeValue::Ss(strings(v)?),
        "NS" => AttributeValue::Ns(strings(v)?),
        "BOOL" => AttributeValue::Bool(v.as_bool().context("BOOL is a bool")?),
        "NULL" => AttributeValue::Null(true),
        "L" => AttributeValue::L(
            v.as_array()
                .context("L is an array")?
                .iter()
                .map(value)
                .collect::<anyhow::Result<_>>()?,
        ),
        "M" => AttributeValue::M(item(v)?),
        other => bail!("unsupported attribute type {other}"),
    })
}

/// The DynamoDB type letter of a value (`S`, `N`, `SS`, …).
pub fn type_of(v: &AttributeValue) -> &'static str {
    match v {
        AttributeValue::S(_) => "S",
        AttributeValue::N(_) => "N",
        AttributeValue::B(_) => "B",
        AttributeValue::Ss(_) => "SS",
        AttributeValue::Ns(_) => "NS",
        AttributeValue::Bs(_) => "BS",
        AttributeValue::Bool(_) => "BOOL",
        AttributeValue::Null(_) => "NULL",
        AttributeValue::L(_) => "L",
        AttributeValue::M(_) => "M",
        _ => "?",
    }
}
