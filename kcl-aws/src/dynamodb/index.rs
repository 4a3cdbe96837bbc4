//! Whether the `leaseOwner` index can be queried, and what `owned_by` does while it cannot.
//!
//! Followers under `Coordination::Leader` find their leases through the index
//! ([`schema::OWNER_INDEX`](super::schema::OWNER_INDEX)). It can be missing (a table managed
//! elsewhere without it, no permission to add it), still being built (DynamoDB backfills a new
//! index in the background, minutes on a large table, and refuses queries meanwhile), or
//! refused by the caller's IAM policy. None of that may stop a worker: `owned_by` then reads
//! the whole table, says so once at WARN, and tries the index again every
//! [`RETRY`], so that it moves back to the index once the index works (said at INFO).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use kcl_core::BackendError;
use tokio::time::Instant;

/// How long `owned_by` reads the table before it tries an unusable index again.
pub(crate) const RETRY: Duration = Duration::from_secs(60);

/// What is known of the index, shared by every clone of a store.
#[derive(Debug, Default)]
pub(crate) struct OwnerIndex {
    state: Mutex<State>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not looked for (`ensure_table` was not asked for it): query, and see.
    #[default]
    Unknown,
    /// There, and the last query worked.
    Usable,
    /// Missing, or the last query failed for a reason retrying soon would not fix.
    Unusable { retry_at: Instant },
}

impl OwnerIndex {
    fn set(&self, state: State) -> State {
        let mut current = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *current, state)
    }

    fn get(&self) -> State {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What `ensure_table` found: the index is there (or being added), or not.
    pub(crate) fn found(&self, present: bool) {
        let state = if present {
            State::Usable
        } else {
            State::Unusable {
                retry_at: Instant::now() + RETRY,
            }
        };
        self.set(state);
    }

    /// Whether `owned_by` should query the index now rather than read the table.
    pub(crate) fn worth_querying(&self) -> bool {
        match self.get() {
            State::Unknown | State::Usable => true,
            State::Unusable { retry_at } => Instant::now() >= retry_at,
        }
    }

    /// Whether a failed query means "read the table instead": the index is missing, being
    /// built or not allowed (DynamoDB: `ValidationException`, `AccessDeniedException`;
    /// emulators: `ResourceNotFoundException`). Throttling and transient errors are not.
    pub(crate) fn falls_back_on(error: &BackendError) -> bool {
        error.kind().is_permanent()
    }

    /// A query failed with an error [`falls_back_on`](Self::falls_back_on) accepts.
    pub(crate) fn failed(&self, table: &str, error: &BackendError) {
        let before = self.set(State::Unusable {
            retry_at: Instant::now() + RETRY,
        });
        if matches!(before, State::Unusable { .. }) {
            tracing::debug!(table, %error, "the leaseOwner index still cannot be queried");
        } else {
            tracing::warn!(
                table, %error, retry_in = ?RETRY,
                "the leaseOwner index cannot be queried (missing, still being built, or not \
                 allowed by the IAM policy); reading the whole table instead, which costs read \
                 units per lease, until it can"
            );
        }
    }

    /// A query worked.
    pub(crate) fn worked(&self, table: &str) {
        if matches!(self.set(State::Usable), State::Unusable { .. }) {
            tracing::info!(
                table,
                "the leaseOwner index works: finding leases through it again"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kcl_core::ErrorKind;

    fn error(kind: ErrorKind) -> BackendError {
        BackendError::new(kind, "owned_by", "from the test")
    }

    #[tokio::test(start_paused = true)]
    async fn an_unusable_index_is_tried_again_after_a_minute() {
        let index = OwnerIndex::default();
        assert!(index.worth_querying(), "unknown: try it");
        index.failed("app", &error(ErrorKind::Fatal));
        assert!(!index.worth_querying());
        tokio::time::advance(RETRY - Duration::from_millis(1)).await;
        assert!(!index.worth_querying());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(index.worth_querying());
        index.worked("app");
        assert!(index.worth_querying());
        index.found(false);
        assert!(
            !index.worth_querying(),
            "a table without the index is not queried"
        );
    }

    #[test]
    fn only_permanent_errors_fall_back() {
        assert!(OwnerIndex::falls_back_on(&error(ErrorKind::Fatal)));
        assert!(OwnerIndex::falls_back_on(&error(ErrorKind::NotFound)));
        assert!(!OwnerIndex::falls_back_on(&error(ErrorKind::Throttled)));
        assert!(!OwnerIndex::falls_back_on(&error(ErrorKind::Retryable)));
    }
}
