//! What a lease costs its holder, measured where it is cheap and honest, and carried to the
//! leader on writes the holder makes anyway.
//!
//! A lease's **load** is the largest of three shares, each 1 for a shard at its limit:
//! - the processor's busy time: time inside its hooks and `Parallel` handlers per second
//!   (1 = one processor busy all the time; the host's CPU is not asked, it is noise shared by
//!   everything on the host);
//! - the bytes read per second against 1 MiB/s, and the records read per second against
//!   1,000/s: a shard's write limits, which its steady reads cannot exceed;
//! - while the shard is more than [`BEHIND_FLOOR`] behind the tip (`millisBehindLatest`), at
//!   least 1: a shard catching up reads as fast as it is given, so what it reads now says
//!   little of what it needs.
//!
//! The figure is smoothed (an exponentially weighted average with the time constant
//! [`Balancing::smoothing`](crate::Balancing::smoothing), a minute by default), so a burst or
//! ±20 % noise does not look like a change of load.
//!
//! **Carried for free.** The holder writes the figure into the lease row (`kclLoad`, with its
//! declared capacity, `kclCapacity`: kcl extensions KCL Java ignores) with each renewal and
//! checkpoint it makes anyway: no write is added, and a row grows by about 30 bytes (still one
//! write unit). The leader, which follows the whole table, reads them there. Under
//! [`Liveness::Heartbeat`](crate::Liveness::Heartbeat) leases are not renewed, so a lease's
//! figure moves with its checkpoints, and the heartbeat row carries the worker's total, by
//! which the leader scales figures gone stale (a shard gone quiet does not checkpoint).
//!
//! A lease taken over starts from the figure its row carries, so a moved lease does not look
//! idle to the leader (which would move it back).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

/// A shard more than this far behind the tip counts at least one unit of load (see the module
/// docs).
pub const BEHIND_FLOOR: Duration = Duration::from_secs(60);

/// What was gathered is folded into the figures at most this often: a shorter window (a
/// checkpoint right after a batch) would measure the batch, not the rate.
const FOLD_EVERY: Duration = Duration::from_secs(1);

/// Bytes per second that make one unit of load: a shard's write limit, 1 MiB/s.
const BYTES_PER_UNIT: f64 = 1024.0 * 1024.0;
/// Records per second that make one unit of load: a shard's write limit, 1,000/s.
const RECORDS_PER_UNIT: f64 = 1000.0;

/// What a lease costs its holder, as the holder measured it, and the holder's capacity (kcl
/// extension attributes `kclLoad` and `kclCapacity`, in thousandths). See the module docs of
/// [`lease::load`](crate::lease::load).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LeaseLoad {
    /// The lease's load in thousandths of a unit (1,000: a shard at its limit).
    pub milli: u32,
    /// The holder's declared capacity in thousandths (1,000: a standard worker;
    /// [`Balancing::capacity`](crate::Balancing::capacity)).
    pub capacity_milli: u32,
    /// How records arrive and are read (kcl extension `kclFlow`), for the fleet's
    /// autoscaling signals; `None` in rows of workers that do not measure it.
    pub flow: Option<Flow>,
}

impl LeaseLoad {
    /// A load of `milli` thousandths on a holder of `capacity_milli` thousandths.
    pub const fn new(milli: u32, capacity_milli: u32) -> Self {
        Self {
            milli,
            capacity_milli,
            flow: None,
        }
    }

    /// The same load, with `flow`.
    #[must_use]
    pub const fn with_flow(mut self, flow: Flow) -> Self {
        self.flow = Some(flow);
        self
    }

    /// The load in units.
    pub fn units(self) -> f64 {
        f64::from(self.milli) / 1000.0
    }

    /// Sets the held lease's gauges (`kcl_lease_load`, `kcl_shard_backlog_records`).
    pub(crate) fn export(self, shard: &crate::types::ShardId) {
        let shard = shard.to_string();
        let backlog = self.flow.map_or(0.0, |f| f.backlog());
        ::metrics::gauge!(crate::metrics::SHARD_BACKLOG, "shard" => shard.clone()).set(backlog);
        ::metrics::gauge!(crate::metrics::LEASE_LOAD, "shard" => shard).set(self.units());
    }

