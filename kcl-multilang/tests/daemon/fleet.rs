//! A fleet of two daemons running `children/fleet.py` (amazon_kclpy, unchanged) under
//! `failureExhausted = dead-letter`, every daemon writing its letters to one `file:` sink
//! (FileSink locks `PATH.lock`) and each its children's processed records to a file of its
//! own:
//! - `chaos`: a processor that raises on poison records, under SIGKILL, SIGSTOP past the
//!   failover time and a SIGTERM restart: no good record lost or dead-lettered, every poison
//!   record dead-lettered with its payload, the child restarts counted and bounded;
//! - `outage`: the same fleet while the processor fails every record for a while: readiness
//!   fails, no shard dead-letters more than `failureOutageAfter` records, and every record is
//!   processed once the outage ends.

mod chaos;
mod outage;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kcl_aws::dead_letter::from_json;
use kcl_core::failure::DeadLetter;
use kcl_integration_tests::http::{http_get, serving_addr};
use kcl_integration_tests::{Context, repo_root, wait_until};

use super::clients::clients;
use super::{Daemon, properties};

/// The failover time the daemons run with (`failoverTimeMillis` in [`properties`]).
const FAILOVER: Duration = Duration::from_secs(5);

/// The log line of a child started in place of one that failed a batch (counted in
/// `kcl_multilang_child_restarts_total`).
const RESTARTED: &str = "starting a new child after the last one failed a batch";

/// The metric of those restarts.
const RESTARTS_METRIC: &str = "kcl_multilang_child_restarts_total";

/// Where a record is in the stream: its shard and sequence number.
type Place = (String, String);

/// Daemons running `fleet.py` on one stream, started and stopped by name.
struct Fleet {
    ctx: Context,
    /// `executableName`.
    executable: String,
    /// The failure policy's and the sink's properties.
    extra: String,
    /// The daemons running.
    live: Vec<(String, Daemon)>,
    /// The daemons that ended: name, log.
    ended: Vec<(String, String)>,
    /// Every daemon's name, in the order started.
    names: Vec<String>,
}

impl Fleet {
    /// A fleet (none started yet) whose children fail every record while [`Fleet::flag`]
    /// exists, with `failureOutageAfter = outage_after`.
    fn new(ctx: &Context, outage_after: u32) -> anyhow::Result<Self> {
        let clients = clients()?;
        let child = repo_root().join("kcl-multilang/tests/children/fleet.py");
        let extra = format!(
            "failureExhausted = dead-letter\n\
             deadLetterSink = file:{}\n\
             failureAttempts = 2\n\
             failureBackoffMillis = 100\n\
             failureMaxBackoffMillis = 200\n\
             failureOutageAfter = {outage_after}\n",
            ctx.path("dead-letters.jsonl").display()
        );
        Ok(Self {
            ctx: ctx.clone(),
            executable: format!("{} {}", clients.python, child.display()),
            extra,
            live: Vec::new(),
            ended: Vec::new(),
            names: Vec::new(),
        })
    }

    /// The file whose existence is an outage for the children.
    fn flag(&self) -> std::path::PathBuf {
        self.ctx.path("outage")
    }

    /// Starts daemon `name` (also its worker id).
    fn start(&mut self, name: &str) -> anyhow::Result<()> {
        let props = properties(&self.ctx, &self.executable, "python", name, &self.extra)?;
        let out = self.ctx.path(&format!("{name}.out"));
        let out = out.to_string_lossy().into_owned();
        let flag = self.flag().to_string_lossy().into_owned();
        let env = [
            ("KCL_OUT", out.as_str()),
            ("KCL_OUTAGE_FLAG", flag.as_str()),
        ];
        let daemon = Daemon::start(&self.ctx, &props, name, &env)?;
        eprintln!("fleet: started {name}");
        self.live.push((name.to_owned(), daemon));
        self.names.push(name.to_owned());
        Ok(())
    }

    fn daemon(&self, name: &str) -> anyhow::Result<&Daemon> {
        self.live
            .iter()
            .find_map(|(n, d)| (n == name).then_some(d))
            .with_context(|| format!("no daemon {name} running"))
    }

    fn take(&mut self, name: &str) -> anyhow::Result<Daemon> {
        let at = self
            .live
            .iter()
            .position(|(n, _)| n == name)
            .with_context(|| format!("no daemon {name} running"))?;
        Ok(self.live.remove(at).1)
    }

