//! `--only multilang`: the `kcl-multilang` binary against KCL Java 3.1.3's MultiLangDaemon,
//! side by side, with the same child (`kcl-multilang/tests/children/journaled.py`, which
//! journals every record with its time and its daemon's pid) and the same properties (the
//! Java daemon's defaults but polling, and the emulators' endpoints).
//!
//! KCL Java runs from the jars of PyPI `kclpy-ext` (`scripts/clients` installs them into
//! `.clients/kclpy`; `KCL_BENCH_JARS` names another folder) with the `java` on `PATH`;
//! without them its rows are left out. `kcl-multilang` is the binary next to this one (build
//! it with `cargo build --release -p kcl-multilang`).
//!
//! Per run and daemon: start → first record on a fresh lease table over a stream holding
//! `DRAIN` records on 4 shards (`TRIM_HORIZON`); the drain rate from the first to the last of them; the
//! daemon's peak RSS (`VmHWM`) and its children's RSS after holding the 4 shards 10 s more;
//! and, in a second fleet of two daemons under a producer (`LATEST`), the failover after a SIGKILL of
//! the daemon holding more shards: from the signal to the survivor's first record on the last
//! of the victim's shards.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use kcl_integration_tests::{Context, Producer, repo_root, unique, wait_until};

use crate::memory;
use tokio::process::{Child, Command};

/// Records in the stream each run drains.
const DRAIN: usize = 20_000;

/// A daemon to measure: its name and how to start it on a properties file.
pub(crate) struct Side {
    pub(crate) name: &'static str,
    program: String,
    args: Vec<String>,
}

impl Side {
    fn command(&self, properties: &Path) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        if self.name == KCL {
            command.arg("--listen").arg("127.0.0.1:0");
        } else {
            // The Java daemon looks a properties file up on its classpath first.
            command.arg("--properties-file");
        }
        command.arg(properties);
        command
    }
}

pub(crate) const KCL: &str = "kcl-multilang";

pub(crate) fn sides() -> anyhow::Result<Vec<Side>> {
    let me = std::env::current_exe()?;
    let kcl = me.with_file_name(KCL);
    anyhow::ensure!(
        kcl.exists(),
        "{} is missing: build it with `cargo build --release -p kcl-multilang`",
        kcl.display()
    );
    let mut sides = vec![Side {
        name: KCL,
        program: kcl.to_string_lossy().into_owned(),
        args: Vec::new(),
    }];
    match java_jars() {
        Some(jars) if runs("java") => sides.push(Side {
            name: "KCL Java 3.1.3 MultiLangDaemon",
            program: "java".to_owned(),
            args: vec![
                // kinesis-local speaks JSON only.
                "-Daws.cborEnabled=false".to_owned(),
                "-cp".to_owned(),
                format!("{}/*", jars.display()),
                "software.amazon.kinesis.multilang.MultiLangDaemon".to_owned(),
            ],
        }),
        _ => println!(
            "KCL Java: left out (needs `java` on PATH and the jars of kclpy-ext: scripts/clients)"
        ),
    }
    Ok(sides)
}

/// Whether `program -version` runs (Java's spelling of `--version`).
fn runs(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// kclpy-ext's jars: `KCL_BENCH_JARS`, else under `.clients/kclpy`.
fn java_jars() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("KCL_BENCH_JARS") {
        return Some(PathBuf::from(dir));
    }
    let lib = repo_root().join(".clients/kclpy/lib");
    std::fs::read_dir(lib)
        .ok()?
        .filter_map(Result::ok)
        .map(|python| python.path().join("site-packages/amazon_kclpy/jars"))
        .find(|jars| jars.is_dir())
}

/// One line of the child's journal.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Entry {
    pub(crate) call: String,
    pub(crate) shard_id: Option<String>,
    pid: u32,
    ppid: u32,
    /// Epoch seconds.
    t: f64,
    pub(crate) sequence_number: Option<String>,
}

/// The journal as it grows: each read parses only what was appended since the last, so that
/// watching it costs the daemons measured next to nothing.
pub(crate) struct Journal {
    path: PathBuf,
    offset: u64,
    entries: Vec<Entry>,
}