    /// The holder's capacity in units (at least a thousandth).
    pub fn capacity(self) -> f64 {
        f64::from(self.capacity_milli.max(1)) / 1000.0
    }
}

/// How records arrive at a shard and are read from it, as its holder measured them (kcl
/// extension `kclFlow`, written with `kclLoad`): what the leader adds up into
/// [`FleetSignals`](crate::FleetSignals). Rates in thousandths of a record per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct Flow {
    /// Records arriving per second × 1,000: records read per second of the stream's time
    /// the reads covered (the position moves by the records' arrival times, so this is the
    /// producers' rate whether the shard is caught up or catching up).
    pub arrival_milli: u64,
    /// Records read per second × 1,000.
    pub read_milli: u64,
    /// How far behind the tip the shard was at its last read (`millisBehindLatest`).
    pub behind_millis: u64,
    /// The load of reading it, without the backlog floor of `kclLoad`, in thousandths.
    pub work_milli: u32,
}

impl Flow {
    /// A flow of `arrival` and `read` records per second, `behind` the tip, costing `work`
    /// units.
    pub fn new(arrival: f64, read: f64, behind: Duration, work: f64) -> Self {
        Self {
            arrival_milli: u64::from(milli(arrival)),
            read_milli: u64::from(milli(read)),
            behind_millis: u64::try_from(behind.as_millis()).unwrap_or(u64::MAX),
            work_milli: milli(work),
        }
    }

    /// Records arriving per second.
    #[allow(clippy::cast_precision_loss)]
    pub fn arrival(&self) -> f64 {
        self.arrival_milli as f64 / 1000.0
    }

    /// Records read per second.
    #[allow(clippy::cast_precision_loss)]
    pub fn read(&self) -> f64 {
        self.read_milli as f64 / 1000.0
    }

    /// How far behind the tip.
    pub fn behind(&self) -> Duration {
        Duration::from_millis(self.behind_millis)
    }

    /// The load of reading it, in units.
    pub fn work(&self) -> f64 {
        f64::from(self.work_milli) / 1000.0
    }

    /// Records behind the tip: the arrival rate × how far behind.
    pub fn backlog(&self) -> f64 {
        self.arrival() * self.behind().as_secs_f64()
    }

    /// The row's text: four whole numbers.
    pub fn encode(&self) -> String {
        format!(
            "{} {} {} {}",
            self.arrival_milli, self.read_milli, self.behind_millis, self.work_milli
        )
    }

    /// Reads what [`encode`](Self::encode) wrote; `None` for anything else (a hint: a flow
    /// that does not parse is left out, the row stays readable).
    pub fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split_ascii_whitespace();
        let flow = Self {
            arrival_milli: parts.next()?.parse().ok()?,
            read_milli: parts.next()?.parse().ok()?,
            behind_millis: parts.next()?.parse().ok()?,
            work_milli: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(flow)
    }

    /// The flows of several shards as one: rates and work add up, the most behind counts.
    pub(crate) fn sum(flows: impl IntoIterator<Item = Self>) -> Self {
        flows.into_iter().fold(Self::default(), |a, b| Self {
            arrival_milli: a.arrival_milli.saturating_add(b.arrival_milli),
            read_milli: a.read_milli.saturating_add(b.read_milli),
            behind_millis: a.behind_millis.max(b.behind_millis),
            work_milli: a.work_milli.saturating_add(b.work_milli),
        })
    }
}

/// Thousandths of `units`, saturating.
pub(crate) fn milli(units: f64) -> u32 {
    let scaled = (units * 1000.0).round();
    if scaled.is_nan() || scaled <= 0.0 {
        0
    } else if scaled >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        // In range and non-negative: the conversion is exact up to rounding done above.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = scaled as u32;
        n
    }
}

/// Measures one held lease (see the module docs): fed by its shard consumer, read by its
/// tenure when it writes the row.
#[derive(Debug)]
pub(crate) struct Meter {
    state: Mutex<State>,
    smoothing: Duration,
    capacity_milli: u32,
}

