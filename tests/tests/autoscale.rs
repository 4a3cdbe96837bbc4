//! The fleet's autoscaling signals through KEDA's external scaler, with real processes: three
//! test workers serve as deployed processes do (`--http`: kcl-serve, its `POST /drain` and the
//! scaler), and a gRPC client generated from KEDA's `externalscaler.proto` calls each one's
//! scaler while a burst is produced and read.
//!
//! - Before the burst the fleet is idle and asks for `min-workers` (1). During it `IsActive`
//!   is true (and `StreamIsActive` says so), `GetMetrics` (`desiredWorkers`) rises, and once
//!   the backlog is read it falls back (after the scale-down window, 5 s here).
//! - Every value `GetMetrics` answers equals the leader's `/metrics`
//!   `kcl_fleet_desired_workers`. On the leader exactly: its scaler's answer is bracketed by
//!   two reads of its gauge, and equals one of them (the gauge and the status are set in the
//!   same cycle; a cycle may fall between the reads). On the others, which answer from the
//!   row the leader publishes every second and which they read every second (on their taker
//!   cycle, 1 s), it equals a value the leader's gauge showed within the 3.5 s before (publish
//!   interval + read interval + a taker cycle + the sampling period), judged from 3.5 s after
//!   the first sample on: the tolerance is that lag, not a margin on the value.
//! - Then one worker is scaled in through `kcl-example-consumer drain` (its preStop): under a
//!   30 s restart grace, which a SIGTERM would honour by keeping its leases, it releases every
//!   one, exits 0, and the others own them within 3 s (taker cycle 1 s), far below the failover
//!   time (5 s) and the failover time + grace (35 s). Live records flow throughout, and every
//!   record written is delivered.
//!
//! Processing is slowed (20 ms a record) so that 2,000 records make a backlog the fleet takes
//! about 10 s to read: kinesis-mock itself is slow (a few hundred records a second).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use kcl_core::LeaseStore;
use kcl_integration_tests::http::http_get;
use kcl_integration_tests::journal::delivered_set;
use kcl_integration_tests::process::{WorkerProcess, workspace_bin};
use kcl_integration_tests::{Context, Producer, wait_until, with_timeout};
use kcl_scaler::proto::external_scaler_client::ExternalScalerClient;
use kcl_scaler::proto::{GetMetricsRequest, ScaledObjectRef};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const IDS: [&str; 3] = ["scale-a", "scale-b", "scale-c"];
const TAKER: Duration = Duration::from_secs(1);
const FAILOVER: Duration = Duration::from_secs(5);
/// How far a follower's answer may lag the leader's gauge: the publish interval (1 s), the
/// followers' read interval (1 s), a taker cycle (1 s) and the sampling period (see the module
/// docs).
const FOLLOWER_LAG: Duration = Duration::from_millis(3500);
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
const BURST: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scaler_follows_a_burst_and_a_drained_worker_hands_over_at_once() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new("autoscale").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(360), run(ctx)).await
}

