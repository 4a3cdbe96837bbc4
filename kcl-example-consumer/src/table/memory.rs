//! The table's items on the in-memory store, for the processor's tests: a window adds its
//! records to `<shard>/<window start ms>`, a position is the value of `<shard>/#position`
//! (`<application> <checkpoint> <sub-sequence>`).

use std::collections::HashMap;

use futures_util::future::BoxFuture;
use kcl_core::memory::{MemoryLeaseStore, MemoryWrite, OutputItem};
use kcl_core::{Checkpoint, FencingToken, ShardId};

use super::step::{Mismatch, Step};
use super::{Items, Position, TableError};
use crate::window::WindowSummary;

/// The items of the store's output table, written by `application`.
#[derive(Debug, Clone)]
pub(crate) struct MemoryItems {
    pub(crate) store: MemoryLeaseStore,
    pub(crate) application: String,
}

/// A window's item.
pub(crate) fn window_key(w: &WindowSummary) -> String {
    format!("{}/{}", w.shard, w.window_start.timestamp_millis())
}

/// A shard's position item.
pub(crate) fn position_key(shard: &ShardId) -> String {
    format!("{shard}/#position")
}

impl MemoryItems {
    fn value(&self, checkpoint: &Checkpoint) -> String {
        let (at, sub) = (checkpoint.as_str(), checkpoint.sub_sequence());
        format!("{} {at} {sub}", self.application)
    }
}

/// The position a value holds.
pub(crate) fn parse(value: &str) -> Option<Position> {
    let mut parts = value.split(' ');
    let application = parts.next()?.to_owned();
    let at = parts.next()?;
    let sub = parts.next()?.parse().ok()?;
    Some(Position {
        checkpoint: Checkpoint::parse(at, sub)?,
        application: Some(application),
    })
}

impl Items for MemoryItems {
    type Store = MemoryLeaseStore;

    fn table(&self) -> &str {
        "memory"
    }

    fn application(&self) -> &str {
        &self.application
    }

    fn worker(&self) -> &str {
        "test-worker"
    }

    fn window(&self, summary: &WindowSummary) -> MemoryWrite {
        MemoryWrite::add(
            window_key(summary),
            i64::try_from(summary.records).unwrap_or(i64::MAX),
        )
    }

    fn position(&self, shard: &ShardId, checkpoint: &Checkpoint, _: FencingToken) -> MemoryWrite {
        MemoryWrite::put(position_key(shard), self.value(checkpoint))
    }

    fn read_positions<'a>(
        &'a self,
        shards: &'a [ShardId],
    ) -> BoxFuture<'a, Result<HashMap<ShardId, Position>, TableError>> {
        let found = shards
            .iter()
            .filter_map(|shard| {
                let item = self.store.output(&position_key(shard))?;
                Some((shard.clone(), parse(&item.value?)?))
            })
            .collect();
        Box::pin(async move { Ok(found) })
    }

    fn realign<'a>(&'a self, mismatch: &'a Mismatch) -> BoxFuture<'a, Result<bool, TableError>> {
        if mismatch.step == Step::Behind {
            // The position stays: nothing else is recorded on this store.
            return Box::pin(async { Ok(true) });
        }
        let item = OutputItem {
            value: Some(self.value(&mismatch.lease)),
            count: 0,
        };
        self.store
            .insert_output(&position_key(&mismatch.shard), item);
        Box::pin(async { Ok(true) })
    }

    fn diagnose<'a>(&'a self, _: &'a ShardId) -> BoxFuture<'a, Option<TableError>> {
        Box::pin(async { None })
    }
}
