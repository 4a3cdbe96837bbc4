//! Shards of a DynamoDB stream as the lease table knows them, and what follows a shard's end.
//!
//! A closed shard's last `GetRecords` has no next iterator and, unlike Kinesis, names no
//! children. So, as the Java adapter does, the source asks `DescribeStream` for the shard's
//! children (`ShardFilter` `CHILD_SHARDS`) at that moment, a few times while the answer is
//! still empty: the children's leases are then made at once, and the parent's row records
//! them (`childShardIds`), which lets it be cleaned up once they started rather than when the
//! shard leaves the stream a day later. `GetRecords` takes only an iterator, so the
//! iterators this source hands out carry their shard id in front.

use std::time::Duration;

use aws_sdk_dynamodbstreams::types::{self as sdk, ShardFilter, ShardFilterType};
use backon::{BackoffBuilder, ExponentialBuilder};
use kcl_core::{BackendError, ErrorKind, HashKeyRange, Shard, ShardId, ShardIterator};

use super::DynamoDbStreamsSource;

/// Between the shard id and the service's iterator.
const SEPARATOR: char = ' ';

/// The iterator handed out for `raw`, the service's iterator of `shard`.
pub(super) fn tag(shard: &str, raw: &str) -> ShardIterator {
    ShardIterator(format!("{shard}{SEPARATOR}{raw}"))
}

/// The shard and the service's iterator of an iterator [`tag`] made.
pub(super) fn untag(iterator: &ShardIterator) -> Result<(&str, &str), BackendError> {
    iterator.0.split_once(SEPARATOR).ok_or_else(|| {
        BackendError::new(
            ErrorKind::Fatal,
            "get_records",
            "an iterator this source did not hand out",
        )
    })
}

/// A shard as the lease table knows it; `None` without an id.
pub(super) fn shard(s: sdk::Shard) -> Option<Shard> {
    let closed = s
        .sequence_number_range
        .as_ref()
        .is_some_and(|r| r.ending_sequence_number.is_some());
    Some(Shard {
        id: ShardId::new(s.shard_id?),
        parent_shard_ids: s.parent_shard_id.into_iter().map(ShardId::new).collect(),
        hash_key_range: HashKeyRange { start: 0, end: 1 },
        closed,
    })
}

impl DynamoDbStreamsSource {
    /// The children of `parent`, which just ended; none if the stream names none within a
    /// few tries (the shard sync finds them later).
    pub(super) async fn children(&self, parent: &str) -> Vec<Shard> {
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(1))
            .with_max_times(4)
            .with_jitter()
            .build();
        loop {
            match self.children_once(parent).await {
                Ok(children) if !children.is_empty() => return children,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(shard.id = parent, error = %e, "cannot list the ended shard's children");
                }
            }
            let Some(delay) = delays.next() else {
                tracing::debug!(
                    shard.id = parent,
                    "the ended shard has no children listed yet"
                );
                return Vec::new();
            };
            tokio::time::sleep(delay).await;
        }
    }

    async fn children_once(&self, parent: &str) -> Result<Vec<Shard>, BackendError> {
        let filter = ShardFilter::builder()
            .r#type(ShardFilterType::ChildShards)
            .shard_id(parent)
            .build();
        let out = self
            .client
            .describe_stream()
            .stream_arn(self.arn())
            .shard_filter(filter)
            .send()
            .await
            .map_err(|e| {
                crate::error::backend_error("describe_stream", format!("children of {parent}"), e)
            })?;
        Ok(out
            .stream_description
            .and_then(|d| d.shards)
            .unwrap_or_default()
            .into_iter()
            .filter_map(shard)
            // Whatever the filter did (an emulator may ignore it).
            .filter(|s| s.parent_shard_ids.iter().any(|p| p.as_str() == parent))
            .collect())
    }
}