#[derive(Debug)]
struct State {
    /// The smoothed load in units.
    smoothed: f64,
    /// When `smoothed` last took in what was gathered.
    folded_at: Instant,
    busy: Duration,
    bytes: u64,
    records: u64,
    behind: Option<Duration>,
    /// The smoothed flow: arrival and read rates (records/s) and the load without the
    /// backlog floor.
    arrival: Smoothed,
    read: Smoothed,
    work: Smoothed,
    /// Where in the stream's time the last read ended (seconds after `base`: the time of the
    /// read less how far behind it was), and where it was when the flow was last folded.
    position: Option<f64>,
    folded_position: Option<f64>,
    /// Records read since the flow was last folded.
    arrived: u64,
    base: Instant,
    /// Batches read and not delivered yet, oldest first: when each was read, and how far
    /// behind the tip it was then. What the processor lags is measured where it is, not
    /// where the read-ahead is: a record read `m` behind and delivered `d` later was `m + d`
    /// behind when it was delivered, and the oldest one waiting lags more every moment (a
    /// processor that never returns shows, instead of hiding behind its last figure).
    /// Each with the arrival span of its records (newest less oldest: one clock's stamps).
    waiting: VecDeque<Waiting>,
    /// The batch being delivered: when it was read, and its records' arrival span.
    delivering: Option<(Instant, Duration)>,
}

impl Meter {
    /// A meter starting from `from` (the figure the row carried when the lease was taken).
    pub(crate) fn new(from: Option<LeaseLoad>, smoothing: Duration, capacity_milli: u32) -> Self {
        Self {
            state: Mutex::new(State {
                smoothed: from.map_or(0.0, LeaseLoad::units),
                folded_at: Instant::now(),
                busy: Duration::ZERO,
                bytes: 0,
                records: 0,
                behind: None,
                // Measured afresh (the first second is taken whole): a row's flow may be
                // old (under heartbeats rows move only with checkpoints), and a stale rate
                // would ask for workers nobody needs.
                arrival: Smoothed::default(),
                read: Smoothed::default(),
                work: Smoothed::default(),
                position: None,
                folded_position: None,
                arrived: 0,
                base: Instant::now(),
                waiting: VecDeque::new(),
                delivering: None,
            }),
            smoothing,
            capacity_milli,
        }
    }

    /// A new reader starts (a processor restarted): what the old one read is gone.
    pub(crate) fn reads_restart(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.waiting.clear();
            s.delivering = None;
        }
    }

    /// The reader passed a batch on, its newest record read `millis` behind the tip and its
    /// oldest `span` before that (in delivery order).
    pub(crate) fn fetched(&self, millis: Option<u64>, span: Duration) {
        if let Ok(mut s) = self.state.lock() {
            s.waiting.push_back(Waiting {
                at: Instant::now(),
                oldest: Duration::from_millis(millis.unwrap_or(0)).saturating_add(span),
                span,
            });
        }
    }

    /// The oldest batch the reader passed on is being delivered.
    pub(crate) fn delivering(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.delivering = s.waiting.pop_front().map(|w| (w.at, w.span));
        }
    }

    /// A batch of `records` records of `bytes` bytes was processed.
    pub(crate) fn read(&self, records: usize, bytes: usize) {
        if let Ok(mut s) = self.state.lock() {
            s.records = s.records.saturating_add(records as u64);
            s.bytes = s.bytes.saturating_add(bytes as u64);
        }
    }

    /// The processor spent `took` inside a hook or a handler.
    pub(crate) fn busy(&self, took: Duration) {
        if let Ok(mut s) = self.state.lock() {
            s.busy = s.busy.saturating_add(took);
        }
    }

    /// The last read (of `records` records) said the shard is `millis` behind the tip; the
    /// records are delivered now (or it read nothing, at the tip).
    pub(crate) fn behind(&self, millis: u64, records: usize) {
        if let Ok(mut s) = self.state.lock() {
            let (waited, span) = s
                .delivering
                .take()
                .map_or((Duration::ZERO, Duration::ZERO), |(at, span)| {
                    (at.elapsed(), span)
                });
            // The newest record delivered marks the position in the stream's time; the
            // oldest says how far behind the processor is.
            let behind = Duration::from_millis(millis).saturating_add(waited);
            s.behind = Some(behind.saturating_add(span));
            let at = Instant::now()
                .saturating_duration_since(s.base)
                .as_secs_f64();
            let position = at - behind.as_secs_f64();
            s.position = Some(position);
            // The first batch delivered covers its own span: its records over it are a rate.
            s.folded_position
                .get_or_insert(position - span.as_secs_f64());
            s.arrived = s.arrived.saturating_add(records as u64);
        }
    }

    /// The figure to write now: what was gathered since the last call folded into the
    /// smoothed load.
    pub(crate) fn report(&self) -> LeaseLoad {
        let Ok(mut s) = self.state.lock() else {
            return LeaseLoad::new(0, self.capacity_milli);
        };
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(s.folded_at);
        if elapsed >= FOLD_EVERY {
            let secs = elapsed.as_secs_f64();
            #[allow(clippy::cast_precision_loss)]
            let shares = [
                s.busy.as_secs_f64() / secs,
                s.bytes as f64 / secs / BYTES_PER_UNIT,
                s.records as f64 / secs / RECORDS_PER_UNIT,
            ];
            let work = shares.into_iter().fold(0.0, f64::max);
            let mut now_load = work;
            if s.behind.is_some_and(|b| b > BEHIND_FLOOR) {
                now_load = now_load.max(1.0);
            }
            let weight = 1.0 - (-secs / self.smoothing.as_secs_f64().max(0.001)).exp();
            s.smoothed += weight * (now_load - s.smoothed);
            s.work.fold(work, weight);
            #[allow(clippy::cast_precision_loss)]
            let read = s.records as f64 / secs;
            s.read.fold(read, weight);
            s.fold_arrival(weight);
            s.folded_at = now;
            s.busy = Duration::ZERO;
            s.bytes = 0;
            s.records = 0;
        }
        let [arrival, read, work] = [&s.arrival, &s.read, &s.work].map(Smoothed::get);
        let oldest = s
            .waiting
            .front()
            .map(|w| w.oldest.saturating_add(w.at.elapsed()));
        let behind = s.behind.unwrap_or_default().max(oldest.unwrap_or_default());
        let flow = Flow::new(arrival, read, behind, work);
        LeaseLoad::new(milli(s.smoothed), self.capacity_milli).with_flow(flow)
    }
}

