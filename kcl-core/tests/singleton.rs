//! Singletons for applications, on the in-memory lease table under paused time: fencing
//! tokens grow with every change of holder, health mode moves an unhealthy task to another
//! candidate without flapping, and a periodic job runs once per period on one holder, never
//! twice for a period across a failover.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use kcl_core::ShardId;
use kcl_core::lease::usage::Operation;
use kcl_core::lease::{LeaseStore, TableFeatures};
use kcl_core::memory::{Faults, MemoryLeaseStore, MemoryNetwork};
use kcl_core::singleton::{
    COORDINATION_PREFIX, Clock, FencingToken, Messenger, Singleton, SingletonConfig,
    SingletonHandle, TaskContext,
};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

fn config() -> SingletonConfig {
    SingletonConfig::default()
        .failover_time(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(200))
}

/// A wall clock that follows paused tokio time.
fn clock() -> Clock {
    let (wall, start) = (Utc::now(), Instant::now());
    Arc::new(move || -> DateTime<Utc> { wall + start.elapsed() })
}

type Runs = Arc<Mutex<Vec<(String, FencingToken, Instant)>>>;

/// A candidate whose task runs until cancelled, healthy unless told otherwise.
fn candidate(
    me: &str,
    store: &MemoryLeaseStore,
    config: SingletonConfig,
    runs: &Runs,
    healthy: bool,
) -> (JoinHandle<Result<(), kcl_core::Error>>, CancellationToken) {
    let singleton = Singleton::new("task", me, store.client(me), config).unwrap();
    let stop = CancellationToken::new();
    let (runs, me, token) = (runs.clone(), me.to_owned(), stop.clone());
    let task = tokio::spawn(async move {
        singleton
            .run_with(token, |ctx: TaskContext| {
                let (runs, me) = (runs.clone(), me.clone());
                async move {
                    runs.lock()
                        .unwrap()
                        .push((me, ctx.fencing_token(), Instant::now()));
                    loop {
                        if healthy {
                            ctx.heartbeat();
                        }
                        tokio::select! {
                            () = ctx.cancelled().cancelled() => return,
                            () = sleep(Duration::from_millis(200)) => {}
                        }
                    }
                }
            })
            .await
    });
    (task, stop)
}