    /// SIGKILL: the daemon ends at once, its leases move after the failover time.
    async fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        let mut daemon = self.take(name)?;
        daemon.signal("-KILL")?;
        daemon.wait(Duration::from_secs(10)).await?;
        eprintln!("fleet: killed {name}");
        self.ended.push((name.to_owned(), daemon.log()));
        Ok(())
    }

    /// SIGTERM: a clean stop (exit status 0, every child asked to shut down, none failing
    /// it), within the shutdown timeout.
    async fn stop(&mut self, name: &str) -> anyhow::Result<()> {
        let mut daemon = self.take(name)?;
        daemon.signal("-TERM")?;
        let status = daemon.wait(Duration::from_secs(40)).await?;
        let log = daemon.log();
        anyhow::ensure!(status.success(), "{name} exited {status}: {}", tail(&log));
        for wrong in ["never started", "shutdown_requested failed"] {
            anyhow::ensure!(!log.contains(wrong), "`{wrong}` in {name}'s log: {log}");
        }
        eprintln!("fleet: stopped {name}");
        self.ended.push((name.to_owned(), log));
        Ok(())
    }

    /// SIGSTOP, until `until` answers (asked every 250 ms, for `limit` at most), then SIGCONT:
    /// what it answered.
    async fn freeze<T>(
        &self,
        name: &str,
        limit: Duration,
        mut until: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
    ) -> anyhow::Result<T> {
        let daemon = self.daemon(name)?;
        daemon.signal("-STOP")?;
        eprintln!("fleet: froze {name}");
        let frozen = Instant::now();
        let answer = loop {
            match until().await {
                Ok(Some(answer)) => break Ok(answer),
                Ok(None) if frozen.elapsed() < limit => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Ok(None) => break Err(anyhow::anyhow!("still waiting after {limit:?}")),
                Err(e) => break Err(e),
            }
        };
        daemon.signal("-CONT")?;
        eprintln!("fleet: thawed {name} after {:?}", frozen.elapsed());
        answer
    }

    /// Stops every daemon still running.
    async fn stop_all(&mut self) -> anyhow::Result<()> {
        let names: Vec<String> = self.live.iter().map(|(n, _)| n.clone()).collect();
        for name in names {
            self.stop(&name).await?;
        }
        Ok(())
    }

    /// Every daemon's log, by name.
    fn logs(&self) -> Vec<(String, String)> {
        let live = self.live.iter().map(|(n, d)| (n.clone(), d.log()));
        self.ended.iter().cloned().chain(live).collect()
    }

    /// The last lines of every daemon's log, for a failure's message.
    fn tails(&self) -> String {
        self.logs()
            .iter()
            .map(|(name, log)| format!("--- {name}\n{}\n", tail(log)))
            .collect()
    }

    /// The records the children processed: data, and where each was (once or more).
    fn processed(&self) -> anyhow::Result<BTreeMap<String, BTreeSet<Place>>> {
        let mut processed: BTreeMap<String, BTreeSet<Place>> = BTreeMap::new();
        for name in &self.names {
            let text =
                std::fs::read_to_string(self.ctx.path(&format!("{name}.out"))).unwrap_or_default();
            for line in text.lines() {
                let mut parts = line.splitn(3, ' ');
                let (Some(shard), Some(sequence), Some(data)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    anyhow::bail!("{name}.out: a torn line `{line}`");
                };
                let place = (shard.to_owned(), sequence.to_owned());
                processed.entry(data.to_owned()).or_default().insert(place);
            }
        }
        Ok(processed)
    }

    /// Lines the children wrote, all daemons together (a record processed twice, twice).
    fn processed_lines(&self) -> usize {
        self.names
            .iter()
            .map(|name| {
                std::fs::read_to_string(self.ctx.path(&format!("{name}.out")))
                    .map_or(0, |t| t.lines().count())
            })
            .sum()
    }

    /// The letters in the sink, in the order written.
    fn letters(&self) -> anyhow::Result<Vec<DeadLetter>> {
        match std::fs::read_to_string(self.ctx.path("dead-letters.jsonl")) {
            Ok(text) => text
                .lines()
                .map(|line| from_json(line.as_bytes()).with_context(|| format!("letter {line}")))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// Child restarts each daemon logged ([`RESTARTED`]), by name.
    fn restarts_logged(&self) -> BTreeMap<String, usize> {
        self.logs()
            .into_iter()
            .map(|(name, log)| (name, log.matches(RESTARTED).count()))
            .collect()
    }
}

/// The last 40 lines of a log.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A letter's data as text.
fn data(letter: &DeadLetter) -> String {
    String::from_utf8_lossy(&letter.record.data).into_owned()
}

/// Where each record of the stream is, by its data.
async fn placed(ctx: &Context) -> anyhow::Result<BTreeMap<String, Place>> {
    let shards = ctx
        .kinesis
        .list_shards()
        .stream_name(&ctx.stream)
        .send()
        .await?;
    let mut placed = BTreeMap::new();
    for shard in shards.shards() {
        for (sequence, data) in ctx.read_shard(shard.shard_id()).await? {
            placed.insert(data, (shard.shard_id().to_owned(), sequence));
        }
    }
    Ok(placed)
}

/// Whether each of the stream's `shards` leases is held, each by another daemon.
async fn balanced(ctx: &Context, shards: usize) -> anyhow::Result<bool> {
    let Ok(owners) = ctx.owners().await else {
        return Ok(false);
    };
    let holders: BTreeSet<&String> = owners.values().flatten().collect();
    Ok(owners.len() == shards && owners.values().all(Option::is_some) && holders.len() == shards)
}

/// The address a daemon serves `/readyz` and `/metrics` on, once it has logged it.
async fn addr(daemon: &Daemon) -> anyhow::Result<SocketAddr> {
    wait_until(
        "the daemon serving",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || Ok(daemon.log().contains("\"addr\"")),
    )
    .await
    .with_context(|| daemon.log())?;
    let log = daemon.log();
    let mut lines = log.lines().map(str::to_owned);
    Ok(serving_addr(|| lines.next()))
}

/// A counter on `/metrics`, summed over its labels; `None` if not served.
fn metric(addr: SocketAddr, name: &str) -> anyhow::Result<Option<f64>> {
    let (code, body) = http_get(addr, "/metrics").context("GET /metrics")?;
    anyhow::ensure!(code == 200, "GET /metrics: {code} {body}");
    Ok(body
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with([' ', '{']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b))
}

/// `/readyz` of each address, every 200 ms on a thread of its own, until [`Probe::stop`].
struct Probe {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Sample>>,
}

/// One answer of `/readyz`: when, which address (its index), the status (`None`: no answer).
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    daemon: usize,
    code: Option<u16>,
}

impl Probe {
    fn start(addrs: Vec<SocketAddr>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                for (daemon, addr) in addrs.iter().enumerate() {
                    let code = http_get(*addr, "/readyz").map(|(code, _)| code);
                    let at = Instant::now();
                    samples.push(Sample { at, daemon, code });
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            samples
        });
        Self { stop, thread }
    }

    fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}
