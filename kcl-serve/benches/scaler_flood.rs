//! What a flood of connections and streams against a worker's KEDA scaler costs the worker:
//! lease renewals, `/healthz` and records processed, with and without the flood.
//!
//! One process runs a worker as a deployed binary does (`Serving` with the scaler, on a
//! two-thread runtime), on the in-memory backends: 8 shards, a failover time of 3 s (a renewal
//! every second), a processor spending about 20 µs of CPU on each record, and a producer
//! thread putting `--rate` records a second (20,000: about 0.4 of a core's processing, as a
//! worker with headroom runs). A prober thread GETs `/healthz` every 50 ms. The flood is a second process (this binary with
//! `--flood-client`, run under `nice -n 19` so that its own CPU comes out of idle time, as a
//! remote attacker's would): 5,000 tasks, each opening a connection and a `StreamIsActive`
//! stream, reading it to its end, and opening another a second after it ends or is refused.
//!
//! Phases of `--secs` seconds (10) alternate, quiet then flooded, `--phases` times (3); each
//! line is one phase, and the last two lines the medians. Per phase: records processed per
//! second, and the most records waiting at once (sampled every 10 ms: how far processing fell
//! behind); renewal lateness (each renewal's gap since the lease's previous one, minus the
//! renew interval: what a busy runtime delays), its median, 99th percentile and maximum;
//! renewals missed (a gap longer than the failover time: the lease could be taken) and leases
//! taken again; the worker process's CPU (cores busy), how much its resident memory grew over
//! the phase (the in-memory stream keeps every record, about 40 MiB a phase at 20,000 a
//! second: a quiet phase shows that growth alone) and its open file descriptors at the phase's
//! end; `/healthz` latency (median, 99th percentile, maximum) and failures (no answer
//! within 2 s, or not a 200); and what the flood got: streams opened, calls refused, streams
//! ended, connections that failed.
//!
//! `cargo bench -p kcl-serve --features scaler --bench scaler_flood [-- --secs 10 --phases 3 --flood 5000 --rate 20000]`
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId};
use kcl_core::{Worker, WorkerConfig};

const SHARDS: u32 = 8;
const FAILOVER: Duration = Duration::from_secs(3);

struct Args {
    secs: u64,
    phases: usize,
    flood: usize,
    rate: u64,
}

fn args() -> Args {
    let mut a = Args {
        secs: 10,
        phases: 3,
        flood: 5_000,
        rate: 20_000,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.windows(2) {
        match pair[0].as_str() {
            "--secs" => a.secs = pair[1].parse().expect("--secs N"),
            "--phases" => a.phases = pair[1].parse().expect("--phases N"),
            "--flood" => a.flood = pair[1].parse().expect("--flood N"),
            "--rate" => a.rate = pair[1].parse().expect("--rate N"),
            _ => {}
        }
    }
    a
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if let Some(at) = argv.iter().position(|a| a == "--flood-client") {
        let addr: SocketAddr = argv[at + 1].parse().unwrap();
        let n: usize = argv[at + 2].parse().unwrap();
        return flood_client(addr, n);
    }
    let args = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bench(&args));
}

/// A processor that spends about 20 µs of CPU on each record, and checkpoints each batch.
struct Busy(Arc<AtomicU64>);

impl RecordProcessor for Busy {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for record in input.records() {
            let mut h = 0u64;
            for _ in 0..400 {
                for b in record.data.iter() {
                    h = h.rotate_left(5) ^ u64::from(*b);
                }
            }
            std::hint::black_box(h);
        }
        self.0
            .fetch_add(input.records().len() as u64, Ordering::Relaxed);
        cp.checkpoint().await?;
        Ok(())
    }
}

/// One `/healthz` probe: when it started, and its latency (`None`: failed).
type Probe = (Instant, Option<Duration>);

