//! What the demo runs on: the in-memory backends here, Kinesis and DynamoDB in `aws`.

use std::collections::BTreeMap;
use std::future::Future;

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{Checkpoint, Lease, LeaseStore, ShardId, ShardSource};

/// What the demo needs from a stream and a lease table besides the worker's traits.
pub(crate) trait Backend: Send + Sync + 'static {
    type Source: ShardSource;
    type Store: LeaseStore;

    /// One sentence on what the demo runs on.
    fn describe(&self) -> String;
    /// The worker `name`'s handle on the stream.
    fn source(&self, name: &str) -> Self::Source;
    /// The worker `name`'s handle on the lease table.
    fn store(&self, name: &str) -> Self::Store;
    /// Writes `(partition key, data)` records.
    fn put(
        &self,
        records: Vec<(String, String)>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Splits an open shard; returns the parent and its children.
    fn split(&self) -> impl Future<Output = anyhow::Result<(ShardId, Vec<ShardId>)>> + Send;
    /// The lease table as it stands.
    fn leases(&self) -> impl Future<Output = anyhow::Result<Vec<Lease>>> + Send {
        let store = self.store("demo-observer");
        async move { Ok(store.list().await?) }
    }
    /// Records written after each lease's checkpoint, summed, if the backend can tell.
    fn not_checkpointed(&self) -> Option<usize> {
        None
    }
    /// Leases taken per worker, if the backend keeps a journal.
    fn takes(&self) -> Option<BTreeMap<String, usize>> {
        None
    }
}

/// The in-memory stream and lease table of kcl-core's `test-util` feature.
#[derive(Debug)]
pub(super) struct Memory {
    pub(super) stream: MemoryStream,
    pub(super) store: MemoryLeaseStore,
}

impl Backend for Memory {
    type Source = MemoryStream;
    type Store = MemoryLeaseStore;

    fn describe(&self) -> String {
        format!(
            "in-memory stream of {} shards and lease table",
            self.stream.open_shards().len()
        )
    }

    fn source(&self, name: &str) -> MemoryStream {
        self.stream.client(name)
    }

    fn store(&self, name: &str) -> MemoryLeaseStore {
        self.store.client(name)
    }

    async fn put(&self, records: Vec<(String, String)>) -> anyhow::Result<()> {
        for (key, data) in records {
            self.stream.put(&key, data);
        }
        Ok(())
    }

    async fn split(&self) -> anyhow::Result<(ShardId, Vec<ShardId>)> {
        let parent = self
            .stream
            .open_shards()
            .first()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no open shard"))?;
        let children = self.stream.split(&parent).map_err(anyhow::Error::msg)?;
        Ok((parent, children.to_vec()))
    }

    async fn leases(&self) -> anyhow::Result<Vec<Lease>> {
        Ok(self.store.leases())
    }

    fn not_checkpointed(&self) -> Option<usize> {
        let mut behind = 0;
        for lease in self.store.leases() {
            let records = self.stream.records(&lease.key);
            behind += match &lease.checkpoint {
                Checkpoint::ShardEnd => 0,
                Checkpoint::Sequence(c) => records.iter().filter(|r| r.position() > *c).count(),
                _ => records.len(),
            };
        }
        Some(behind)
    }

    fn takes(&self) -> Option<BTreeMap<String, usize>> {
        let mut taken: BTreeMap<String, usize> = BTreeMap::new();
        for event in self.store.journal() {
            if let ("take", Some(owner)) = (event.operation, &event.lease.owner) {
                *taken.entry(owner.to_string()).or_default() += 1;
            }
        }
        Some(taken)
    }
}