/// A batch read and not delivered yet.
#[derive(Debug)]
struct Waiting {
    /// When it was read.
    at: Instant,
    /// How far behind the tip its oldest record was then.
    oldest: Duration,
    /// Its newest record's arrival less its oldest's.
    span: Duration,
}

/// An exponentially weighted average corrected for its start: until it has seen a whole
/// time constant, it is the weighted mean of what it saw, not a climb from zero (a fleet
/// that starts far behind must not look idle for a minute), nor the first window alone.
#[derive(Debug, Default)]
struct Smoothed {
    /// The average as if started from zero.
    value: f64,
    /// The weight it has taken in (1: a whole history).
    mass: f64,
}

impl Smoothed {
    fn fold(&mut self, now: f64, weight: f64) {
        self.value += weight * (now - self.value);
        self.mass += weight * (1.0 - self.mass);
    }

    fn get(&self) -> f64 {
        if self.mass > 0.0 {
            self.value / self.mass
        } else {
            0.0
        }
    }
}

impl State {
    /// Folds the records read since the last fold over the stream time they covered into
    /// the arrival rate. Reads that covered no stream time (none came back, or the position
    /// stood still) say nothing of it: it is left as it was.
    fn fold_arrival(&mut self, weight: f64) {
        let (Some(position), Some(from)) = (self.position, self.folded_position) else {
            self.folded_position = self.position;
            self.arrived = 0;
            return;
        };
        let covered = position - from;
        if covered > 0.05 {
            #[allow(clippy::cast_precision_loss)]
            let arrival = self.arrived as f64 / covered;
            self.arrival.fold(arrival, weight);
            self.folded_position = Some(position);
            self.arrived = 0;
        }
    }
}

/// The meters of a worker's held leases: what its heartbeat row reports in all (see the
/// module docs). Cheap to clone: one registry per worker.
#[derive(Debug, Clone)]
pub(crate) struct Meters {
    held: Arc<Mutex<Vec<Weak<Meter>>>>,
    capacity_milli: u32,
}

impl Meters {
    /// A worker's registry, for a worker of `capacity_milli`.
    pub(crate) fn new(capacity_milli: u32) -> Self {
        Self {
            held: Arc::default(),
            capacity_milli,
        }
    }

