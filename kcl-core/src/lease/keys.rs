//! The lease table's key scheme beyond shard ids: the rows of singletons (the leader, the
//! standby, heartbeats, drain requests) and the owner an operator's reset writes. Defined
//! here, at the bottom, so that the lease logic needs neither `singleton` nor `admin`;
//! those re-export what users see.

use crate::types::ShardId;

/// Lease keys of singletons start with this; no Kinesis shard id does.
pub const COORDINATION_PREFIX: &str = "kcl-coordination/";

/// True for rows that hold a singleton, not a shard.
pub fn is_coordination_key(key: &ShardId) -> bool {
    key.as_str().starts_with(COORDINATION_PREFIX)
}

/// The owner a reset writes (see [`admin`](crate::admin)): no worker has this id.
pub const RESET_OWNER: &str = "kcl-admin/reset";
