//! Starting a worker: the lease table and, under enhanced fan-out, the stream consumer made
//! usable (retrying what retrying may fix, and saying what is wrong meanwhile), and a drain
//! request left from before a restart removed.

use backon::{BackoffBuilder, ExponentialBuilder};
use futures_util::future::BoxFuture;
use tokio::time::{Interval, sleep};

use super::Worker;
use crate::error::{BackendError, Error};
use crate::lease::{LeaseStore, TableFeatures};
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::task::bounded;
use crate::types::ConsumerId;

impl<S: ShardSource, L: LeaseStore, F: ProcessorFactory> Worker<S, L, F> {
    /// Creates the lease table with what the coordination uses of it, retrying transient
    /// failures. Returns the features the table serves; `None` if shut down meanwhile.
    pub(super) async fn ensure_table(
        &self,
        beat: &mut Interval,
    ) -> Result<Option<TableFeatures>, Error> {
        let wanted = self.table.config.coordination.table_features();
        // Not bounded by the call timeout: a new table may take minutes to become usable.
        let ready = self.until_ready(beat, "the lease table is not usable yet", || {
            Box::pin(self.table.store.ensure_table(wanted))
        });
        ready.await.map_err(Error::Store)
    }

    /// Says once how this worker runs, and what it costs more than it should when the table
    /// lacks a feature the coordination uses.
    pub(super) fn log_start(&self, table: TableFeatures) {
        let config = &self.table.config;
        tracing::info!(
            coordination = ?config.coordination,
            liveness = ?config.liveness,
            retrieval = ?config.retrieval,
            failover_time = ?config.failover_time,
            balancing = ?config.balancing.by,
            restart_grace = ?config.restart_grace,
            table.features = %table,
            "worker started"
        );
        if config.balancing.by == crate::BalanceBy::Load
            && config.coordination != crate::Coordination::Leader
        {
            tracing::warn!(
                "balancing by load needs a leader (coordination leader): with every worker \
                 coordinating for itself, this worker balances lease counts"
            );
        }
        let wanted = config.coordination.table_features();
        if wanted.owner_index && !table.owner_index {
            tracing::warn!(
                "the lease table has no owner index: this worker reads the whole table to find \
                 its leases (every half failover time while it follows), which costs read units \
                 per lease; let the store add the index, or add it where the table is managed"
            );
        }
        if wanted.change_feed && !table.change_feed && !self.table.store.offers_change_feed() {
            tracing::info!(
                "this lease store keeps no change feed: as leader or standby this worker reads \
                 the whole table every taker interval"
            );
        } else if wanted.change_feed && !table.change_feed {
            tracing::warn!(
                "the lease table has no change feed: as leader or standby this worker reads the \
                 whole table every taker interval; let the store enable the table's stream, or \
                 enable it where the table is managed"
            );
        }
    }

    /// Under [`Retrieval::FanOut`](crate::Retrieval::FanOut), registers the stream consumer
    /// (or finds it) and waits until it can subscribe, retrying transient failures. `Ok(None)`
    /// if shut down meanwhile; `Ok(Some(None))` when polling.
    pub(super) async fn ensure_consumer(
        &self,
        beat: &mut Interval,
    ) -> Result<Option<Option<ConsumerId>>, Error> {
        let crate::Retrieval::FanOut { consumer_name } = &self.table.config.retrieval else {
            return Ok(Some(None));
        };
        // Not bounded by the call timeout either: registering takes seconds on Kinesis.
        let ready = self.until_ready(beat, "the stream consumer is not usable yet", || {
            Box::pin(self.source.register_consumer(consumer_name))
        });
        let consumer = ready.await.map_err(Error::Source)?;
        if let Some(id) = &consumer {
            tracing::info!(consumer = %id, "reading with enhanced fan-out");
        }
        Ok(consumer.map(Some))
    }

    /// Checks that the dead-letter sink, if there is one, can work
    /// ([`DeadLetterSink::check`](crate::failure::DeadLetterSink::check)): a sink that
    /// cannot is found now, not at the first poison record. Transient failures are retried;
    /// warnings logged. `Ok(None)` if shut down meanwhile.
    pub(super) async fn ensure_sink(&self, beat: &mut Interval) -> Result<Option<()>, Error> {
        let Some(letters) = &self.dead_letters else {
            return Ok(Some(()));
        };
        let limit = self.table.config.call_timeout;
        let ready = self.until_ready(beat, "the dead-letter sink is not usable yet", || {
            Box::pin(bounded(limit, "check_dead_letters", letters.sink.check()))
        });
        let Some(warnings) = ready.await.map_err(Error::DeadLetters)? else {
            return Ok(None);
        };
        for warning in warnings {
            tracing::warn!("dead-letter sink: {warning}");
        }
        Ok(Some(()))
    }

    /// Calls `op` until it succeeds or fails for good, with backoff between transient
    /// failures (kept in [`Status::problem`] meanwhile). `Ok(None)` if shut down meanwhile.
    async fn until_ready<'a, T>(
        &'a self,
        beat: &mut Interval,
        what: &str,
        mut op: impl FnMut() -> BoxFuture<'a, Result<T, BackendError>>,
    ) -> Result<Option<T>, BackendError> {
        let mut delays = self.backoff().build();
        loop {
            match self.interruptible(beat, op()).await {
                None => return Ok(None),
                Some(Ok(value)) => {
                    self.report.solved();
                    return Ok(Some(value));
                }
                Some(Err(e)) if e.kind().is_transient() => self.report.problem(what, &e),
                Some(Err(e)) => return Err(e),
            }
            let pause = sleep(delays.next().unwrap_or(self.table.config.max_backoff));
            if self.interruptible(beat, pause).await.is_none() {
                return Ok(None);
            }
        }
    }

    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.table.config.min_backoff)
            .with_max_delay(self.table.config.max_backoff)
            .with_jitter()
            .with_jitter_seed(crate::types::stable_hash(&self.table.me))
            .without_max_times()
    }

    /// A worker that starts takes work again: deletes the row that asked it to drain
    /// (`kcl-admin release`, before maintenance), if there is one. Best effort: a row left
    /// behind keeps this worker idle, and says so in the log.
    pub(super) async fn undrain(&self) {
        let key = crate::singleton::drain_key(&self.table.me);
        let limit = self.table.config.call_timeout;
        let Ok(Some(row)) = bounded(limit, "get", self.table.store.get(&key)).await else {
            return;
        };
        if let Err(error) = bounded(limit, "delete", self.table.store.delete(&row)).await {
            let what = "this worker was asked to drain and the request could not be removed: \
                        it takes no work until it is";
            tracing::warn!(%error, row = %key, "{what}");
            return;
        }
        tracing::info!("started again after a drain (kcl-admin release): taking work");
    }
}
