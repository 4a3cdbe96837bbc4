//! Records that fail: a share of the fleets run under a failure policy, with poison records
//! (always failing), permanent ones (failing with `Permanent`) and flaky ones (failing their
//! first one or two tries, fleet-wide), a dead-letter sink that refuses at times, batch
//! processors that name the failed record or leave the worker to bisect, and `Parallel` with
//! and without parked keys.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kcl_core::failure::{BatchFailed, DeadLetter, DeadLetterSink, FailurePolicy, Permanent};
use kcl_core::memory::MemoryLeaseStore;
use kcl_core::memory::next_event_seq;
use kcl_core::{BackendError, BoxError, ErrorKind, ExtendedSequenceNumber, Record, ShardId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::processor::Log;

/// Tries of a record before it is given up.
pub const ATTEMPTS: u32 = 3;

/// Records a shard gives up in a row before it takes it for an outage and blocks
/// (`FailurePolicy::outage_after`, its default).
pub const OUTAGE_AFTER: u32 = 10;

/// What a record does when processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Fine,
    /// Fails every time.
    Poison,
    /// Fails every time, with `Permanent`.
    Permanent,
    /// Fails its first n tries, counted fleet-wide (n below `ATTEMPTS`: it never runs out).
    Flaky(u32),
}

/// One seed's failing records and policy.
#[derive(Debug)]
pub struct Poison {
    seed: u64,
    pub policy: FailurePolicy,
    /// `Parallel` parks a key behind a record given up on.
    pub park: bool,
    /// Batch processors name the failed record (`BatchFailed`); otherwise the worker bisects.
    pub names: bool,
    pub sink: SimSink,
    /// The sink refuses now and then.
    pub faulty_sink: bool,
    /// `Parallel`'s handler panics on poison records before its future (while it builds it).
    pub panics_early: bool,
    /// `Parallel`'s `key_by` panics on permanent records.
    pub key_panics: bool,
    /// A dependency outage: every try of every record fails, from this long after the start
    /// for this long.
    pub outage: Option<(Duration, Duration)>,
    outage_on: Arc<AtomicBool>,
    /// Parked keys are redriven now and then (through their holders), under live traffic.
    pub redrives: bool,
    /// Partition keys an operator fixed before redriving them: their records succeed.
    fixed: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl Poison {
    /// A third of the disturbed seeds (drawn apart, so that the others' draws stay as they
    /// were).
    pub fn draw(seed: u64, planned: bool, log: &Log) -> Option<Arc<Self>> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9015_0a11);
        if planned || !rng.random_ratio(1, 3) {
            return None;
        }
        let policy = FailurePolicy::dead_letter(ATTEMPTS)
            .backoff(Duration::from_millis(100), Duration::from_millis(800))
            .outage_after(Some(OUTAGE_AFTER));
        // Drawn apart too, so that the draws above stay as they were.
        let mut more = StdRng::seed_from_u64(seed ^ 0x07a6_e5e5);
        let outage = more.random_ratio(1, 3).then(|| {
            let begin = Duration::from_millis(more.random_range(10_000..40_000));
            (
                begin,
                Duration::from_millis(more.random_range(5_000..30_000)),
            )
        });
        Some(Arc::new(Self {
            seed,
            policy,
            park: rng.random_bool(0.5),
            names: rng.random_bool(0.5),
            sink: SimSink {
                log: log.clone(),
                refusing: Arc::default(),
                kept: Arc::default(),
            },
            faulty_sink: rng.random_bool(0.5),
            panics_early: more.random_bool(0.5),
            key_panics: more.random_bool(0.5),
            outage,
            outage_on: Arc::default(),
            redrives: more.random_bool(0.5),
            fixed: std::sync::Mutex::default(),
        }))
    }

    /// Whether the outage is on now.
    pub fn outage_on(&self) -> bool {
        self.outage_on.load(Ordering::Relaxed)
    }

    /// Turns the outage on and off when the seed says (a second after `stop` at the latest).
    pub async fn run_outage(self: Arc<Self>, log: Log, stop: CancellationToken) {
        let Some((begin, length)) = self.outage else {
            return;
        };
        tokio::select! {
            () = sleep(begin) => {}
            () = stop.cancelled() => return,
        }
        self.outage_on.store(true, Ordering::Relaxed);
        log.lock().outage = Some((next_event_seq(), None));
        tokio::select! {
            () = sleep(length) => {}
            () = stop.cancelled() => {}
        }
        self.outage_on.store(false, Ordering::Relaxed);
        if let Some((_, end)) = &mut log.lock().outage {
            *end = Some(next_event_seq());
        }
    }

    /// What the record at `position` of `shard` does: the same for every worker.
    pub fn kind(&self, shard: &ShardId, position: &ExtendedSequenceNumber) -> Kind {
        let h = super::hash(&format!("{}/{shard}/{position}/poison", self.seed));
        match h % 1000 {
            0..4 => Kind::Poison,
            4..6 => Kind::Permanent,
            6..26 => Kind::Flaky(1 + u32::from(h.is_multiple_of(7))),
            _ => Kind::Fine,
        }
    }

    /// One try of `record`: the error it fails with, if it does (a flaky record's tries are
    /// counted in the journal).
    pub fn attempt(&self, log: &Log, shard: &ShardId, record: &Record) -> Option<BoxError> {
        let position = record.position();
        if self.outage_on() {
            log.lock()
                .outage_failed
                .insert(format!("{shard}/{position}"));
            return Some("dependency down".into());
        }
        if self.is_fixed(&record.partition_key) {
            return None;
        }
        match self.kind(shard, &position) {
            Kind::Fine => None,
            Kind::Poison => Some("poison record".into()),
            Kind::Permanent => Some(Permanent::new("unparseable record").into()),
            Kind::Flaky(n) => {
                let mut journal = log.lock();
                let tries = journal
                    .flaky_tries
                    .entry(format!("{shard}/{position}"))
                    .or_default();
                *tries += 1;
                (*tries <= n).then(|| "flaky dependency".into())
            }
        }
    }

    /// The first record of a batch that fails, and its error.
    pub fn first_failing(
        &self,
        log: &Log,
        shard: &ShardId,
        records: &[Record],
    ) -> Option<(usize, BoxError)> {
        records
            .iter()
            .enumerate()
            .find_map(|(i, r)| self.attempt(log, shard, r).map(|e| (i, e)))
    }

    /// The error a batch processor returns for `records[i]` failing with `error`.
    pub fn batch_error(&self, records: &[Record], i: usize, error: BoxError) -> BoxError {
        if self.names {
            BatchFailed::at(&records[i], error).into()
        } else {
            error
        }
    }

    fn fix(&self, key: &str) {
        let mut fixed = self
            .fixed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        fixed.insert(key.to_owned());
    }

    pub fn is_fixed(&self, key: &str) -> bool {
        let fixed = self
            .fixed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        fixed.contains(key)
    }

    /// As an operator would, every ten to twenty seconds until `stop`: fixes what one parked
    /// key's records need, then redrives the key through its holders (the journal says when).
    pub async fn redrive(
        self: Arc<Self>,
        store: MemoryLeaseStore,
        log: Log,
        stop: CancellationToken,
    ) {
        if !self.redrives {
            return;
        }
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0x00ed_0e1e);
        while !stop.is_cancelled() {
            sleep(Duration::from_millis(rng.random_range(10_000..20_000))).await;
            let rows = store.leases();
            let kept = self.sink.kept();
            // The parked key of the first kept letter whose key a row still parks.
            let parks = |k: &String| {
                let prefix = format!("{k}/");
                rows.iter()
                    .any(|r| r.parked_keys.iter().any(|e| e.starts_with(&prefix)))
            };
            let Some(letter) = kept
                .iter()
                .find(|l| l.parked_key.as_ref().is_some_and(parks))
            else {
                continue;
            };
            let hex = letter.parked_key.clone().unwrap_or_default();
            let key = letter.record.partition_key.clone();
            let mut counts: BTreeMap<ShardId, usize> = BTreeMap::new();
            let mut ids = std::collections::BTreeSet::new();
            for l in kept
                .iter()
                .filter(|l| l.parked_key.as_deref() == Some(hex.as_str()))
            {
                if ids.insert((l.shard.clone(), l.record.position())) {
                    *counts.entry(l.shard.clone()).or_default() += 1;
                }
            }
            let plan = kcl_core::admin::plan_redrive(&rows, &hex, &counts);
            if !plan.orphans.is_empty() {
                continue;
            }
            self.fix(&key);
            let seq = next_event_seq();
            if kcl_core::admin::request_redrive(&store, &plan)
                .await
                .is_ok()
            {
                log.lock().redrives.push((seq, hex, key));
            }
        }
    }

    /// Makes the sink refuse for a second or five every ten to twenty, until `stop`.
    pub async fn disturb_sink(self: Arc<Self>, stop: CancellationToken) {
        if !self.faulty_sink {
            return;
        }
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0x5177_0000);
        while !stop.is_cancelled() {
            sleep(Duration::from_millis(rng.random_range(10_000..20_000))).await;
            self.sink.refusing.store(true, Ordering::Relaxed);
            sleep(Duration::from_millis(rng.random_range(1_000..5_000))).await;
            self.sink.refusing.store(false, Ordering::Relaxed);
        }
    }
}

