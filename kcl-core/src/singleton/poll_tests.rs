//! A candidate asked to poll faster does so at once, wherever it is waiting.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::*;
use crate::memory::{Faults, MemoryLeaseStore};

/// A candidate whose first look at the table failed (throttled) waits its poll interval before
/// the next. Asked meanwhile to poll faster (a worker's leader candidate once the worker
/// stands by, which polls every taker interval), it must not sleep out the slow interval
/// first: the simulation's seed 659 had a free leader row that its standby left untaken for
/// 13 s so, while the fleet went unbalanced.
#[tokio::test(start_paused = true)]
async fn a_candidate_asked_to_poll_faster_after_a_failed_start_does_not_sleep_out_the_slow_interval()
 {
    let faults = Faults::seeded(1);
    let store = MemoryLeaseStore::with_faults(faults.clone());
    let config = SingletonConfig::default()
        .failover_time(Duration::from_secs(3))
        .poll_interval(Duration::from_secs(18));
    let candidate = Arc::new(
        Singleton::new("compactor", "a", store.client("a"), config)
            .unwrap_or_else(|e| unreachable!("{e}")),
    );
    faults.set_error_rate(1.0);
    let started: Arc<Mutex<Option<Instant>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let task = {
        let (candidate, started, stop) = (candidate.clone(), started.clone(), shutdown.clone());
        tokio::spawn(async move {
            candidate
                .run(stop, |lost| {
                    let started = started.clone();
                    async move {
                        started
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .get_or_insert_with(Instant::now);
                        lost.cancelled().await;
                    }
                })
                .await
        })
    };
    // Its first call failed; it now waits its 18 s.
    sleep(Duration::from_millis(100)).await;
    faults.set_error_rate(0.0);
    let asked = Instant::now();
    candidate.set_poll_interval(Duration::from_millis(500));
    sleep(Duration::from_secs(3)).await;
    let started = *started
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(
        started.is_some_and(|at| at - asked <= Duration::from_millis(500)),
        "asked to poll every 500 ms, the candidate took the free row {:?} later",
        started.map(|at| at - asked)
    );
    shutdown.cancel();
    let _ = task.await;
}
