//! How long a lease holder may act as one: its validity, which each successful write of its
//! own row (or of a carrier row, see [`tenure`](super::tenure)) extends.

use std::sync::Mutex as SyncMutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::mutation::{self, Mutation};

/// Until when a holder may act as one: the start of its last successful write, plus a span.
#[derive(Debug)]
pub(crate) struct Validity {
    until: SyncMutex<Instant>,
    span: Duration,
}

impl Validity {
    pub(super) fn new(until: Instant, span: Duration) -> Self {
        Self {
            until: SyncMutex::new(until),
            span,
        }
    }

    /// Until when the holder may act.
    pub(crate) fn until(&self) -> Instant {
        *self
            .until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A write of the holder's own row that started at `started` succeeded.
    pub(super) fn wrote(&self, started: Instant) {
        let mut until = self
            .until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *until = (*until).max(started + self.span);
    }

    /// A write of a carrier that started at `started` was answered at `answered`: it proves
    /// the holder alive only if the validity had not run out by then (see the module docs).
    pub(super) fn proved(&self, started: Instant, answered: Instant) {
        let mut until = self
            .until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if answered < *until || mutation::on(Mutation::CarrierProvesAfterLapse) {
            *until = (*until).max(started + self.span);
        }
    }
}