    /// Counts `meter` in the total while it lives (while its lease is held).
    pub(crate) fn register(&self, meter: &Arc<Meter>) {
        if let Ok(mut held) = self.held.lock() {
            held.retain(|m| m.strong_count() > 0);
            held.push(Arc::downgrade(meter));
        }
    }

    /// The worker's load: the sum of its held leases' figures, each folded now.
    pub(crate) fn total(&self) -> LeaseLoad {
        let live: Vec<Arc<Meter>> = match self.held.lock() {
            Ok(held) => held.iter().filter_map(Weak::upgrade).collect(),
            Err(_) => Vec::new(),
        };
        let reports: Vec<LeaseLoad> = live.iter().map(|m| m.report()).collect();
        let milli = reports
            .iter()
            .fold(0u32, |sum, r| sum.saturating_add(r.milli));
        let flow = Flow::sum(reports.iter().filter_map(|r| r.flow));
        LeaseLoad::new(milli, self.capacity_milli).with_flow(flow)
    }
}

/// Where a tenure's figure comes from: its lease's meter, or (a heartbeat row) the worker's.
#[derive(Debug, Clone)]
pub(crate) enum Figure {
    /// One held lease.
    Lease(Arc<Meter>),
    /// Every lease the worker holds.
    Worker(Meters),
}

impl Figure {
    /// The figure to write now.
    pub(crate) fn report(&self) -> LeaseLoad {
        match self {
            Self::Lease(meter) => meter.report(),
            Self::Worker(meters) => meters.total(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    async fn run(meter: &Meter, seconds: u64, busy_per_second: Duration) -> LeaseLoad {
        let mut last = meter.report();
        for _ in 0..seconds {
            tokio::time::sleep(Duration::from_secs(1)).await;
            meter.busy(busy_per_second);
            last = meter.report();
        }
        last
    }

    #[tokio::test(start_paused = true)]
    async fn busy_time_is_the_load_once_smoothed() {
        let meter = Meter::new(None, MINUTE, 1000);
        let after_a_minute = run(&meter, 60, Duration::from_millis(500)).await;
        // 1 − e^−1 of the way in one time constant.
        assert!(
            (300..=330).contains(&after_a_minute.milli),
            "{after_a_minute:?}"
        );
        let settled = run(&meter, 600, Duration::from_millis(500)).await;
        assert!((495..=500).contains(&settled.milli), "{settled:?}");
        assert_eq!(settled.capacity_milli, 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_records_and_backlog_each_count_by_their_own_limit() {
        let meter = Meter::new(None, Duration::from_millis(1), 1000);
        tokio::time::sleep(Duration::from_secs(1)).await;
        meter.read(10, 512 * 1024);
        assert_eq!(meter.report().milli, 500, "half of 1 MiB/s");
        tokio::time::sleep(Duration::from_secs(1)).await;
        meter.read(1500, 1000);
        assert_eq!(meter.report().milli, 1500, "1,500 records a second");
        meter.behind(61_000, 0);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(meter.report().milli, 1000, "behind: at least one unit");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_taken_over_starts_from_its_rows_figure() {
        let meter = Meter::new(Some(LeaseLoad::new(800, 2000)), MINUTE, 1000);
        tokio::time::sleep(Duration::from_secs(3)).await;
        meter.busy(Duration::from_millis(2400));
        let report = meter.report();
        assert_eq!(report.milli, 800, "{report:?}");
        assert_eq!(report.capacity_milli, 1000, "the new holder's capacity");
    }

    #[tokio::test(start_paused = true)]
    async fn a_workers_total_is_its_held_leases() {
        let meters = Meters::new(2000);
        let a = Arc::new(Meter::new(Some(LeaseLoad::new(300, 1000)), MINUTE, 2000));
        let b = Arc::new(Meter::new(Some(LeaseLoad::new(200, 1000)), MINUTE, 2000));
        meters.register(&a);
        meters.register(&b);
        let total = meters.total();
        assert_eq!((total.milli, total.capacity_milli), (500, 2000));
        drop(a);
        assert_eq!(meters.total().milli, 200, "a lease let go leaves the sum");
    }

    #[test]
    fn milli_saturates() {
        assert_eq!(milli(-1.0), 0);
        assert_eq!(milli(f64::NAN), 0);
        assert_eq!(milli(1e12), u32::MAX);
        assert_eq!(milli(0.2505), 251);
    }
}
