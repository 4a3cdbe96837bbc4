use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::memory::MemoryLeaseStore;

/// (candidate, started, ended) of every run of the task.
type Runs = Arc<Mutex<Vec<(String, Instant, Option<Instant>)>>>;

fn config() -> SingletonConfig {
    SingletonConfig::default()
        .failover_time(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(200))
}

fn candidate(
    name: &str,
    store: &MemoryLeaseStore,
    runs: &Runs,
) -> (
    tokio::task::JoinHandle<Result<(), Error>>,
    CancellationToken,
) {
    slow_candidate(name, store, runs, Duration::ZERO)
}

/// Records the end of a run when dropped: whether the task returned or was dropped mid-run.
struct RunGuard {
    runs: Runs,
    index: usize,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        let mut r = self
            .runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        r[self.index].2.get_or_insert_with(Instant::now);
    }
}

/// A candidate whose task needs `wind_down` to stop once its token is cancelled.
fn slow_candidate(
    name: &str,
    store: &MemoryLeaseStore,
    runs: &Runs,
    wind_down: Duration,
) -> (
    tokio::task::JoinHandle<Result<(), Error>>,
    CancellationToken,
) {
    let singleton = Singleton::new("compactor", name, store.client(name), config())
        .unwrap_or_else(|e| unreachable!("{e}"));
    let shutdown = CancellationToken::new();
    let (runs, me, stop) = (runs.clone(), name.to_owned(), shutdown.clone());
    let task = tokio::spawn(async move {
        singleton
            .run(stop, |lost| {
                let (runs, me) = (runs.clone(), me.clone());
                async move {
                    let index = {
                        let mut r = runs
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        r.push((me, Instant::now(), None));
                        r.len() - 1
                    };
                    let _guard = RunGuard { runs, index };
                    lost.cancelled().await;
                    sleep(wind_down).await;
                }
            })
            .await
    });
    (task, shutdown)
}

