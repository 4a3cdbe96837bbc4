//! This worker at the lease table: its id, its configuration and the store. Every part of
//! the coordinator's state that writes to the table borrows this; none owns it.

use std::future::Future;
use std::sync::Arc;

use crate::config::WorkerConfig;
use crate::error::BackendError;
use crate::lease::load::Meters;
use crate::lease::taker::Limits;
use crate::lease::tenure::Timing;
use crate::task::bounded;
use crate::types::WorkerId;

/// This worker at the lease table.
#[derive(Debug)]
pub(super) struct Table<L> {
    /// This worker (its `leaseOwner`).
    pub(super) me: WorkerId,
    pub(super) config: Arc<WorkerConfig>,
    pub(super) store: Arc<L>,
    /// The meters of the leases this worker holds (what its heartbeat row reports).
    pub(super) meters: Meters,
}

impl<L> Table<L> {
    /// Runs one store call within the call timeout, named `op` in its error.
    pub(super) fn call<T, F>(
        &self,
        op: &'static str,
        call: F,
    ) -> impl Future<Output = Result<T, BackendError>> + use<T, F, L>
    where
        F: Future<Output = Result<T, BackendError>>,
    {
        bounded(self.config.call_timeout, op, call)
    }

    /// The timing of every lease this worker takes.
    pub(super) fn timing(&self) -> Timing {
        Timing {
            failover_time: self.config.failover_time,
            call_timeout: self.config.call_timeout,
        }
    }

    /// The bounds of this worker's plan: none to take while it is asked to drain.
    pub(super) fn limits(&self, drained: bool) -> Limits {
        if drained {
            return Limits {
                max_leases: 0,
                max_steal: 0,
            };
        }
        Limits {
            max_leases: self.config.max_leases,
            max_steal: self.config.max_leases_to_steal,
        }
    }
}
