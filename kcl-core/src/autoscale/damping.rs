//! `desired_workers` from the recommendations, as the HPA stabilizes its own: a rise once it
//! held for the scale-up window, a fall only to the highest recommendation of the scale-down
//! window.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::Autoscaling;
use crate::mutation::{self, Mutation};

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

    /// Takes in the recommendation `raw` made at `now` and says the figure damped by
    /// `config`'s windows.
    pub(crate) fn next(&mut self, raw: u32, now: Instant, config: &Autoscaling) -> u32 {
        let up = if mutation::on(Mutation::ScaleUpWindowIgnored) {
            Duration::ZERO
        } else {
            config.scale_up_window
        };
        self.damp(raw, now, up, config.scale_down_window)
    }

    /// [`next`](Self::next) with the windows given.
    fn damp(&mut self, raw: u32, now: Instant, up: Duration, down: Duration) -> u32 {
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
        assert_eq!(damper.damp(2, t0, UP, DOWN), 2);
        assert_eq!(damper.damp(6, t0 + Duration::from_secs(15), UP, DOWN), 6);
        // The recommendation falls back at once; the figure stays for five minutes.
        for s in (30..=310).step_by(15) {
            assert_eq!(
                damper.damp(2, t0 + Duration::from_secs(s), UP, DOWN),
                6,
                "at {s}"
            );
        }
        assert_eq!(damper.damp(2, t0 + Duration::from_secs(330), UP, DOWN), 2);
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
                damper.damp(raw, t0 + Duration::from_secs(15 * i), up, DOWN),
                4
            );
        }
        let t1 = t0 + Duration::from_secs(15 * 100);
        for i in 0..=4_u64 {
            let said = damper.damp(7, t1 + Duration::from_secs(15 * i), up, DOWN);
            assert_eq!(said, if i < 4 { 4 } else { 7 }, "at {i}");
        }
    }

    /// The window as configured reaches the damper: a rise is followed only once every
    /// recommendation of the window asked for it, however the rise comes.
    #[tokio::test(start_paused = true)]
    async fn a_configured_scale_up_window_holds_a_rise_back() {
        crate::mutation::set_from_env();
        let config = Autoscaling::default().windows(Duration::from_secs(60), DOWN);
        let mut damper = Damper::starting_at(2, Instant::now());
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // 6 asked for from 15 s on: followed at 75 s, once 60 s of asking covers the window.
        for s in (15..75).step_by(15) {
            assert_eq!(damper.next(6, at(s), &config), 2, "at {s} s");
        }
        assert_eq!(damper.next(6, at(75), &config), 6);
        // A dip inside the window starts it again, and the rise goes only as far as the
        // lowest recommendation of the window.
        assert_eq!(damper.next(9, at(90), &config), 6);
        assert_eq!(damper.next(5, at(105), &config), 6);
        assert_eq!(damper.next(9, at(120), &config), 6);
        assert_eq!(
            damper.next(9, at(165), &config),
            6,
            "5 at 105 s is in the window"
        );
        assert_eq!(damper.next(9, at(166), &config), 9);
        // With no window, at once.
        let at_once = Autoscaling::default();
        assert_eq!(damper.next(12, at(180), &at_once), 12);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fall_goes_to_the_highest_of_the_window_not_the_lowest() {
        let mut damper = Damper::starting_at(8, Instant::now());
        let t0 = Instant::now();
        damper.damp(5, t0 + Duration::from_secs(10), UP, DOWN);
        damper.damp(3, t0 + Duration::from_secs(200), UP, DOWN);
        // At 305 s the 8 has left the window; 5 is the highest left.
        assert_eq!(damper.damp(3, t0 + Duration::from_secs(305), UP, DOWN), 5);
        assert_eq!(damper.damp(3, t0 + Duration::from_secs(505), UP, DOWN), 3);
        assert!(!damper.is_fresh());
        assert!(Damper::default().is_fresh());
    }
}
