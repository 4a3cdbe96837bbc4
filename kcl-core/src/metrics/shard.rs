//! The per-shard series a shard task keeps (see the parent module's docs on freshness).

use super::{
    ALREADY_FINISHED, BATCH_DURATION, BEHIND_LATEST, BISECTS, BYTES, DEAD_LETTERED, DELIVERY_DELAY,
    IN_FLIGHT, OUTAGES, RECORDS, RETRIES, SINK_FAILURES, SKIPPED, WATERMARK_LAG,
    WATERMARK_LAG_RECORDS,
};

/// The per-shard series of one shard while this worker processes it.
#[derive(Debug)]
pub(crate) struct ShardMetrics {
    shard: String,
    behind: Option<f64>,
}

impl ShardMetrics {
    pub(crate) fn new(shard: &crate::ShardId) -> Self {
        let metrics = Self {
            shard: shard.to_string(),
            behind: None,
        };
        metrics.refresh();
        metrics
    }

    /// Registers the shard's counters (at zero the first time) and re-sets its gauge, so that
    /// its series stay fresh while the shard is held; see the module docs.
    pub(crate) fn refresh(&self) {
        ::metrics::counter!(RECORDS, "shard" => self.shard.clone()).increment(0);
        ::metrics::counter!(BYTES, "shard" => self.shard.clone()).increment(0);
        for name in [
            RETRIES,
            DEAD_LETTERED,
            SKIPPED,
            ALREADY_FINISHED,
            BISECTS,
            SINK_FAILURES,
            OUTAGES,
        ] {
            ::metrics::counter!(name, "shard" => self.shard.clone()).increment(0);
        }
        if let Some(behind) = self.behind {
            ::metrics::gauge!(BEHIND_LATEST, "shard" => self.shard.clone()).set(behind);
        }
    }

    /// How far behind the newest record the last batch was.
    pub(crate) fn behind_latest(&mut self, millis: u64) {
        #[allow(clippy::cast_precision_loss)]
        let seconds = millis as f64 / 1000.0;
        self.behind = Some(seconds);
        ::metrics::gauge!(BEHIND_LATEST, "shard" => self.shard.clone()).set(seconds);
    }

    /// Where the shard's checkpoint watermark stands (see [`ack`](crate::ack)).
    pub(crate) fn watermark(&self, in_flight: usize, lag_records: usize, lag: std::time::Duration) {
        #[allow(clippy::cast_precision_loss)]
        {
            ::metrics::gauge!(IN_FLIGHT, "shard" => self.shard.clone()).set(in_flight as f64);
            ::metrics::gauge!(WATERMARK_LAG_RECORDS, "shard" => self.shard.clone())
                .set(lag_records as f64);
        }
        ::metrics::gauge!(WATERMARK_LAG, "shard" => self.shard.clone()).set(lag.as_secs_f64());
    }

    /// One batch delivered.
    pub(crate) fn batch(
        &self,
        records: usize,
        bytes: usize,
        took: std::time::Duration,
        delay: std::time::Duration,
    ) {
        ::metrics::counter!(RECORDS, "shard" => self.shard.clone()).increment(records as u64);
        ::metrics::counter!(BYTES, "shard" => self.shard.clone()).increment(bytes as u64);
        ::metrics::histogram!(BATCH_DURATION).record(took.as_secs_f64());
        ::metrics::histogram!(DELIVERY_DELAY).record(delay.as_secs_f64());
    }
}
