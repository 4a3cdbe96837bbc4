//! Keeps one held lease alive, and gives it up locally before anyone else may take it.
//!
//! Each renewal is bounded by the tenure's validity: if the store does not answer before the
//! lease could be expired elsewhere, the shard is stopped rather than left processing records
//! another worker may already be processing.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, timeout_at};

use super::tenure::{Tenure, TenureError};
use crate::metrics;

/// Renews every `interval` until the tenure is lost or ended.
///
/// The first renewal comes between half the interval and the interval, at a point fixed by a
/// hash of the lease's key: leases taken together (a worker starting on many shards) would
/// otherwise be renewed together, every round a burst of as many concurrent writes, and
/// connections, as leases held. Renewing earlier than due is always safe.
pub(crate) async fn run(tenure: Arc<Tenure>, interval: Duration) {
    #[allow(clippy::cast_precision_loss)]
    let phase = (crate::types::stable_hash(tenure.shard()) % 1024) as f64 / 1024.0;
    let mut wait = interval.mul_f64(0.5 + 0.5 * phase);
    loop {
        tokio::select! {
            biased;
            () = tenure.lost_token().cancelled() => return,
            () = sleep(wait) => {}
        }
        wait = interval;
        match timeout_at(tenure.valid_until(), tenure.renew()).await {
            Ok(Ok(_) | Err(TenureError::Behind(_))) => {}
            Ok(Err(TenureError::Lost)) => {
                tracing::info!("lease lost: taken or released elsewhere");
                ::metrics::counter!(metrics::LEASES_LOST).increment(1);
                return;
            }
            Ok(Err(TenureError::Store(error))) if tenure.is_valid() => {
                tracing::warn!(%error, "lease renewal failed; retrying");
                wait = interval / 4;
            }
            Ok(Err(TenureError::Store(_))) | Err(_) => {
                tracing::warn!(
                    "lease could not be renewed before it may expire elsewhere; stopping the shard"
                );
                tenure.mark_lost();
                ::metrics::counter!(metrics::LEASES_LOST).increment(1);
                return;
            }
        }
    }
}

/// Under heartbeats (a derived tenure: no renewal writes its row, and so none reads it back),
/// reads the row every `interval` while it parks keys, so that an operator's unpark
/// (`admin::unpark`) is seen as soon as under per-lease renewals. One read a renewal interval
/// per shard with parked keys; nothing otherwise.
pub(crate) async fn watch_parked(tenure: Arc<Tenure>, interval: Duration, limit: Duration) {
    loop {
        tokio::select! {
            biased;
            () = tenure.lost_token().cancelled() => return,
            () = sleep(interval) => {}
        }
        if tenure.parked_now().is_none_or(|parked| parked.is_empty()) {
            continue;
        }
        match tokio::time::timeout(limit, tenure.refresh_parked()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::debug!(%error, "reading the row's parked keys failed"),
            Err(_) => tracing::debug!("reading the row's parked keys timed out"),
        }
    }
}