/// A worker process and where it serves.
struct Served {
    process: WorkerProcess,
    http: SocketAddr,
    scaler: ExternalScalerClient<Channel>,
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(4).await?;
    let flags = [
        "--http",
        "--failover-ms",
        "5000",
        "--taker-ms",
        "1000",
        "--restart-grace-ms",
        "30000",
        "--publish-ms",
        "1000",
        "--catch-up-ms",
        "10000",
        "--scale-down-window-ms",
        "5000",
        "--smoothing-ms",
        "2000",
        "--record-delay-ms",
        "20",
        "--max-steal",
        "2",
    ];
    // Under a leader whatever KCL_TEST_COORDINATION says: the followers answer from the row
    // it publishes.
    let mut fleet = Vec::new();
    for id in IDS {
        let process = WorkerProcess::spawn_in("leader", WORKER, &ctx, id, &flags)?;
        fleet.push(serve(process).await?);
    }
    wait_until(
        "every shard held, every worker holding one",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let owners = ctx.owners().await.unwrap_or_default();
            let holders: BTreeSet<_> = owners.values().flatten().collect();
            Ok(owners.len() == 4 && owners.values().all(Option::is_some) && holders.len() == 3)
        },
    )
    .await
    .map_err(|e| e.context(logs(&fleet)))?;
    let leader = leader_of(&fleet)?;
    eprintln!("leader: {}", fleet[leader].process.id);
    spec_is_desired_workers_at_one(&fleet[leader]).await?;

    let samples = Samples::default();
    let stop = CancellationToken::new();
    let sampler = tokio::spawn(sample(
        fleet
            .iter()
            .map(|s| (s.process.id.clone(), s.scaler.clone()))
            .collect(),
        fleet[leader].http,
        samples.clone(),
        stop.clone(),
    ));
    let streamed = tokio::spawn(stream_active(
        fleet[(leader + 1) % 3].scaler.clone(),
        samples.streamed.clone(),
    ));
    let start = Instant::now();

    // Idle: the figure settles at min-workers on every scaler.
    samples
        .wait(
            "every scaler to answer 1 (idle)",
            Duration::from_secs(90),
            |s| s.all_answer(1, &fleet),
        )
        .await?;
    let burst_at = start.elapsed();
    // Rising and falling are judged on what the scalers said from here on.
    let from = samples.timeline.lock().unwrap().len();
    let burst: Vec<(String, String)> = (0..BURST)
        .map(|i| (format!("pk-{}", i % 64), format!("burst-{i}")))
        .collect();
    ctx.put(&burst).await?;
    eprintln!(
        "burst of {BURST} written {:?} after the start",
        start.elapsed()
    );
    samples
        .wait("the figure to rise", Duration::from_secs(60), |s| {
            s[from..].leader_max() >= 2
        })
        .await?;
    samples
        .wait(
            "the figure to fall back to 1",
            Duration::from_secs(120),
            |s| s[from..].fell_back() && s.all_answer(1, &fleet),
        )
        .await?;
    let fallen_at = start.elapsed();
    stop.cancel();
    sampler.await??;
    streamed.abort();
    let streamed = samples.streamed.lock().unwrap().clone();
    let s = samples.timeline.lock().unwrap().clone();
    eprintln!(
        "burst at {burst_at:?}, back to 1 at {fallen_at:?}: {}",
        timeline(&s)
    );
    check_answers(&s, &fleet[leader].process.id)?;
    ensure!(
        s[from..].iter().any(|x| x.active == Some(true)),
        "IsActive never true during the burst"
    );
    ensure!(
        streamed.contains(&true),
        "StreamIsActive never said true: {streamed:?}"
    );

    // Scale-in of a follower through its preStop drain, records flowing.
    let producer = Producer::start(&ctx, "live-", 8, Duration::from_millis(200));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leaving = (leader + 1) % 3;
    scale_in(&ctx, &mut fleet[leaving]).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut written = producer.stop().await?;
    written.extend(burst.into_iter().map(|(_, d)| d));
    wait_until(
        "every record delivered",
        Duration::from_secs(90),
        Duration::from_millis(500),
        async || {
            let journals = fleet
                .iter()
                .map(|s| s.process.events())
                .collect::<anyhow::Result<Vec<_>>>()?;
            let got = delivered_set(journals.iter().map(Vec::as_slice));
            Ok(written.iter().all(|d| got.contains(d)))
        },
    )
    .await
    .map_err(|e| e.context(logs(&fleet)))?;
    for s in &mut fleet {
        if s.process.is_running() {
            s.process.terminate()?;
        }
    }
    for s in &mut fleet {
        s.process.wait_exit(Duration::from_secs(20)).await?;
    }
    Ok(())
}

