//! DynamoDB streams in kcl's multi-stream mode, keyed as the Java adapter keys them, so that
//! an adapter fleet reading several tables moves over with its checkpoints.
//!
//! The adapter names a stream `account:region$account$table$label:1`: the table and the
//! stream's label (its creation time, `:` written `_`) in the name, and a creation epoch that
//! is always 1. A lease key is that, `:`, and the shard id.

use aws_config::SdkConfig;
use kcl_core::multi_stream::StreamId;

use super::DynamoDbStreamsSource;

/// The parts of a DynamoDB stream ARN
/// (`arn:PARTITION:dynamodb:REGION:ACCOUNT:table/TABLE/stream/LABEL`).
struct Arn<'a> {
    partition: &'a str,
    region: &'a str,
    account: &'a str,
    table: &'a str,
    label: &'a str,
}

impl<'a> Arn<'a> {
    fn parse(arn: &'a str) -> Option<Self> {
        let mut parts = arn.splitn(6, ':');
        let (Some("arn"), Some(partition), Some("dynamodb"), Some(region), Some(account)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let (table, label) = parts
            .next()?
            .strip_prefix("table/")?
            .split_once("/stream/")?;
        let fields = [partition, region, account, table, label];
        (fields.iter().all(|f| !f.is_empty()) && !label.contains('_')).then_some(Self {
            partition,
            region,
            account,
            table,
            label,
        })
    }
}

/// The table of a DynamoDB stream ARN; `None` if `arn` is not one.
pub fn table_of(arn: &str) -> Option<&str> {
    Arn::parse(arn).map(|a| a.table)
}

/// The adapter's multi-stream id of the stream `arn`; `None` if `arn` is not a DynamoDB
/// stream ARN.
///
/// ```
/// use kcl_aws::streams::{stream_arn, stream_id};
/// let arn = "arn:aws:dynamodb:us-west-2:123456789012:table/TestTable/stream/2024-02-03T00:00:00.000";
/// let id = stream_id(arn).unwrap();
/// assert_eq!(
///     id.to_string(),
///     "123456789012:us-west-2$123456789012$TestTable$2024-02-03T00_00_00.000:1"
/// );
/// assert_eq!(stream_arn(&id).as_deref(), Some(arn));
/// ```
pub fn stream_id(arn: &str) -> Option<StreamId> {
    let a = Arn::parse(arn)?;
    let name = format!(
        "{}${}${}${}",
        a.region,
        a.account,
        a.table,
        a.label.replace(':', "_")
    );
    // The partition is not in the id; it follows from the region (see `stream_arn`).
    (partition_of(a.region) == a.partition).then(|| StreamId::new(a.account, name, 1))
}

/// The stream ARN of an id made by [`stream_id`]; `None` for any other id.
pub fn stream_arn(id: &StreamId) -> Option<String> {
    let mut parts = id.name.split('$');
    let (Some(region), Some(account), Some(table), Some(label), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    if account != id.account || id.creation_epoch != 1 {
        return None;
    }
    let arn = format!(
        "arn:{}:dynamodb:{region}:{account}:table/{table}/stream/{}",
        partition_of(region),
        label.replace('_', ":")
    );
    Arn::parse(&arn).is_some().then_some(arn)
}

/// The AWS partition of `region`.
fn partition_of(region: &str) -> &'static str {
    if region.starts_with("cn-") {
        "aws-cn"
    } else if region.starts_with("us-gov-") {
        "aws-us-gov"
    } else {
        "aws"
    }
}

impl DynamoDbStreamsSource {
    /// The stream of the multi-stream id `id` (see [`stream_id`]), not looked up: for the
    /// factory of a `kcl_core::multi_stream::MultiStreamSource`, which is called for every
    /// stream of the lease table, gone ones included. For an id that is no DynamoDB stream's
    /// (another application's row in the table), every call fails, naming the id.
    pub fn for_stream_id(config: &SdkConfig, id: &StreamId) -> Self {
        match stream_arn(id) {
            Some(arn) => {
                let table = table_of(&arn).unwrap_or_default().to_owned();
                Self::unchecked(config, arn, table)
            }
            None => Self::unchecked(config, id.to_string(), String::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_adapter_and_lead_back_to_the_arn() {
        // The adapter's own example (KinesisMapperUtilTest).
        let arn = "arn:aws:dynamodb:us-west-2:123456789012:table/TestTable/stream/2024-02-03T00:00:00.000";
        let id = stream_id(arn);
        assert_eq!(
            id.as_ref().map(ToString::to_string).as_deref(),
            Some("123456789012:us-west-2$123456789012$TestTable$2024-02-03T00_00_00.000:1")
        );
        assert_eq!(id.as_ref().and_then(stream_arn).as_deref(), Some(arn));
        let china = "arn:aws-cn:dynamodb:cn-north-1:123456789012:table/t_1.x-y/stream/2024-02-03T00:00:00.000";
        assert_eq!(
            stream_id(china).as_ref().and_then(stream_arn).as_deref(),
            Some(china)
        );
        for bad in [
            "orders",
            "arn:aws:kinesis:us-west-2:123456789012:stream/orders",
            "arn:aws:dynamodb:us-west-2:123456789012:table/orders",
            "arn:aws:dynamodb:us-west-2:123456789012:table//stream/x",
        ] {
            assert!(stream_id(bad).is_none(), "{bad}");
        }
        assert!(stream_arn(&StreamId::new("123456789012", "orders", 1)).is_none());
        assert!(
            stream_arn(&StreamId::new("1", "r$2$t$l", 1)).is_none(),
            "accounts differ"
        );
    }
}
