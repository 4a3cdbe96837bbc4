//! Fault injection shared by the in-memory backends.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::error::{BackendError, ErrorKind};

/// Faults to inject; cheap to clone, all clones share state.
#[derive(Debug, Clone)]
pub struct Faults {
    state: Arc<Mutex<State>>,
    paused: Arc<watch::Sender<BTreeSet<String>>>,
}

#[derive(Debug)]
struct State {
    rng: StdRng,
    error_rate: f64,
    throttle_rate: f64,
    ambiguous_rate: f64,
    expired_iterator_rate: f64,
    max_latency: Duration,
    straggler_rate: f64,
    straggler_delay: Duration,
    partitioned: BTreeSet<String>,
    /// Frozen processes and the tasks waiting for them to resume (see `process`).
    frozen: BTreeMap<String, Vec<Waker>>,
}

/// What happens to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Apply it and report the result.
    Apply,
    /// Apply it, then report a transient error (a response lost on the way back).
    ApplyThenFail,
    /// Report a transient error now and apply it this much later, if its condition still
    /// holds then (a request stuck in the network after its client gave up).
    Straggle(Duration),
}

impl Default for Faults {
    fn default() -> Self {
        Self::seeded(0)
    }
}

impl Faults {
    /// No faults yet; random decisions are drawn from `seed`.
    pub fn seeded(seed: u64) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                rng: StdRng::seed_from_u64(seed),
                error_rate: 0.0,
                throttle_rate: 0.0,
                ambiguous_rate: 0.0,
                expired_iterator_rate: 0.0,
                max_latency: Duration::ZERO,
                straggler_rate: 0.0,
                straggler_delay: Duration::ZERO,
                partitioned: BTreeSet::new(),
                frozen: BTreeMap::new(),
            })),
            paused: Arc::new(watch::Sender::new(BTreeSet::new())),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Share of calls that fail with a retryable error before doing anything.
    pub fn set_error_rate(&self, rate: f64) {
        self.state().error_rate = rate;
    }

    /// Share of calls that are throttled.
    pub fn set_throttle_rate(&self, rate: f64) {
        self.state().throttle_rate = rate;
    }

    /// Share of writes that are applied but report a retryable error.
    pub fn set_ambiguous_rate(&self, rate: f64) {
        self.state().ambiguous_rate = rate;
    }

    /// Share of `get_records` calls that fail with an expired iterator.
    pub fn set_expired_iterator_rate(&self, rate: f64) {
        self.state().expired_iterator_rate = rate;
    }

    /// Share of writes held up in the network: the caller gets no answer (a transient error)
    /// at once, and the write lands `delay` later if its condition still holds then, as a
    /// request stuck in a retransmission queue does long after its client timed out. Only
    /// conditional writes keep such a straggler from undoing what happened meanwhile.
    pub fn set_stragglers(&self, rate: f64, delay: Duration) {
        let mut s = self.state();
        s.straggler_rate = rate;
        s.straggler_delay = delay;
    }

    /// Every call waits a random time up to this before it is applied; a lease-table write
    /// also waits up to this after, for its response, so that a caller that stops waiting
    /// then (its future dropped: a timeout, a `select!`) has changed the table all the same.
    pub fn set_max_latency(&self, latency: Duration) {
        self.state().max_latency = latency;
    }

    /// A random time up to the maximum latency: how long a call takes to arrive, or a
    /// write's response to come back.
    pub(crate) fn latency(&self) -> Duration {
        let mut s = self.state();
        let max = s.max_latency;
        if max.is_zero() {
            max
        } else {
            max.mul_f64(s.rng.random::<f64>())
        }
    }

    /// Calls from `client` fail as if the network were down.
    pub fn partition(&self, client: &str) {
        self.state().partitioned.insert(client.to_owned());
    }

    /// Ends a [`partition`](Self::partition).
    pub fn heal(&self, client: &str) {
        self.state().partitioned.remove(client);
    }

    /// Freezes `client` until [`resume`](Self::resume), like a process stopped by SIGSTOP, a
    /// long GC pause or a VM suspend: its backend calls hang, and everything run with
    /// [`run_as`](Self::run_as) for it (the whole worker: every task, every timer) stops.
    pub fn pause(&self, client: &str) {
        let mut s = self.state();
        s.frozen.entry(client.to_owned()).or_default();
        self.paused.send_modify(|p| {
            p.insert(client.to_owned());
        });
    }

    /// Ends a [`pause`](Self::pause): the process goes on with the state it had, and timers
    /// that fell due meanwhile fire at once.
    pub fn resume(&self, client: &str) {
        let wakers = {
            let mut s = self.state();
            self.paused.send_modify(|p| {
                p.remove(client);
            });
            s.frozen.remove(client).unwrap_or_default()
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    /// True (and `waker` kept for [`resume`](Self::resume)) while `client` is paused.
    pub(crate) fn hold_if_paused(&self, client: &str, waker: &Waker) -> bool {
        let mut s = self.state();
        match s.frozen.get_mut(client) {
            Some(waiting) => {
                if !waiting.iter().any(|w| w.will_wake(waker)) {
                    waiting.push(waker.clone());
                }
                true
            }
            None => false,
        }
    }

    /// True while `client` is paused.
    pub fn is_paused(&self, client: &str) -> bool {
        self.paused.borrow().contains(client)
    }

    /// Waits while `client` is paused.
    pub async fn wait_while_paused(&self, client: &str) {
        let mut rx = self.paused.subscribe();
        let _ = rx.wait_for(|p| !p.contains(client)).await;
    }

    /// Turns every fault off (pauses and partitions included).
    pub fn clear(&self) {
        let wakers = {
            let mut s = self.state();
            s.error_rate = 0.0;
            s.throttle_rate = 0.0;
            s.ambiguous_rate = 0.0;
            s.expired_iterator_rate = 0.0;
            s.max_latency = Duration::ZERO;
            s.straggler_rate = 0.0;
            s.partitioned.clear();
            self.paused.send_modify(BTreeSet::clear);
            std::mem::take(&mut s.frozen)
        };
        wakers.into_values().flatten().for_each(Waker::wake);
    }

    /// Decides the fate of one call by `client`, after its pause and latency.
    pub(crate) async fn enter(
        &self,
        client: &str,
        operation: &'static str,
        write: bool,
    ) -> Result<Fate, BackendError> {
        self.wait_while_paused(client).await;
        let latency = self.latency();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
            self.wait_while_paused(client).await;
        }
        let mut s = self.state();
        if s.partitioned.contains(client) {
            return Err(BackendError::new(
                ErrorKind::Retryable,
                operation,
                "injected: network partition",
            ));
        }
        let (e, t, a) = (s.error_rate, s.throttle_rate, s.ambiguous_rate);
        if e > 0.0 && s.rng.random_bool(e.min(1.0)) {
            return Err(BackendError::new(
                ErrorKind::Retryable,
                operation,
                "injected: transient error",
            ));
        }
        if t > 0.0 && s.rng.random_bool(t.min(1.0)) {
            return Err(BackendError::new(
                ErrorKind::Throttled,
                operation,
                "injected: throttled",
            ));
        }
        if write && a > 0.0 && s.rng.random_bool(a.min(1.0)) {
            return Ok(Fate::ApplyThenFail);
        }
        let straggle = s.straggler_rate;
        if write && straggle > 0.0 && s.rng.random_bool(straggle.min(1.0)) {
            return Ok(Fate::Straggle(s.straggler_delay));
        }
        Ok(Fate::Apply)
    }

    /// True if this `get_records` call should find its iterator expired.
    pub(crate) fn iterator_expires(&self) -> bool {
        let mut s = self.state();
        let r = s.expired_iterator_rate;
        r > 0.0 && s.rng.random_bool(r.min(1.0))
    }
}

impl Fate {
    /// Applies `fate` to a write's result.
    pub(crate) fn report<T>(
        self,
        operation: &'static str,
        result: Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        match (self, result) {
            (Self::Straggle(_), _) => Err(BackendError::new(
                ErrorKind::Retryable,
                operation,
                "injected: no answer; the write may still land",
            )),
            (Self::ApplyThenFail, Ok(_)) => Err(BackendError::new(
                ErrorKind::Retryable,
                operation,
                "injected: response lost after write",
            )),
            (_, result) => result,
        }
    }
}