async fn bench(args: &Args) {
    let config = WorkerConfig::default()
        .failover_time(FAILOVER)
        .max_records(500)
        .idle_time_between_reads(Duration::from_millis(20));
    let renew = config.renew_interval;
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let serving = kcl_serve::Serving::start(local, &config)
        .await
        .unwrap()
        .with_scaler(local)
        .await
        .unwrap();
    let (http, scaler) = (serving.http_addr().unwrap(), serving.scaler_addr().unwrap());
    let stream = MemoryStream::new(SHARDS);
    let store = MemoryLeaseStore::new();
    let processed = Arc::new(AtomicU64::new(0));
    let counter = processed.clone();
    let worker = Worker::new(
        "bench",
        config,
        stream.clone(),
        store.clone(),
        move |_: &ShardId| Busy(counter.clone()),
    )
    .unwrap();
    let handle = worker.shutdown_handle();
    let run = tokio::spawn(serving.run(worker, "bench".into(), kcl_serve::Options::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let waiting = Arc::new(AtomicU64::new(0));
    let producer = produce(
        stream,
        args.rate,
        (processed.clone(), waiting.clone()),
        stop.clone(),
    );
    let probes = Arc::new(std::sync::Mutex::new(Vec::<Probe>::new()));
    let prober = probe(http, probes.clone(), stop.clone());

    while store.leases().iter().filter(|l| l.owner.is_some()).count() < SHARDS as usize {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await; // warm up
    println!(
        "scaler at {scaler}; {SHARDS} shards, failover {FAILOVER:?} (renew every {renew:?}); \
         flood {} streams, phases of {} s",
        args.flood, args.secs
    );
    println!(
        "| phase | records/s | most waiting | renewal late p50 / p99 / max (ms) | renewals missed | leases retaken \
         | CPU (cores) | RSS growth (MiB) | open fds | /healthz p50 / p99 / max (ms) | /healthz failed | flood: opened / refused / ended / conn. failed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut rows: BTreeMap<bool, Vec<Row>> = BTreeMap::new();
    for _ in 0..args.phases {
        for flooded in [false, true] {
            let counters = (&*processed, &*waiting);
            let row = phase(args, flooded, scaler, &store, counters, &probes, renew).await;
            println!("{}", row.line(if flooded { "flooded" } else { "quiet" }));
            rows.entry(flooded).or_default().push(row);
        }
    }
    for (flooded, rows) in &rows {
        let label = if *flooded {
            "**median, flooded**"
        } else {
            "**median, quiet**"
        };
        println!("{}", Row::median(rows).line(label));
    }
    stop.store(true, Ordering::Relaxed);
    handle.shutdown();
    let _ = run.await;
    producer.join().unwrap();
    prober.join().unwrap();
}

/// What one phase measured.
#[derive(Debug, Clone, Default)]
struct Row {
    records_per_sec: f64,
    waiting: f64,
    late_ms: [f64; 3],
    missed: f64,
    retaken: f64,
    cpu: f64,
    rss_mib: f64,
    fds: f64,
    healthz_ms: [f64; 3],
    healthz_failed: f64,
    flood: Option<String>,
}

impl Row {
    fn line(&self, label: &str) -> String {
        format!(
            "| {label} | {:.0} | {} | {:.1} / {:.1} / {:.1} | {} | {} | {:.2} | {:.0} | {} | {:.1} / {:.1} / {:.1} | {} | {} |",
            self.records_per_sec,
            self.waiting,
            self.late_ms[0],
            self.late_ms[1],
            self.late_ms[2],
            self.missed,
            self.retaken,
            self.cpu,
            self.rss_mib,
            self.fds,
            self.healthz_ms[0],
            self.healthz_ms[1],
            self.healthz_ms[2],
            self.healthz_failed,
            self.flood.as_deref().unwrap_or("–"),
        )
    }

    fn median(rows: &[Row]) -> Row {
        let m = |f: &dyn Fn(&Row) -> f64| median(rows.iter().map(f).collect());
        Row {
            records_per_sec: m(&|r| r.records_per_sec),
            waiting: m(&|r| r.waiting),
            late_ms: [
                m(&|r| r.late_ms[0]),
                m(&|r| r.late_ms[1]),
                m(&|r| r.late_ms[2]),
            ],
            missed: m(&|r| r.missed),
            retaken: m(&|r| r.retaken),
            cpu: m(&|r| r.cpu),
            rss_mib: m(&|r| r.rss_mib),
            fds: m(&|r| r.fds),
            healthz_ms: [
                m(&|r| r.healthz_ms[0]),
                m(&|r| r.healthz_ms[1]),
                m(&|r| r.healthz_ms[2]),
            ],
            healthz_failed: m(&|r| r.healthz_failed),
            flood: None,
        }
    }
}

async fn phase(
    args: &Args,
    flooded: bool,
    scaler: SocketAddr,
    store: &MemoryLeaseStore,
    (processed, waiting): (&AtomicU64, &AtomicU64),
    probes: &std::sync::Mutex<Vec<Probe>>,
    renew: Duration,
) -> Row {
    let flood = flooded.then(|| Flood::start(scaler, args.flood));
    let start = Instant::now();
    let tokio_start = tokio::time::Instant::now();
    let before = processed.load(Ordering::Relaxed);
    waiting.store(0, Ordering::Relaxed);
    let cpu_before = cpu_seconds();
    let rss_before = resources().0;
    tokio::time::sleep(Duration::from_secs(args.secs)).await;
    let took = start.elapsed();
    let done = processed.load(Ordering::Relaxed) - before;
    let cpu = (cpu_seconds() - cpu_before) / took.as_secs_f64();
    let (rss_after, fds) = resources();
    let rss_mib = rss_after - rss_before;
    let flood = flood.map(Flood::stop);
    let end = tokio::time::Instant::now();
    let journal = store.journal();
    // Renewals of the phase: each one's gap since the same lease's previous write (a renewal,
    // a take, a checkpoint: each proves the lease alive and restarts its validity).
    let mut last: BTreeMap<ShardId, tokio::time::Instant> = BTreeMap::new();
    let (mut late, mut missed, mut retaken) = (Vec::new(), 0.0, 0.0);
    for event in &journal {
        if event.at >= tokio_start
            && event.at < end
            && event.operation == "renew"
            && let Some(previous) = last.get(&event.lease.key)
        {
            let gap = event.at.saturating_duration_since(*previous);
            late.push(gap.saturating_sub(renew).as_secs_f64() * 1000.0);
            if gap > FAILOVER {
                missed += 1.0;
            }
        }
        if event.at >= tokio_start && event.at < end && event.operation == "take" {
            retaken += 1.0;
        }
        if event.operation == "renew" || event.operation == "take" {
            last.insert(event.lease.key.clone(), event.at);
        }
    }
    let seen: Vec<Probe> = probes
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| *at >= start && *at < start + took)
        .copied()
        .collect();
    let ok: Vec<f64> = seen
        .iter()
        .filter_map(|(_, l)| l.map(|l| l.as_secs_f64() * 1000.0))
        .collect();
    if flooded {
        tokio::time::sleep(Duration::from_secs(3)).await; // the flood's connections close
    }
    Row {
        records_per_sec: done as f64 / took.as_secs_f64(),
        waiting: waiting.load(Ordering::Relaxed) as f64,
        late_ms: quantiles(late),
        missed,
        retaken,
        cpu,
        rss_mib,
        fds,
        healthz_ms: quantiles(ok),
        healthz_failed: seen.iter().filter(|(_, l)| l.is_none()).count() as f64,
        flood,
    }
}

/// This process's CPU time so far (user and system), in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0 // USER_HZ
}

/// This process's resident memory (MiB) and open file descriptors.
fn resources() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
    (kib / 1024.0, fds as f64)
}

fn quantiles(mut v: Vec<f64>) -> [f64; 3] {
    if v.is_empty() {
        return [f64::NAN; 3];
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    [at(0.5), at(0.99), v[v.len() - 1]]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Puts `rate` records a second, 1/100 of them every 10 ms, until `stop`; keeps in `waiting`
/// the most records put and not yet processed seen since it was last reset.
fn produce(
    stream: MemoryStream,
    rate: u64,
    (processed, waiting): (Arc<AtomicU64>, Arc<AtomicU64>),
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let payload = bytes::Bytes::from(vec![b'x'; 32]);
        let (start, mut put) = (Instant::now(), 0u64);
        while !stop.load(Ordering::Relaxed) {
            let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
            while put < due {
                stream.put(&format!("k{}", put % 1_000), payload.clone());
                put += 1;
            }
            let behind = put.saturating_sub(processed.load(Ordering::Relaxed));
            waiting.fetch_max(behind, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

/// GETs `/healthz` every 50 ms until `stop`, each within 2 s.
fn probe(
    http: SocketAddr,
    probes: Arc<std::sync::Mutex<Vec<Probe>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let at = Instant::now();
            let ok = get_healthz(http).then(|| at.elapsed());
            probes.lock().unwrap().push((at, ok));
            std::thread::sleep(Duration::from_millis(50).saturating_sub(at.elapsed()));
        }
    })
}

fn get_healthz(http: SocketAddr) -> bool {
    let limit = Duration::from_secs(2);
    let Ok(mut conn) = std::net::TcpStream::connect_timeout(&http, limit) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(limit));
    let request = "GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
    if conn.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

/// The flood: this binary as `--flood-client`, at the lowest priority.
struct Flood(std::process::Child);

impl Flood {
    fn start(scaler: SocketAddr, n: usize) -> Self {
        let exe = std::env::current_exe().unwrap();
        let child = Command::new("nice")
            .args(["-n", "19"])
            .arg(exe)
            .args(["--flood-client", &scaler.to_string(), &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Self(child)
    }

    /// Stops the flood (its stdin closed), and what it got.
    fn stop(mut self) -> String {
        drop(self.0.stdin.take());
        let mut out = String::new();
        if let Some(stdout) = self.0.stdout.as_mut() {
            let _ = std::io::BufReader::new(stdout).read_line(&mut out);
        }
        let _ = self.0.wait();
        out.trim().to_owned()
    }
}

/// `--flood-client ADDR N`: N tasks, each opening a connection and a `StreamIsActive` stream,
/// reading it to its end, and again a second after it ended or was refused; until stdin closes.
/// Prints `opened / refused / ended / connections failed`.
fn flood_client(addr: SocketAddr, n: usize) {
    let counts: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let cancel = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        cancel.cancel();
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for _ in 0..n {
            let (counts, stop) = (counts.clone(), stop.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = flood_one(addr, &counts) => {}
                }
            });
        }
        stop.cancelled().await;
    });
    let c = |i: usize| counts[i].load(Ordering::Relaxed);
    println!("{} / {} / {} / {}", c(0), c(1), c(2), c(3));
}

async fn flood_one(addr: SocketAddr, counts: &[AtomicU64; 4]) {
    let request = kcl_scaler::proto::ScaledObjectRef {
        name: "flood".into(),
        namespace: "flood".into(),
        scaler_metadata: Default::default(),
    };
    loop {
        match kcl_scaler::connect(format!("http://{addr}")).await {
            Ok(mut client) => match client.stream_is_active(request.clone()).await {
                Ok(answer) => {
                    counts[0].fetch_add(1, Ordering::Relaxed);
                    let mut stream = answer.into_inner();
                    while let Ok(Some(_)) = stream.message().await {}
                    counts[2].fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    counts[1].fetch_add(1, Ordering::Relaxed);
                }
            },
            Err(_) => {
                counts[3].fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