fn snapshot(runs: &Runs) -> Vec<(String, Instant, Option<Instant>)> {
    runs.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// No two runs overlap in time.
fn assert_exclusive(runs: &[(String, Instant, Option<Instant>)]) {
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            let a_end = a.2.unwrap_or_else(Instant::now);
            assert!(
                b.1 >= a_end || b.2.is_some_and(|e| e <= a.1),
                "{a:?} overlaps {b:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn one_runs_and_a_crash_fails_over() {
    let (store, runs) = (MemoryLeaseStore::new(), Runs::default());
    let _ = store.ensure_table(TableFeatures::NONE).await;
    let candidates: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| candidate(n, &store, &runs))
        .collect();
    sleep(Duration::from_secs(5)).await;
    let now = snapshot(&runs);
    assert_eq!(now.len(), 1, "exactly one runs: {now:?}");
    let first = now[0].0.clone();
    let index = ["a", "b", "c"]
        .iter()
        .position(|n| *n == first)
        .unwrap_or_else(|| unreachable!());
    candidates[index].0.abort(); // crash: nothing released, the task is dropped mid-run
    let crashed_at = Instant::now();
    let mut taken = None;
    while crashed_at.elapsed() < Duration::from_secs(10) && taken.is_none() {
        sleep(Duration::from_millis(50)).await;
        taken = snapshot(&runs)
            .get(1)
            .map(|r| r.1.duration_since(crashed_at));
    }
    let bound = config().failover_time + config().poll_interval * 2;
    assert!(taken.is_some_and(|t| t <= bound), "failover took {taken:?}");
    for (i, (task, stop)) in candidates.into_iter().enumerate() {
        stop.cancel();
        if i != index {
            assert!(matches!(task.await, Ok(Ok(()))));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_at_once_and_a_partitioned_holder_stops_before_anyone_starts() {
    let (store, runs) = (MemoryLeaseStore::new(), Runs::default());
    let _ = store.ensure_table(TableFeatures::NONE).await;
    let (a, stop_a) = candidate("a", &store, &runs);
    sleep(Duration::from_secs(1)).await;
    let (b, stop_b) = candidate("b", &store, &runs);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        snapshot(&runs)
            .iter()
            .map(|r| r.0.as_str())
            .collect::<Vec<_>>(),
        ["a"]
    );

    // Graceful: b takes over within a poll or two, without waiting for expiry.
    stop_a.cancel();
    assert!(matches!(a.await, Ok(Ok(()))));
    let released = Instant::now();
    sleep(config().poll_interval * 2).await;
    let r = snapshot(&runs);
    assert_eq!(r.len(), 2);
    assert!(r[1].0 == "b" && r[1].1.duration_since(released) <= config().poll_interval * 2);

    // b is cut off from the store: it must stop before c can start.
    let (c, stop_c) = candidate("c", &store, &runs);
    store.faults().partition("b");
    sleep(Duration::from_secs(10)).await;
    store.faults().heal("b");
    let r = snapshot(&runs);
    assert!(r.len() >= 3 && r[2].0 == "c", "{r:?}");
    assert_exclusive(&r);
    for (task, stop) in [(b, stop_b), (c, stop_c)] {
        stop.cancel();
        assert!(matches!(task.await, Ok(Ok(()))));
    }
}

#[tokio::test(start_paused = true)]
async fn a_task_slow_to_stop_is_dropped_before_the_next_holder_starts() {
    let (store, runs) = (MemoryLeaseStore::new(), Runs::default());
    let _ = store.ensure_table(TableFeatures::NONE).await;
    let wind_down = Duration::from_secs(2);
    let (a, stop_a) = slow_candidate("a", &store, &runs, wind_down);
    sleep(Duration::from_secs(1)).await;
    let (b, stop_b) = slow_candidate("b", &store, &runs, wind_down);
    sleep(Duration::from_secs(1)).await;
    store.faults().partition("a"); // a's renewals fail from now on
    sleep(Duration::from_secs(10)).await;
    store.faults().heal("a");
    let r = snapshot(&runs);
    assert!(r.len() >= 2 && r[0].0 == "a" && r[1].0 == "b", "{r:?}");
    assert_exclusive(&r);
    for (task, stop) in [(a, stop_a), (b, stop_b)] {
        stop.cancel();
        assert!(matches!(task.await, Ok(Ok(()))));
    }
}

#[test]
fn the_workers_own_names_are_reserved() {
    let store = MemoryLeaseStore::new();
    for name in RESERVED.into_iter().chain(["worker/w1", "drain/w1"]) {
        let refused = Singleton::new(name, "me", store.clone(), config());
        assert_eq!(refused.err().map(|e| e.key), Some("name"), "{name}");
    }
    assert!(Singleton::new("nightly-report", "me", store, config()).is_ok());
}

/// Runs `singleton` as candidate `name`, noting in `runs` when each run of its task starts.
fn recorded(
    name: &str,
    singleton: Arc<Singleton<MemoryLeaseStore>>,
    runs: &Runs,
) -> (
    tokio::task::JoinHandle<Result<(), Error>>,
    CancellationToken,
) {
    let (runs, stop, name) = (runs.clone(), CancellationToken::new(), name.to_owned());
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        singleton
            .run(stopped, |lost| {
                let (runs, name) = (runs.clone(), name.clone());
                async move {
                    runs.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((name, Instant::now(), None));
                    lost.cancelled().await;
                }
            })
            .await
    });
    (task, stop)
}

/// When `name`'s task first started.
fn first_run(runs: &Runs, name: &str) -> Option<Instant> {
    runs.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .find(|(who, ..)| who == name)
        .map(|(_, at, _)| *at)
}

/// A candidate handed its row (a follower the leader made the standby) is poked by the read
/// that showed it so, and that poll reads the row itself: its sighting, from an older read of
/// the whole table, shows the old holder (a surge deploy's new standby took 15 s to take
/// over, and the fleet was without a leader meanwhile).
#[tokio::test(start_paused = true)]
async fn a_candidate_poked_reads_the_row_not_its_sighting() {
    // The mutation check runs this test with the mutation it catches (`Mutation::unit_test`).
    crate::mutation::set_from_env();
    let store = MemoryLeaseStore::new();
    let runs: Runs = Arc::default();
    let (holder, holder_stop) = candidate("a", &store, &runs);
    sleep(Duration::from_secs(1)).await;
    let row = || {
        store
            .leases()
            .into_iter()
            .find(|l| l.key.as_str().ends_with("compactor"))
            .unwrap_or_else(|| unreachable!("the row exists"))
    };
    // "b" saw the row held by "a", and polls seldom, as a follower's role candidate does.
    let sighting = Arc::new(take::Sighting::default());
    sighting.saw(row(), None, Instant::now());
    let seldom = config().poll_interval(Duration::from_secs(60));
    let b = Singleton::new("compactor", "b", store.client("b"), seldom)
        .unwrap_or_else(|e| unreachable!("{e}"))
        .with_sighting(sighting);
    let b = Arc::new(b);
    let (b_task, b_stop) = recorded("b", b.clone(), &runs);
    sleep(Duration::from_millis(500)).await;
    // "a" gives the row up and it is handed to "b" (a take on its behalf), which is told.
    holder_stop.cancel();
    let _ = holder.await;
    let handed = store.take(&row(), &WorkerId::new("b")).await;
    assert!(handed.is_ok(), "{handed:?}");
    let at = Instant::now();
    b.poke();
    sleep(Duration::from_secs(1)).await;
    let taken = first_run(&runs, "b").map(|started| started - at);
    assert!(
        taken.is_some_and(|t| t <= Duration::from_millis(100)),
        "b took the row handed to it after {taken:?}"
    );
    b_stop.cancel();
    let _ = b_task.await;
}

/// A candidate handed sightings of its row (a worker's standby, which follows the table)
/// that stopped coming (the standby was demoted) reads the row itself again: when the
/// holder dies it takes over within the failover time and a few polls, not never.
#[tokio::test(start_paused = true)]
async fn a_candidate_whose_sightings_stopped_reads_the_row_itself() {
    // The mutation check runs this test with the mutation it catches (`Mutation::unit_test`).
    crate::mutation::set_from_env();
    let store = MemoryLeaseStore::new();
    let runs: Runs = Arc::default();
    let (holder, holder_stop) = candidate("a", &store, &runs);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(runs.lock().unwrap_or_else(|p| p.into_inner()).len(), 1);

    // "b" was handed one sighting, long ago, and none since.
    let sighting = Arc::new(take::Sighting::default());
    let row = store
        .leases()
        .into_iter()
        .find(|l| l.key.as_str().ends_with("compactor"))
        .unwrap_or_else(|| unreachable!("the row exists"));
    sighting.saw(row, None, Instant::now());
    let b = Singleton::new("compactor", "b", store.client("b"), config())
        .unwrap_or_else(|e| unreachable!("{e}"))
        .with_sighting(sighting);
    let (b_task, b_stop) = recorded("b", Arc::new(b), &runs);
    sleep(Duration::from_secs(30)).await;

    // "a" dies (its task aborted: no release), and "b" must notice.
    holder.abort();
    drop(holder_stop);
    let died = Instant::now();
    sleep(Duration::from_secs(10)).await;
    let taken = first_run(&runs, "b");
    assert!(taken.is_some(), "b never took over from a dead holder");
    let taken = taken.unwrap_or(died);
    assert!(
        taken - died <= config().failover_time + Duration::from_secs(2),
        "b took over {:?} after a died",
        taken - died
    );
    b_stop.cancel();
    let _ = b_task.await;
}