#[tokio::test(start_paused = true)]
async fn fencing_tokens_grow_with_every_change_of_holder() {
    let store = MemoryLeaseStore::new();
    let runs = Runs::default();
    let (a, stop_a) = candidate("a", &store, config(), &runs, true);
    sleep(Duration::from_secs(1)).await;
    let (b, stop_b) = candidate("b", &store, config(), &runs, true);
    sleep(Duration::from_secs(5)).await;
    a.abort(); // crashed: b takes over after the failover time
    sleep(Duration::from_secs(10)).await;
    let (c, stop_c) = candidate("c", &store, config(), &runs, true);
    sleep(Duration::from_secs(1)).await;
    stop_b.cancel(); // released: c takes over at once
    b.await.unwrap().unwrap();
    sleep(Duration::from_secs(3)).await;
    let seen = runs.lock().unwrap().clone();
    let holders: Vec<&str> = seen.iter().map(|(m, _, _)| m.as_str()).collect();
    assert_eq!(holders, ["a", "b", "c"]);
    assert!(
        seen.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens must grow: {seen:?}"
    );
    stop_a.cancel();
    stop_c.cancel();
    c.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_unhealthy_task_moves_to_another_candidate_without_flapping() {
    let store = MemoryLeaseStore::new();
    let runs = Runs::default();
    let health = config().health_timeout(Duration::from_secs(2));
    // a's task hangs (never heartbeats); b's is healthy.
    let (a, stop_a) = candidate("a", &store, health.clone(), &runs, false);
    sleep(Duration::from_millis(500)).await;
    let (b, stop_b) = candidate("b", &store, health, &runs, true);
    sleep(Duration::from_secs(30)).await;
    let seen = runs.lock().unwrap().clone();
    let holders: Vec<&str> = seen.iter().map(|(m, _, _)| m.as_str()).collect();
    // a ran once, was found unhealthy after 2 s, cancelled (its stop timeout 0.75 s), and
    // released; b took it and kept it.
    assert_eq!(holders, ["a", "b"], "{seen:?}");
    let moved = seen[1].2 - seen[0].2;
    assert!(
        moved <= Duration::from_secs(2) + Duration::from_millis(750 + 400),
        "moved after {moved:?}"
    );
    stop_a.cancel();
    stop_b.cancel();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_task_broken_everywhere_backs_off_instead_of_flapping() {
    let store = MemoryLeaseStore::new();
    let runs = Runs::default();
    let health = config().health_timeout(Duration::from_secs(1));
    let (a, stop_a) = candidate("a", &store, health.clone(), &runs, false);
    let (b, stop_b) = candidate("b", &store, health, &runs, false);
    sleep(Duration::from_secs(120)).await;
    let starts = runs.lock().unwrap().len();
    // Without the penalty each candidate would restart it every ~2 s: about 60 starts. With
    // it, each waits 3, 6, 12, 24, 48, 48… seconds after an unhealthy run.
    assert!(starts <= 16, "{starts} starts in 2 minutes");
    assert!(starts >= 6, "it must still be retried: {starts} starts");
    stop_a.cancel();
    stop_b.cancel();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_periodic_job_runs_once_per_period_across_failovers() {
    let store = MemoryLeaseStore::new();
    let runs: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let clock = clock();
    let period = Duration::from_secs(2);
    let start = |me: &str| {
        let singleton = Singleton::new("report", me, store.client(me), config())
            .unwrap()
            .with_clock(clock.clone());
        let stop = CancellationToken::new();
        let (runs, me, token) = (runs.clone(), me.to_owned(), stop.clone());
        let task = tokio::spawn(async move {
            singleton
                .every(period, token, move |p| {
                    let (runs, me) = (runs.clone(), me.clone());
                    async move {
                        runs.lock().unwrap().push((me, p.index));
                        // A run takes a while: a crash can land in the middle of one.
                        sleep(Duration::from_millis(500)).await;
                    }
                })
                .await
        });
        (task, stop)
    };
    let (a, _stop_a) = start("a");
    let (b, stop_b) = start("b");
    let (c, stop_c) = start("c");
    sleep(Duration::from_secs(9)).await;
    a.abort(); // the holder crashes (a started first, so it held the job)
    sleep(Duration::from_secs(12)).await;
    let holder_now = runs.lock().unwrap().last().unwrap().0.clone();
    if holder_now == "b" {
        stop_b.cancel();
        b.await.unwrap().unwrap();
    } else {
        stop_c.cancel();
        c.await.unwrap().unwrap();
    }
    sleep(Duration::from_secs(9)).await;
    let seen = runs.lock().unwrap().clone();
    let mut per_period: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for (me, index) in &seen {
        per_period.entry(*index).or_default().push(me);
    }
    let twice: Vec<_> = per_period.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(twice.is_empty(), "a period ran twice: {twice:?}");
    // One holder across periods, not an election per period.
    let holders: Vec<&str> = seen.iter().map(|(m, _)| m.as_str()).collect();
    let changes = holders.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(changes, 2, "{holders:?}");
    // Never skipped for more than failover time + one period: at most 2 periods of 2 s.
    let indices: Vec<u64> = per_period.keys().copied().collect();
    assert!(
        indices.windows(2).all(|w| w[1] - w[0] <= 3),
        "a gap longer than failover + one period: {indices:?}"
    );
    assert!(indices.len() >= 12, "{indices:?}");
}

/// Reads of the lease table so far (every candidate reads the row with a `get`).
fn gets(store: &MemoryLeaseStore) -> u64 {
    store.table_usage().of(Operation::Get).requests
}

/// Waits until the task has started `n` times; returns when the last start was.
async fn started(runs: &Runs, n: usize) -> Instant {
    loop {
        if let Some(run) = runs.lock().unwrap().get(n - 1) {
            return run.2;
        }
        sleep(Duration::from_millis(10)).await;
    }
}

/// The stop token of the candidate that started the task last.
fn last_holder<'a>(
    runs: &Runs,
    stops: &'a BTreeMap<String, CancellationToken>,
) -> &'a CancellationToken {
    let me = runs.lock().unwrap().last().unwrap().0.clone();
    &stops[&me]
}

#[tokio::test(start_paused = true)]
async fn standbys_keep_failover_and_cut_reads() {
    // Without standbys, then the default line of two, then one.
    let mut reads = Vec::new();
    for standbys in [0, 2, 1] {
        let store = MemoryLeaseStore::new();
        let runs = Runs::default();
        let config = config().standbys(standbys);
        let (a, _stop_a) = candidate("a", &store, config.clone(), &runs, true);
        sleep(Duration::from_millis(100)).await;
        let others: BTreeMap<String, _> = ["b", "c", "d", "e"]
            .iter()
            .map(|me| {
                (
                    me.to_string(),
                    candidate(me, &store, config.clone(), &runs, true),
                )
            })
            .collect();
        let stops = others
            .iter()
            .map(|(me, (_, stop))| (me.clone(), stop.clone()))
            .collect();
        // A steady minute: one holder, four candidates.
        sleep(Duration::from_secs(10)).await;
        let renewals = |s: &MemoryLeaseStore| s.table_usage().of(Operation::Renew).requests;
        let before = (gets(&store), renewals(&store));
        sleep(Duration::from_secs(60)).await;
        reads.push((
            standbys,
            gets(&store) - before.0,
            renewals(&store) - before.1,
        ));
        // The holder dies: the next holder starts within failover + a poll.
        a.abort();
        let died = Instant::now();
        let took = started(&runs, 2).await - died;
        let poll = Duration::from_millis(200);
        assert!(
            took <= Duration::from_secs(3) + poll + Duration::from_millis(100),
            "{standbys} standbys: a new holder after {took:?}"
        );
        // At once, the new holder stops (SIGTERM): the next in line starts within a poll
        // (what one standby, having just moved up, cannot do). Then once more, before the
        // slow candidates read anything: the line has run out, and one of them takes the
        // last standby row at its next read (2 × failover time), then the rows ahead.
        for n in 3..=4 {
            last_holder(&runs, &stops).cancel();
            let stopped = Instant::now();
            let took = started(&runs, n).await - stopped;
            let bound = if standbys == 0 || n <= usize::from(standbys) + 1 {
                poll * 2 + Duration::from_millis(100)
            } else {
                Duration::from_secs(6) + poll * 3 + Duration::from_millis(100)
            };
            assert!(
                took <= bound,
                "{standbys} standbys: stop {n}: a new holder after {took:?}"
            );
        }
        for (_, (task, stop)) in others {
            stop.cancel();
            task.await.unwrap().unwrap();
        }
    }
    // What README's cost formula says, for W = 5 candidates, a 200 ms poll and a 3 s
    // failover time: per minute, without standbys W - 1 candidates read every poll; with k,
    // the k standbys read every poll, the W - 1 - k others the last standby row every 2 ×
    // and the k rows ahead every 6 × the failover time. Renewals: the holder and each
    // standby, every third of the failover time.
    for (&(standbys, got_reads, got_renewals), expected) in reads.iter().zip([
        (4.0 * 300.0, 60.0),
        (
            2.0 * 300.0 + 2.0 * (2.0 * 60.0 / 18.0 + 60.0 / 6.0),
            3.0 * 60.0,
        ),
        (300.0 + 3.0 * (60.0 / 18.0 + 60.0 / 6.0), 2.0 * 60.0),
    ]) {
        let near = |got: u64, want: f64| (got as f64 - want).abs() <= want * 0.01 + 2.0;
        assert!(
            near(got_reads, expected.0) && near(got_renewals, expected.1),
            "{standbys} standbys: {got_reads} reads and {got_renewals} renewals in a minute, expected {expected:?}"
        );
    }
    println!("reads and renewals in a minute, 5 candidates, by standbys: {reads:?}");
}

/// Who holds the row and the two standby rows of the singleton "task".
async fn line(store: &MemoryLeaseStore) -> Vec<Option<String>> {
    let mut owners = Vec::new();
    for name in ["task", "task/standby", "task/standby/standby"] {
        let key = ShardId::new(format!("{COORDINATION_PREFIX}{name}"));
        let row = store.get(&key).await.unwrap();
        owners.push(row.and_then(|r| r.owner).map(|o| o.to_string()));
    }
    owners
}

#[tokio::test(start_paused = true)]
async fn the_line_forms_at_once() {
    // One candidate starts, two more a moment later: the first holds the row, the others
    // stand in line within a poll, not after the slow candidates' 2 × failover time. Calls
    // take up to 40 ms, so that they interleave; over many schedules.
    for seed in 0..40 {
        let faults = Faults::seeded(seed);
        faults.set_max_latency(Duration::from_millis(40));
        let store = MemoryLeaseStore::with_faults(faults);
        let runs = Runs::default();
        let mut all = vec![candidate("a", &store, config(), &runs, true)];
        sleep(Duration::from_millis(100)).await;
        all.extend(
            ["b", "c"]
                .iter()
                .map(|me| candidate(me, &store, config(), &runs, true)),
        );
        sleep(Duration::from_millis(400)).await;
        let owners = line(&store).await;
        let standbys: BTreeSet<_> = owners[1..].iter().flatten().map(String::as_str).collect();
        assert!(
            owners[0].as_deref() == Some("a") && standbys == BTreeSet::from(["b", "c"]),
            "seed {seed}: {owners:?}"
        );
        for (task, stop) in all {
            stop.cancel();
            task.await.unwrap().unwrap();
        }
        // Shutdown hands every row back.
        assert_eq!(line(&store).await, [None, None, None], "seed {seed}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_candidate_stopped_mid_take_leaves_the_row_free() {
    // Stopped at every moment of its first poll (read, create, take; responses take up to
    // 40 ms to come back): the row ends up free, never held by a candidate that is gone.
    for at in (0..200).step_by(4) {
        let faults = Faults::seeded(at);
        faults.set_max_latency(Duration::from_millis(40));
        let store = MemoryLeaseStore::with_faults(faults);
        store.ensure_table(TableFeatures::NONE).await.unwrap();
        let runs = Runs::default();
        let (task, stop) = candidate("a", &store, config(), &runs, true);
        sleep(Duration::from_millis(at)).await;
        stop.cancel();
        task.await.unwrap().unwrap();
        assert_eq!(line(&store).await, [None, None, None], "stopped {at} ms in");
    }
}

/// A candidate whose instance records every message its inbox gets.
fn receiver(
    me: &str,
    store: &MemoryLeaseStore,
    network: &MemoryNetwork,
    got: &Arc<Mutex<Vec<(String, String)>>>,
) -> (JoinHandle<Result<(), kcl_core::Error>>, CancellationToken) {
    let messenger = Arc::new(network.messenger(me, Faults::default()));
    let singleton = Singleton::new("feed", me, store.client(me), config())
        .unwrap()
        .with_messenger(messenger);
    let stop = CancellationToken::new();
    let (got, me, token) = (got.clone(), me.to_owned(), stop.clone());
    let task = tokio::spawn(async move {
        singleton
            .run_with(token, |ctx: TaskContext| {
                let (got, me) = (got.clone(), me.clone());
                async move {
                    let mut inbox = ctx.inbox().expect("an inbox");
                    loop {
                        tokio::select! {
                            () = ctx.cancelled().cancelled() => return,
                            Some(m) = inbox.recv() => {
                                got.lock().unwrap().push((me.clone(), String::from_utf8_lossy(&m).into_owned()));
                            }
                        }
                    }
                }
            })
            .await
    });
    (task, stop)
}

#[tokio::test(start_paused = true)]
async fn messages_reach_the_instance_wherever_it_runs() {
    let store = MemoryLeaseStore::new();
    let network = MemoryNetwork::default();
    let got: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let (a, _stop_a) = receiver("a", &store, &network, &got);
    sleep(Duration::from_millis(100)).await;
    let (b, stop_b) = receiver("b", &store, &network, &got);
    let (c, stop_c) = receiver("c", &store, &network, &got);
    let sender: Arc<dyn Messenger> = Arc::new(network.messenger("sender", Faults::default()));
    let handle = SingletonHandle::new(
        "feed",
        store.client("sender"),
        sender,
        Duration::from_millis(200),
    );
    let mut sent = Vec::new();
    for i in 0..30 {
        if i == 10 {
            // The holder dies: sends wait for the next holder. (A message its inbox took just
            // before would be lost with it: the guarantee is delivery to the instance.)
            a.abort();
            sleep(Duration::from_millis(10)).await;
        }
        if i == 20 {
            // The next holder stops gracefully: sends move at once.
            let holder = got.lock().unwrap().last().unwrap().0.clone();
            if holder == "b" {
                stop_b.cancel();
            } else {
                stop_c.cancel();
            }
        }
        let message = format!("m{i}");
        let result = handle
            .send(Bytes::from(message.clone()), Duration::from_secs(10))
            .await;
        assert!(result.is_ok(), "{message}: {result:?}");
        sent.push(message);
        sleep(Duration::from_millis(300)).await;
    }
    sleep(Duration::from_millis(100)).await;
    let got = got.lock().unwrap().clone();
    let texts: Vec<&str> = got.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(texts, sent, "each message once, in order");
    let holders: Vec<&str> = got.iter().map(|(w, _)| w.as_str()).collect();
    assert_eq!(
        holders.iter().filter(|w| **w == "a").count(),
        10,
        "{holders:?}"
    );
    stop_b.cancel();
    stop_c.cancel();
    b.await.unwrap().unwrap();
    c.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_send_without_a_holder_fails_after_its_deadline() {
    let store = MemoryLeaseStore::new();
    let network = MemoryNetwork::default();
    let sender: Arc<dyn Messenger> = Arc::new(network.messenger("sender", Faults::default()));
    let handle = SingletonHandle::new("feed", store, sender, Duration::from_millis(200));
    let started = Instant::now();
    let error = handle
        .send(Bytes::from_static(b"hello"), Duration::from_secs(2))
        .await
        .expect_err("nobody holds it");
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(!error.maybe_delivered, "{error}");
}