impl Journal {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self {
            path,
            offset: 0,
            entries: Vec::new(),
        }
    }

    pub(crate) fn read(&mut self) -> &[Entry] {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let mut appended = Vec::new();
        if let Ok(mut file) = std::fs::File::open(&self.path)
            && file.seek(SeekFrom::Start(self.offset)).is_ok()
        {
            let _ = file.read_to_end(&mut appended);
        }
        // Whole lines only: a line being written is read next time.
        let complete = appended
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        for line in appended[..complete].split(|&b| b == b'\n') {
            if let Ok(entry) = serde_json::from_slice(line) {
                self.entries.push(entry);
            }
        }
        self.offset += complete as u64;
        &self.entries
    }
}

pub(crate) fn now() -> f64 {
    chrono::Utc::now().timestamp_micros() as f64 / 1e6
}

/// A running daemon, killed (with its process group) when dropped.
pub(crate) struct Running {
    process: Child,
    log: PathBuf,
}

impl Running {
    pub(crate) fn start(
        side: &Side,
        ctx: &Context,
        app: &str,
        worker: &str,
        position: &str,
    ) -> anyhow::Result<Self> {
        let properties = write_properties(ctx, app, worker, position)?;
        let log = ctx.path(&format!("{app}-{worker}.log"));
        let journal = ctx.path(&format!("{app}.jsonl"));
        let process = side
            .command(&properties)
            .envs(ctx.worker_env())
            .env("KCL_OUT", &journal)
            .env("KCL_LOG_FILTER", "info,aws=warn")
            .current_dir(&ctx.dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(log.with_extension("err"))?)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Self { process, log })
    }

    /// What it printed: stdout (KCL Java's log), then stderr (kcl-multilang's).
    pub(crate) fn logs(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        read(&self.log) + &read(&self.log.with_extension("err"))
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.process.id().context("the daemon exited")
    }

    fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.pid()?;
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill {signal} {pid}");
        Ok(())
    }

    fn kill(&mut self) -> anyhow::Result<()> {
        self.signal("-KILL")
    }

    /// SIGTERM, and its exit awaited (a minute at most).
    pub(crate) async fn terminate(&mut self) -> anyhow::Result<()> {
        self.signal("-TERM")?;
        tokio::time::timeout(Duration::from_secs(60), self.process.wait())
            .await
            .context("the daemon did not exit on SIGTERM")??;
        Ok(())
    }
}

fn write_properties(
    ctx: &Context,
    app: &str,
    worker: &str,
    position: &str,
) -> anyhow::Result<PathBuf> {
    let child = repo_root().join("kcl-multilang/tests/children/journaled.py");
    let path = ctx.path(&format!("{app}-{worker}.properties"));
    let text = format!(
        "executableName = python3 {child}\n\
         streamName = {stream}\n\
         applicationName = {app}\n\
         workerId = {worker}\n\
         AwsCredentialsProvider = DefaultCredentialsProvider\n\
         initialPositionInStream = {position}\n\
         regionName = us-east-1\n\
         kinesisEndpoint = {kinesis}\n\
         dynamoDBEndpoint = {dynamodb}\n\
         retrievalMode = POLLING\n\
         metricsLevel = NONE\n\
         shutdownGraceMillis = 25000\n",
        child = child.display(),
        stream = ctx.stream,
        kinesis = ctx.endpoints.kinesis,
        dynamodb = ctx.endpoints.dynamodb,
    );
    std::fs::write(&path, text)?;
    Ok(path)
}

/// One run's start, drain and memory figures.
struct Footprint {
    first: Duration,
    restart: Duration,
    rate: f64,
    shard_rate: f64,
    peak_kib: u64,
    rest_kib: u64,
    children_kib: u64,
}

/// The records in `entries`, and the earliest and latest time one was journaled.
fn span(entries: &[Entry]) -> (usize, f64, f64) {
    entries
        .iter()
        .filter(|e| e.call == "record")
        .fold((0, f64::MAX, 0.0), |(n, first, last), e| {
            (n + 1, first.min(e.t), last.max(e.t))
        })
}

/// Records per second through one shard's child, from its first record to its last: the
/// median of the shards. Unlike the rate over all shards, it leaves out when each shard's
/// first read was answered (kinesis-local answers large reads one after another).
fn per_shard_rate(entries: &[Entry]) -> f64 {
    let mut by_shard: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.call == "record") {
        if let Some(shard) = &e.shard_id {
            by_shard.entry(shard).or_default().push(e.t);
        }
    }
    let mut rates: Vec<f64> = by_shard
        .values()
        .map(|times| {
            let first = times.iter().copied().fold(f64::MAX, f64::min);
            let last = times.iter().copied().fold(0.0, f64::max);
            times.len() as f64 / (last - first)
        })
        .collect();
    middle(&mut rates)
}