/// Waits for `process`'s `serving` line and connects to its scaler.
async fn serve(process: WorkerProcess) -> anyhow::Result<Served> {
    let mut addrs = None;
    wait_until(
        "the worker's serving line",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let events = process.events()?;
            addrs = events
                .iter()
                .find(|e| e.event == "serving")
                .and_then(|e| Some((e.http.clone()?, e.scaler.clone()?)));
            Ok(addrs.is_some())
        },
    )
    .await
    .map_err(|e| e.context(process.log_tail()))?;
    let (http, scaler) = addrs.context("no addresses")?;
    let scaler = kcl_scaler::connect(format!("http://{scaler}")).await?;
    Ok(Served {
        process,
        http: http.parse()?,
        scaler,
    })
}

/// The index of the worker the others name their leader.
fn leader_of(fleet: &[Served]) -> anyhow::Result<usize> {
    let (_, status) = http_get(fleet[0].http, "/status").context("/status")?;
    let status: serde_json::Value = serde_json::from_str(&status)?;
    let leader = status["leader"].as_str().context("no leader")?;
    fleet
        .iter()
        .position(|s| s.process.id == leader)
        .with_context(|| format!("leader {leader} is none of ours"))
}

fn object() -> ScaledObjectRef {
    ScaledObjectRef {
        name: "kcl".into(),
        namespace: "default".into(),
        scaler_metadata: HashMap::from([("scalerAddress".into(), "kcl:9091".into())]),
    }
}

async fn spec_is_desired_workers_at_one(served: &Served) -> anyhow::Result<()> {
    let spec = served.scaler.clone().get_metric_spec(object()).await?;
    let specs = spec.into_inner().metric_specs;
    ensure!(
        specs.len() == 1
            && specs[0].metric_name == "desiredWorkers"
            && specs[0].target_size == 1
            && specs[0].target_size_float == 1.0,
        "{specs:?}"
    );
    Ok(())
}

/// `GetMetrics` (`desiredWorkers`): the value, or the gRPC code of the error.
async fn desired(scaler: &ExternalScalerClient<Channel>) -> Result<i64, tonic::Code> {
    let request = GetMetricsRequest {
        scaled_object_ref: Some(object()),
        metric_name: "desiredWorkers".into(),
    };
    let answer = scaler.clone().get_metrics(request).await;
    let values = answer.map_err(|e| e.code())?.into_inner().metric_values;
    match values.as_slice() {
        [v] if v.metric_name == "desiredWorkers"
            && v.metric_value_float == v.metric_value as f64 =>
        {
            Ok(v.metric_value)
        }
        _ => Err(tonic::Code::Internal),
    }
}

async fn is_active(scaler: &ExternalScalerClient<Channel>) -> Option<bool> {
    let answer = scaler.clone().is_active(object()).await.ok()?;
    Some(answer.into_inner().result)
}

/// The leader's `kcl_fleet_desired_workers`, read from its `/metrics`.
async fn gauge(http: SocketAddr) -> Option<i64> {
    let (_, body) = tokio::task::spawn_blocking(move || http_get(http, "/metrics"))
        .await
        .ok()??;
    let line = body
        .lines()
        .find(|l| l.starts_with("kcl_fleet_desired_workers "))?;
    let value: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    #[allow(clippy::cast_possible_truncation)]
    Some(value as i64)
}

/// One round of samples.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    /// The leader's gauge before and after its scaler was asked.
    gauge: (Option<i64>, Option<i64>),
    /// Each worker's `GetMetrics` answer.
    answers: BTreeMap<String, Result<i64, tonic::Code>>,
    /// The first worker's `IsActive`.
    active: Option<bool>,
}

#[derive(Debug, Clone, Default)]
struct Samples {
    timeline: Arc<Mutex<Vec<Sample>>>,
    streamed: Arc<Mutex<Vec<bool>>>,
}