/// What a letter read back for a replay carries (as its explicit hash key, which no record
/// of the simulated stream has): a handler run of it is a replay, not a delivery. Not
/// "dead-lettered once": after an operator's reset, a lettered record is delivered again.
pub const REPLAY_MARK: &str = "sim-replay";

/// The fleet's dead-letter sink: what it accepted goes to the journal, with when; it keeps
/// what no redrive removed, and reads it back.
#[derive(Debug, Clone)]
pub struct SimSink {
    log: Log,
    refusing: Arc<AtomicBool>,
    kept: Arc<std::sync::Mutex<Vec<(u64, DeadLetter)>>>,
}

impl SimSink {
    fn kept(&self) -> Vec<DeadLetter> {
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.iter().map(|(_, l)| l.clone()).collect()
    }
}

impl kcl_core::failure::LetterReader for SimSink {
    async fn parked(&self, key: &str) -> Result<Vec<kcl_core::failure::Kept>, BackendError> {
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let of_key = kept
            .iter()
            .filter(|(_, l)| l.parked_key.as_deref() == Some(key));
        let kept = of_key.map(|(h, l)| {
            let mut letter = l.clone();
            letter.record.explicit_hash_key = Some(REPLAY_MARK.to_owned());
            kcl_core::failure::Kept::new(letter, h.to_string())
        });
        Ok(kept.collect())
    }

