//! Whether the published row is fresh, judged on this worker's own clock.
//!
//! The row carries when the leader worked its figures out ([`FleetSignals::at`]), by the
//! leader's clock; comparing that with this worker's would trust two clocks to agree. As lease
//! expiry is judged, a follower instead notes when it first saw each write of the row (its
//! lease counter moves with every write) on its own monotonic clock, and trusts the row while
//! the last change it saw is at most [`signals_max_age`](crate::Autoscaling::signals_max_age)
//! old. A row is fresh when first seen ("as of the read"), rows written by versions before
//! `at` existed alike.
//!
//! [`FleetSignals::at`]: super::FleetSignals::at

use std::time::Duration;

use tokio::time::Instant;

/// The last write of the published row a follower saw, and when it first saw it.
#[derive(Debug, Default)]
pub(crate) struct Freshness {
    seen: Option<(u64, Instant)>,
}

impl Freshness {
    /// The row read at `now` carries write `counter`.
    pub(crate) fn saw(&mut self, counter: u64, now: Instant) {
        // Any other counter is a change, a lower one too: a row made again starts over (an
        // eventually consistent read of an older copy counts once, a read interval at most).
        if self.seen.is_none_or(|(seen, _)| seen != counter) {
            self.seen = Some((counter, now));
        }
    }

    /// Whether the row changed within `max_age` before `now`.
    pub(crate) fn is_fresh(&self, now: Instant, max_age: Duration) -> bool {
        self.seen
            .is_some_and(|(_, at)| now.saturating_duration_since(at) <= max_age)
    }

    /// Forgets what it saw (this worker led meanwhile).
    pub(crate) fn forget(&mut self) {
        self.seen = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fresh_while_the_counter_moves_stale_once_it_stands_still_for_the_bound() {
        let max_age = Duration::from_secs(55);
        let mut fresh = Freshness::default();
        let t0 = Instant::now();
        assert!(!fresh.is_fresh(t0, max_age), "nothing seen");
        fresh.saw(7, t0);
        assert!(fresh.is_fresh(t0 + max_age, max_age), "as of the read");
        // Reads of the same write do not refresh it.
        for s in (15..=45).step_by(15) {
            fresh.saw(7, t0 + Duration::from_secs(s));
        }
        assert!(!fresh.is_fresh(t0 + max_age + Duration::from_millis(1), max_age));
        fresh.saw(8, t0 + Duration::from_secs(60));
        assert!(fresh.is_fresh(t0 + Duration::from_secs(115), max_age));
        assert!(!fresh.is_fresh(t0 + Duration::from_secs(116), max_age));
        fresh.forget();
        assert!(!fresh.is_fresh(t0 + Duration::from_secs(60), max_age));
    }
}