impl Samples {
    async fn wait(
        &self,
        what: &str,
        limit: Duration,
        done: impl Fn(&[Sample]) -> bool,
    ) -> anyhow::Result<()> {
        wait_until(what, limit, SAMPLE_EVERY, async || {
            Ok(done(&self.timeline.lock().unwrap()))
        })
        .await
        .map_err(|e| e.context(timeline(&self.timeline.lock().unwrap())))
        .map(drop)
    }
}

trait Timeline {
    fn all_answer(&self, value: i64, fleet: &[Served]) -> bool;
    fn leader_max(&self) -> i64;
    fn fell_back(&self) -> bool;
}

impl Timeline for [Sample] {
    /// The last round: every worker answered `value`.
    fn all_answer(&self, value: i64, fleet: &[Served]) -> bool {
        self.last().is_some_and(|s| {
            fleet
                .iter()
                .all(|w| s.answers.get(&w.process.id) == Some(&Ok(value)))
        })
    }

    fn leader_max(&self) -> i64 {
        self.iter()
            .filter_map(|s| s.gauge.1)
            .max()
            .unwrap_or_default()
    }

    /// The gauge fell below its highest value after reaching it.
    fn fell_back(&self) -> bool {
        let max = self.leader_max();
        let peak = self.iter().position(|s| s.gauge.1 == Some(max));
        peak.is_some_and(|p| self[p..].iter().any(|s| s.gauge.1.is_some_and(|g| g < max)))
    }
}