    async fn remove(&self, kept: &kcl_core::failure::Kept) -> Result<(), BackendError> {
        let mut all = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = all.len();
        all.retain(|(h, _)| h.to_string() != kept.handle);
        if all.len() < before {
            self.log
                .lock()
                .removed
                .push((next_event_seq(), kept.letter.clone()));
        }
        Ok(())
    }
}

impl DeadLetterSink for SimSink {
    async fn put(&self, letter: &DeadLetter) -> Result<(), BackendError> {
        if self.refusing.load(Ordering::Relaxed) {
            self.log.lock().sink_refusals += 1;
            return Err(BackendError::new(
                ErrorKind::Retryable,
                "put",
                "sink refuses",
            ));
        }
        let seq = next_event_seq();
        let mut journal = self.log.lock();
        journal.letters.push((seq, letter.clone()));
        drop(journal);
        let mut kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.push((seq, letter.clone()));
        Ok(())
    }
}

/// The letters accepted, by shard and position: every time each was accepted, in order.
pub fn acceptances(
    log: &[(u64, DeadLetter)],
) -> BTreeMap<(ShardId, ExtendedSequenceNumber), Vec<u64>> {
    let mut at: BTreeMap<_, Vec<u64>> = BTreeMap::new();
    for (seq, letter) in log {
        at.entry((letter.shard.clone(), letter.record.position()))
            .or_default()
            .push(*seq);
    }
    for seqs in at.values_mut() {
        seqs.sort_unstable();
    }
    at
}

/// The letters accepted, by shard and position: when each was first accepted.
pub fn accepted(log: &[(u64, DeadLetter)]) -> BTreeMap<(ShardId, ExtendedSequenceNumber), u64> {
    let mut at = BTreeMap::new();
    for (seq, letter) in log {
        let key = (letter.shard.clone(), letter.record.position());
        let first = at.entry(key).or_insert(*seq);
        *first = (*first).min(*seq);
    }
    at
}
