//! Pieces of the fleet simulation.
pub mod checks;
pub mod fleet;
pub mod handler;
pub mod hands_off;
pub mod load;
pub mod mutations;
pub mod operator;
pub mod outputs;
pub mod poison;
pub mod positions;
pub mod problems;
pub mod processor;
pub mod scenario;
pub mod schedule;

/// The user records of a shard, in order: KPL aggregates split as the worker splits them.
pub fn user_records(
    stream: &kcl_core::memory::MemoryStream,
    shard: &kcl_core::ShardId,
) -> Vec<kcl_core::Record> {
    let records = stream.records(shard);
    records
        .into_iter()
        .flat_map(kcl_core::aggregation::deaggregate)
        .collect()
}

/// A hash that is the same in every run, to derive seeds from names.
pub fn hash(value: &str) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}