/// Samples the leader's gauge and every scaler every [`SAMPLE_EVERY`] until `stop`.
async fn sample(
    scalers: Vec<(String, ExternalScalerClient<Channel>)>,
    leader_http: SocketAddr,
    samples: Samples,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    while !stop.is_cancelled() {
        let at = Instant::now();
        let before = gauge(leader_http).await;
        let mut answers = BTreeMap::new();
        for (id, scaler) in &scalers {
            answers.insert(id.clone(), desired(scaler).await);
        }
        let after = gauge(leader_http).await;
        let active = match scalers.first() {
            Some((_, scaler)) => is_active(scaler).await,
            None => None,
        };
        samples.timeline.lock().unwrap().push(Sample {
            at,
            gauge: (before, after),
            answers,
            active,
        });
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    Ok(())
}

/// What `StreamIsActive` sends, into `seen` as it comes.
async fn stream_active(
    scaler: ExternalScalerClient<Channel>,
    seen: Arc<Mutex<Vec<bool>>>,
) -> anyhow::Result<()> {
    let mut stream = scaler
        .clone()
        .stream_is_active(object())
        .await?
        .into_inner();
    while let Some(answer) = stream.message().await? {
        seen.lock().unwrap().push(answer.result);
    }
    Ok(())
}

/// Every answer equals the leader's gauge: bracketed on the leader, within
/// [`FOLLOWER_LAG`] on the others (see the module docs).
fn check_answers(timeline: &[Sample], leader: &str) -> anyhow::Result<()> {
    let mut checked = 0;
    let Some(first) = timeline.first() else {
        bail!("no samples");
    };
    for (i, s) in timeline.iter().enumerate() {
        // A follower's answer is judged once the gauge's history covers its lag.
        let judged = |id: &String| id == leader || s.at.duration_since(first.at) >= FOLLOWER_LAG;
        for (id, answer) in s.answers.iter().filter(|(id, _)| judged(id)) {
            let Ok(value) = answer else {
                // UNAVAILABLE is allowed before a follower read its first published row.
                ensure!(
                    *answer == Err(tonic::Code::Unavailable) && i < 20,
                    "{id} answered {answer:?} at sample {i}"
                );
                continue;
            };
            let seen: BTreeSet<i64> = if id == leader {
                [s.gauge.0, s.gauge.1].into_iter().flatten().collect()
            } else {
                timeline[..=i]
                    .iter()
                    .filter(|earlier| s.at.duration_since(earlier.at) <= FOLLOWER_LAG)
                    .flat_map(|earlier| [earlier.gauge.0, earlier.gauge.1])
                    .flatten()
                    .collect()
            };
            ensure!(
                seen.contains(value),
                "{id} answered {value} at sample {i}; the leader's gauge showed {seen:?}"
            );
            checked += 1;
        }
    }
    eprintln!("{checked} GetMetrics answers equal the leader's gauge");
    ensure!(checked > 50, "too few answers checked: {checked}");
    Ok(())
}

/// The timeline in one line: the leader's gauge as it changed, with the time since the first
/// sample.
fn timeline(samples: &[Sample]) -> String {
    let Some(first) = samples.first() else {
        return "no samples".into();
    };
    let mut last = None;
    let mut out = Vec::new();
    for s in samples {
        if s.gauge.1 != last {
            last = s.gauge.1;
            out.push(format!(
                "{:.1}s: {:?} (active {:?})",
                s.at.duration_since(first.at).as_secs_f64(),
                s.gauge.1,
                s.active
            ));
        }
    }
    out.join(", ")
}

/// Drains `served` as its preStop would: every lease released (not kept for the restart grace)
/// and owned by another worker within 3 s; the process exits 0.
async fn scale_in(ctx: &Context, served: &mut Served) -> anyhow::Result<()> {
    let id = served.process.id.clone();
    let owners = ctx.owners().await?;
    let mine: Vec<String> = owners
        .iter()
        .filter(|(_, o)| o.as_deref() == Some(id.as_str()))
        .map(|(k, _)| k.clone())
        .collect();
    ensure!(!mine.is_empty(), "{id} holds nothing to drain: {owners:?}");
    let consumer = workspace_bin("kcl-example-consumer", "kcl-example-consumer")?;
    let addr = served.http.to_string();
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(consumer)
            .args(["drain", "--addr", &addr, "--timeout", "30s"])
            .env_remove("KCL_LISTEN")
            .env_remove("KCL_CONFIG")
            .output()
    })
    .await??;
    let drained = started.elapsed();
    let said = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "drain failed: {out:?}\n{}",
        served.process.log_tail()
    );
    let want = format!("drained: {} lease", mine.len());
    ensure!(said.starts_with(&want), "{said}");
    let rows = ctx.store().list().await?;
    for key in &mine {
        let row = rows.iter().find(|l| l.key.as_str() == key).context("row")?;
        ensure!(
            row.restart_grace.is_none() && row.owner.as_ref().is_none_or(|o| o.as_str() != id),
            "{key} not released by the drain: {row:?}"
        );
    }
    let taken = wait_until(
        "the drained leases owned by the others",
        Duration::from_secs(40),
        Duration::from_millis(100),
        async || {
            let owners = ctx.owners().await?;
            Ok(mine
                .iter()
                .all(|k| owners.get(k).cloned().flatten().is_some_and(|o| o != id)))
        },
    )
    .await?;
    eprintln!(
        "drain of {id}: its {} lease(s) released in {drained:?}, owned by others {taken:?} later \
         (failover {FAILOVER:?}, restart grace 30s)",
        mine.len()
    );
    ensure!(
        taken <= TAKER * 3,
        "taken {taken:?} after the drain: not within a few taker cycles"
    );
    let status = served.process.wait_exit(Duration::from_secs(15)).await?;
    ensure!(status.success(), "{id} exited {status:?}");
    let events = served.process.events()?;
    let lost: Vec<_> = events.iter().filter(|e| e.event == "lease_lost").collect();
    if !lost.is_empty() {
        bail!("{id} lost leases instead of handing them over: {lost:?}");
    }
    Ok(())
}

fn logs(fleet: &[Served]) -> String {
    fleet
        .iter()
        .map(|s| format!("--- {}\n{}", s.process.id, s.process.log_tail()))
        .collect::<Vec<_>>()
        .join("\n")
}
