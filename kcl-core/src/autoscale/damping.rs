//! `desired_workers` from the recommendations, as the HPA stabilizes its own: a rise once it
//! held for the scale-up window, a fall only to the highest recommendation of the scale-down
//! window.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The leader's recent recommendations and what it last said.
#[derive(Debug, Default)]
pub(crate) struct Damper {
    history: VecDeque<(Instant, u32)>,
    current: Option<u32>,
}

impl Damper {
    /// A damper that has said `from` already (what a previous leader published, or the
    /// workers running), so a new leader never starts by scaling the fleet in.
    pub(crate) fn starting_at(from: u32, now: Instant) -> Self {
        Self {
            history: VecDeque::from([(now, from)]),
            current: Some(from),
        }
    }

    /// What it said last.
    pub(crate) fn current(&self) -> Option<u32> {
        self.current
    }

    /// Whether it has said anything yet.
    pub(crate) fn is_fresh(&self) -> bool {
        self.current.is_none()
    }

    /// Takes in the recommendation `raw` made at `now` and says the damped figure.
    pub(crate) fn next(&mut self, raw: u32, now: Instant, up: Duration, down: Duration) -> u32 {
        self.history.push_back((now, raw));
        let keep = up.max(down);
        while self
            .history
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > keep)
        {
            self.history.pop_front();
        }
        let within = |window: Duration| {
            self.history
                .iter()
                .filter(move |(at, _)| now.saturating_duration_since(*at) <= window)
                .map(|(_, n)| *n)
        };
        let up_to = within(up).min().unwrap_or(raw);
        let down_to = within(down).max().unwrap_or(raw);
        let current = self.current.unwrap_or(raw);
        let next = if current < up_to {
            up_to
        } else if current > down_to {
            down_to
        } else {
            current
        };
        self.current = Some(next);
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UP: Duration = Duration::ZERO;
    const DOWN: Duration = Duration::from_secs(300);

    #[tokio::test(start_paused = true)]
    async fn up_at_once_down_only_after_the_window() {
        let mut damper = Damper::default();
        let t0 = Instant::now();
        assert_eq!(damper.next(2, t0, UP, DOWN), 2);
        assert_eq!(damper.next(6, t0 + Duration::from_secs(15), UP, DOWN), 6);
        // The recommendation falls back at once; the figure stays for five minutes.
        for s in (30..=310).step_by(15) {
            assert_eq!(
                damper.next(2, t0 + Duration::from_secs(s), UP, DOWN),
                6,
                "at {s}"
            );
        }
        assert_eq!(damper.next(2, t0 + Duration::from_secs(330), UP, DOWN), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn noise_moves_nothing_down_and_a_rise_must_hold_for_the_up_window() {
        let up = Duration::from_secs(60);
        let mut damper = Damper::starting_at(4, Instant::now());
        let t0 = Instant::now();
        // 5, 3, 5, 3, ...: never below 4 for a whole down window, never above it for a whole
        // up window.
        for i in 1..100_u64 {
            let raw = if i % 2 == 0 { 5 } else { 3 };
            assert_eq!(
                damper.next(raw, t0 + Duration::from_secs(15 * i), up, DOWN),
                4
            );
        }
        let t1 = t0 + Duration::from_secs(15 * 100);
        for i in 0..=4_u64 {
            let said = damper.next(7, t1 + Duration::from_secs(15 * i), up, DOWN);
            assert_eq!(said, if i < 4 { 4 } else { 7 }, "at {i}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fall_goes_to_the_highest_of_the_window_not_the_lowest() {
        let mut damper = Damper::starting_at(8, Instant::now());
        let t0 = Instant::now();
        damper.next(5, t0 + Duration::from_secs(10), UP, DOWN);
        damper.next(3, t0 + Duration::from_secs(200), UP, DOWN);
        // At 305 s the 8 has left the window; 5 is the highest left.
        assert_eq!(damper.next(3, t0 + Duration::from_secs(305), UP, DOWN), 5);
        assert_eq!(damper.next(3, t0 + Duration::from_secs(505), UP, DOWN), 3);
        assert!(!damper.is_fresh());
        assert!(Damper::default().is_fresh());
    }
}