async fn footprint(side: &Side, ctx: &Context) -> anyhow::Result<Footprint> {
    let app = unique("ml-bench");
    let started = now();
    let mut daemon = Running::start(side, ctx, &app, "w-1", "TRIM_HORIZON")?;
    let mut journal = Journal::new(ctx.path(&format!("{app}.jsonl")));
    wait_until(
        "every record delivered",
        Duration::from_secs(600),
        Duration::from_millis(250),
        async || Ok(span(journal.read()).0 >= DRAIN),
    )
    .await
    .with_context(|| daemon.logs())?;
    let (count, first, last) = span(journal.read());
    let shard_rate = per_shard_rate(journal.read());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let pid = daemon.pid()?;
    let peak_kib = memory(pid, "VmHWM").context("no VmHWM")?;
    let rest_kib = memory(pid, "VmRSS").context("no VmRSS")?;
    let children: BTreeSet<u32> = journal
        .read()
        .iter()
        .filter(|e| e.ppid == pid)
        .map(|e| e.pid)
        .collect();
    let children_kib = children.iter().filter_map(|&c| memory(c, "VmRSS")).sum();

    // Stopped gracefully, then started again on its table, for records written meanwhile.
    daemon.terminate().await?;
    let seen = journal.read().len();
    let records: Vec<(String, String)> = (0..8)
        .map(|i| (format!("pk-{i}"), format!("again-{i}")))
        .collect();
    ctx.put(&records).await?;
    let restarted = now();
    let mut again = Running::start(side, ctx, &app, "w-1", "TRIM_HORIZON")?;
    wait_until(
        "a record after the restart",
        Duration::from_secs(600),
        Duration::from_millis(20),
        async || Ok(span(&journal.read()[seen..]).0 > 0),
    )
    .await
    .with_context(|| again.logs())?;
    let (_, first_again, _) = span(&journal.read()[seen..]);
    again.kill()?;
    Ok(Footprint {
        first: Duration::from_secs_f64(first - started),
        restart: Duration::from_secs_f64(first_again - restarted),
        rate: count as f64 / (last - first),
        shard_rate,
        peak_kib,
        rest_kib,
        children_kib,
    })
}

/// Two daemons under a producer; the one holding more shards killed: the time until the
/// survivor delivered a record on each of its shards.
async fn failover(side: &Side, ctx: &Context) -> anyhow::Result<Duration> {
    let app = unique("ml-failover");
    let mut journal = Journal::new(ctx.path(&format!("{app}.jsonl")));
    let producer = Producer::start(ctx, "f", 8, Duration::from_millis(100));
    let mut a = Running::start(side, ctx, &app, "w-a", "LATEST")?;
    let mut b = Running::start(side, ctx, &app, "w-b", "LATEST")?;
    let (pa, pb) = (a.pid()?, b.pid()?);
    // Who reads each shard now: the daemon of its latest record's child.
    let holders = |entries: &[Entry]| -> BTreeMap<String, u32> {
        let mut by = BTreeMap::new();
        for e in entries.iter().filter(|e| e.call == "record") {
            if let Some(shard) = &e.shard_id {
                by.insert(shard.clone(), e.ppid);
            }
        }
        by
    };
    wait_until(
        "every shard read",
        Duration::from_secs(600),
        Duration::from_millis(100),
        async || Ok(holders(journal.read()).len() == 4),
    )
    .await?;
    // Let a late starter take its share (KCL Java assigns every 2 × failover time).
    tokio::time::sleep(Duration::from_secs(30)).await;
    let held = holders(journal.read());
    let on_a = held.values().filter(|&&p| p == pa).count();
    let (victim, survivor) = if on_a * 2 >= held.len() {
        (&mut a, pb)
    } else {
        (&mut b, pa)
    };
    let victim_pid = victim.pid()?;
    let shards: Vec<String> = held
        .iter()
        .filter(|&(_, &p)| p == victim_pid)
        .map(|(s, _)| s.clone())
        .collect();
    let killed = now();
    victim.kill()?;
    let taken = |entries: &[Entry]| -> Option<f64> {
        let mut latest: f64 = 0.0;
        for shard in &shards {
            let t = entries
                .iter()
                .filter(|e| e.call == "record" && e.ppid == survivor && e.t > killed)
                .filter(|e| e.shard_id.as_deref() == Some(shard))
                .map(|e| e.t)
                .fold(f64::MAX, f64::min);
            latest = latest.max(t);
        }
        (latest < f64::MAX).then_some(latest)
    };
    wait_until(
        "the survivor on every shard of the victim",
        Duration::from_secs(600),
        Duration::from_millis(250),
        async || Ok(taken(journal.read()).is_some()),
    )
    .await?;
    let at = taken(journal.read()).context("taken")?;
    producer.stop().await?;
    drop((a, b));
    Ok(Duration::from_secs_f64(at - killed))
}

