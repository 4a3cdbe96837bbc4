//! An idle fleet on the in-memory backends, shared by the cost model's test and the cost bench
//! (`#[path]`-included by both): the rows already balanced, so a window measures steady state.

use kcl_core::lease::usage::item_size;
use kcl_core::memory::{IdleProcessor, MemoryLeaseStore, MemoryStream};
use kcl_core::{Checkpoint, Lease, ShardId, ShutdownHandle, Worker, WorkerConfig, WorkerId};

/// The average size of the store's rows in bytes, as DynamoDB counts them: measured once the
/// fleet settled (a take writes `kclFence`, renewals the load).
pub(crate) fn row_bytes(store: &MemoryLeaseStore) -> usize {
    let rows = store.leases();
    rows.iter().map(item_size).sum::<usize>() / rows.len().max(1)
}

/// `workers` idle workers running over `shards` shards whose leases they already hold in
/// turn: the store (which counts every request) and the workers' stop handles.
pub(crate) fn start(
    shards: u32,
    workers: usize,
    config: &WorkerConfig,
) -> (MemoryLeaseStore, Vec<ShutdownHandle>) {
    let stream = MemoryStream::new(shards);
    let store = MemoryLeaseStore::new();
    let ids: Vec<WorkerId> = (0..workers)
        .map(|i| WorkerId::from(format!("worker-{i:03}").as_str()))
        .collect();
    for (i, shard) in stream.shards().into_iter().enumerate() {
        let mut lease = Lease::new(shard.id, Checkpoint::TrimHorizon);
        lease.hash_key_range = Some(shard.hash_key_range);
        lease.owner = Some(ids[i % workers].clone());
        store.insert(lease);
    }
    let mut stops = Vec::new();
    for id in &ids {
        let worker = Worker::new(
            id.as_str(),
            config.clone(),
            stream.client(id.as_str()),
            store.client(id.as_str()),
            |_: &ShardId| IdleProcessor,
        )
        .expect("a valid configuration");
        stops.push(worker.shutdown_handle());
        tokio::spawn(worker.run());
    }
    (store, stops)
}