/// Each figure of one daemon over the runs, in [`METRICS`] order.
type Figures = [Vec<f64>; 8];

const METRICS: [(&str, Unit); 8] = [
    ("start → first record, fresh lease table", Unit::Seconds),
    (
        "start → first record, its table (after a SIGTERM)",
        Unit::Seconds,
    ),
    ("records/s, first to last record of all", Unit::Rate),
    (
        "records/s through one shard, its first to last record (median shard)",
        Unit::Rate,
    ),
    ("daemon peak RSS (the drain)", Unit::Mebibytes),
    ("daemon RSS holding 4 shards, 10 s after", Unit::Mebibytes),
    ("its 4 children's RSS", Unit::Mebibytes),
    (
        "SIGKILL of one of two daemons → the survivor on all its shards",
        Unit::Seconds,
    ),
];

#[derive(Clone, Copy)]
enum Unit {
    Seconds,
    Rate,
    Mebibytes,
}

impl Unit {
    fn show(self, value: f64) -> String {
        match self {
            Self::Seconds => format!("{value:.2} s"),
            Self::Rate => format!("{value:.0}"),
            Self::Mebibytes => format!("{value:.1} MiB"),
        }
    }
}

/// One run's figures, in [`METRICS`] order.
async fn measure(side: &Side, ctx: &Context, live: &Context) -> anyhow::Result<[f64; 8]> {
    let f = footprint(side, ctx).await?;
    let failover = failover(side, live).await?;
    Ok([
        f.first.as_secs_f64(),
        f.restart.as_secs_f64(),
        f.rate,
        f.shard_rate,
        f.peak_kib as f64 / 1024.0,
        f.rest_kib as f64 / 1024.0,
        f.children_kib as f64 / 1024.0,
        failover.as_secs_f64(),
    ])
}

fn middle(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

pub(crate) async fn table(runs: usize) -> anyhow::Result<()> {
    let sides = sides()?;
    let ctx = Context::new("bench-multilang")
        .await?
        .context("the emulators are needed")?;
    ctx.create_stream(4).await?;
    let records: Vec<(String, String)> = (0..DRAIN)
        .map(|i| (format!("pk-{i}"), format!("{i:0>100}")))
        .collect();
    for chunk in records.chunks(500) {
        ctx.put(chunk).await?;
    }
    // kinesis-local's first read after a fill is 2–3× slower: read it all once.
    for shard in 0..4 {
        ctx.read_shard(&format!("shardId-{shard:012}")).await?;
    }
    let live = ctx.on("live");
    live.create_stream(4).await?;
    // The daemons take turns, run by run.
    let mut results: Vec<Figures> = sides.iter().map(|_| Figures::default()).collect();
    for run in 0..runs {
        for (side, figures) in sides.iter().zip(&mut results) {
            eprintln!("{}: run {} of {runs}", side.name, run + 1);
            let one = measure(side, &ctx, &live).await?;
            for (all, value) in figures.iter_mut().zip(one) {
                all.push(value);
            }
        }
    }
    let names: Vec<&str> = sides.iter().map(|s| s.name).collect();
    println!(
        "\n| {DRAIN} records of 100 B on 4 shards, the same Python child | {} | {} |",
        names.join(" | "),
        if names.len() > 1 {
            "kcl-multilang / Java"
        } else {
            ""
        }
    );
    println!("|---|{}---:|", "---:|".repeat(names.len()));
    for (i, (what, unit)) in METRICS.iter().enumerate() {
        let mut cells = Vec::new();
        let mut medians = Vec::new();
        for figures in &mut results {
            let mut values = figures[i].clone();
            let m = middle(&mut values);
            medians.push(m);
            let runs: Vec<String> = figures[i].iter().map(|&v| unit.show(v)).collect();
            cells.push(format!("{} ({})", unit.show(m), runs.join(", ")));
        }
        let ratio = match medians.as_slice() {
            [kcl, java] => format!("{:.3}×", kcl / java),
            _ => String::new(),
        };
        println!("| {what} | {} | {ratio} |", cells.join(" | "));
    }
    Ok(())
}
