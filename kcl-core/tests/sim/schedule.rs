//! What happens to the fleet while it runs: a producer, and a scheduler of faults and changes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kcl_core::admin::{self, RESET_OWNER, ResetTo};
use kcl_core::aggregation;
use kcl_core::memory::{Faults, MemoryStream};
use kcl_core::multi_stream::StreamId;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{Checkpoint, ExtendedSequenceNumber, Record, ShardId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::fleet::{Fleet, stream_client};
use super::operator::Hand;
use super::scenario::{MAX_SHARDS, MAX_WORKERS, Stats, config};

/// The producer: writes until told to stop. In a third of the seeds, one record in three is
/// a KPL aggregate of 2 to 6 user records of one partition key (so that they go to one
/// shard, as the KPL's do), which processors see one by one at sub-sequence numbers.
pub async fn produce(stream: MemoryStream, seed: u64, stop: CancellationToken) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xfeed);
    let aggregates = StdRng::seed_from_u64(seed ^ 0x0a66_0e6a).random_ratio(1, 3);
    let mut n = 0u64;
    while !stop.is_cancelled() {
        sleep(Duration::from_millis(rng.random_range(20..200))).await;
        for _ in 0..rng.random_range(1..=3) {
            let key = format!("pk-{}", rng.random_range(0..40));
            if aggregates && rng.random_ratio(1, 3) {
                let users: Vec<_> = (0..rng.random_range(2..=6))
                    .map(|i| {
                        (
                            key.clone(),
                            None,
                            bytes::Bytes::from(format!("record-{n}.{i}")),
                        )
                    })
                    .collect();
                stream.put(&key, aggregation::aggregate(&users));
            } else {
                stream.put(&key, format!("record-{n}"));
            }
            n += 1;
        }
    }
}

/// Splits or merges one shard; true if it did.
pub fn reshard(stream: &MemoryStream, rng: &mut StdRng) -> bool {
    let shards = stream.shards();
    let mut open: Vec<_> = shards.iter().filter(|s| !s.closed).collect();
    if rng.random_bool(0.5) {
        open.len() < MAX_SHARDS
            && stream
                .split(&open[rng.random_range(0..open.len())].id)
                .is_ok()
    } else {
        open.sort_by_key(|s| s.hash_key_range.start);
        if open.len() < 2 {
            return false;
        }
        let i = rng.random_range(0..open.len() - 1);
        stream.merge(&open[i].id, &open[i + 1].id).is_ok()
    }
}

/// Faults to undo later: a client to resume and heal, or the store's fault rates.
struct Undo(Vec<(Instant, Option<String>)>);

impl Undo {
    fn due(&mut self, faults: &Faults, now: Instant) {
        self.0.retain(|(at, who)| {
            if *at > now {
                return true;
            }
            match who {
                None => {
                    faults.set_error_rate(0.0);
                    faults.set_throttle_rate(0.0);
                    faults.set_ambiguous_rate(0.0);
                    faults.set_max_latency(Duration::ZERO);
                    faults.set_expired_iterator_rate(0.0);
                    faults.set_stragglers(0.0, Duration::ZERO);
                }
                Some(id) => {
                    faults.resume(id);
                    faults.heal(id);
                }
            }
            false
        });
    }
}

/// What the scheduler works on.
pub struct Run<'a> {
    pub fleet: &'a mut Fleet,
    pub rng: &'a mut StdRng,
    pub stats: &'a mut Stats,
    pub aged_out: &'a mut BTreeMap<ShardId, Vec<Record>>,
    pub violations: Vec<String>,
}

/// The scheduler: for 15 to 45 s, one event every 0.3 to 2.5 s. With `planned`, only joins,
/// graceful leaves, splits and merges. Returns what went wrong on the way (an unclean leave).
pub async fn disturb(mut run: Run<'_>, planned: bool) -> Vec<String> {
    let faults = run.fleet.faults.clone();
    let fault_end = Instant::now() + Duration::from_secs(run.rng.random_range(15..45));
    let mut undo = Undo(Vec::new());
    // A third of the disturbed seeds suspend the fleet's host once; drawn apart, so that the
    // scenario's own draws stay as they were.
    let mut host = StdRng::seed_from_u64(run.fleet.seed ^ 0x5005_9e4d);
    let mut suspend_at = (!planned && host.random_ratio(1, 3))
        .then(|| Instant::now() + Duration::from_millis(host.random_range(3_000..15_000)));
    // Under a restart grace, most graceful leaves are restarts under the same id; drawn
    // apart, so that the scenario's own draws stay as they were.
    let mut restarts = Restarts {
        rng: StdRng::seed_from_u64(run.fleet.seed ^ 0x2e57_a27d),
        pending: Vec::new(),
    };
    let mut hand = Hand::new(run.fleet, planned);
    let mut sink_hand = super::positions::Hand::new(run.fleet, planned);
    while Instant::now() < fault_end {
        let pause = Duration::from_millis(run.rng.random_range(300..2500));
        run.pause(pause, &mut restarts).await;
        let now = Instant::now();
        undo.due(&faults, now);
        if suspend_at.take_if(|at| *at <= now).is_some() {
            run.suspend(&mut host).await;
            continue;
        }
        if hand.act(run.fleet, run.stats, now).await {
            continue;
        }
        if sink_hand.act(run.fleet, run.stats, now).await {
            continue;
        }
        let event = run.rng.random_range(0..100);
        if planned && !(24..44).contains(&event) && event < 66 {
            continue;
        }
        match event {
            0..12 => run.crash().await,
            12..24 => run.freeze(now, &mut undo),
            24..36 => run.join(restarts.pending.len()),
            36..44 => run.leave(&mut restarts).await,
            44..56 => run.store_faults(now, &mut undo),
            56..62 => run.partition(now, &mut undo),
            62..66 => run.age_out(),
            66..83 => run.split(),
            83..89 if !planned => run.reset().await,
            95..100 => run.roll_over(),
            _ => run.merge(),
        }
    }
    // Workers restarting come back as planned.
    while let Some(due) = restarts.pending.iter().map(|(_, at)| *at).max() {
        run.pause(due.saturating_duration_since(Instant::now()), &mut restarts)
            .await;
    }
    run.violations
}

/// Workers stopped for a restart, and when each comes back.
struct Restarts {
    rng: StdRng,
    pending: Vec<(String, Instant)>,
}

impl Run<'_> {
    /// Sleeps `length`, starting again the workers whose restart is due on the way.
    async fn pause(&mut self, length: Duration, restarts: &mut Restarts) {
        let until = Instant::now() + length;
        loop {
            let next = restarts.pending.iter().map(|(_, at)| *at).min();
            match next {
                Some(due) if due <= until => {
                    tokio::time::sleep_until(due).await;
                    let i = restarts
                        .pending
                        .iter()
                        .position(|(_, at)| *at == due)
                        .expect("a pending restart");
                    let (id, _) = restarts.pending.swap_remove(i);
                    self.fleet.rejoin(&id);
                    let mut log = self.fleet.log.lock();
                    if let Some(r) = log.restarts.iter_mut().rev().find(|r| r.worker == id) {
                        r.back = Some(Instant::now());
                    }
                }
                _ => break,
            }
        }
        tokio::time::sleep_until(until).await;
    }
}

impl Run<'_> {
    async fn crash(&mut self) {
        if self.fleet.live.len() > 1
            && let Some(id) = self.fleet.pick(self.rng)
        {
            self.fleet.remove(&id, true).await;
            self.fleet.log.lock().crashes.push((id, Instant::now()));
            self.stats.crashes += 1;
        }
    }

    /// The whole process stops (SIGSTOP, a GC pause, a VM suspend), past the failover time,
    /// then resumes with the state it had.
    fn freeze(&mut self, now: Instant, undo: &mut Undo) {
        if let Some(id) = self.fleet.pick(self.rng) {
            self.fleet.faults.pause(&id);
            let length =
                config().failover_time + Duration::from_millis(self.rng.random_range(100..4000));
            self.stats.freezes += 1;
            let mut log = self.fleet.log.lock();
            log.disturbed.push((now, now + length));
            log.worker_disturbed.push((id.clone(), now, now + length));
            undo.0.push((now + length, Some(id)));
        }
    }

    /// The host of the whole fleet suspends (a laptop's lid, a paused VM) past the failover
    /// time: every process stops at once. As it resumes, the clock has jumped, and work whose
    /// reply arrived meanwhile is woken before the runtime fires any timer — the lease's
    /// validity's included. That work must not go on (`validity`).
    async fn suspend(&mut self, host: &mut StdRng) {
        let now = Instant::now();
        let length = config().failover_time + Duration::from_millis(host.random_range(100..3_000));
        {
            let mut log = self.fleet.log.lock();
            log.disturbed.push((now, now + length));
            for id in self.fleet.live.keys() {
                log.worker_disturbed.push((id.clone(), now, now + length));
            }
        }
        self.fleet.log.resume();
        tokio::time::advance(length).await;
        self.stats.suspends += 1;
    }

    /// A new worker, unless the fleet is full (workers due back from a restart counted).
    fn join(&mut self, restarting: usize) {
        if self.fleet.live.len() + restarting < MAX_WORKERS {
            self.fleet.join();
            self.stats.joins += 1;
        }
    }

    /// A worker stops gracefully; under a restart grace, two times in three it comes back
    /// under the same id 0.5 to 7 s later (the grace is 8 s; past the failover time of 3 s
    /// at times, when only the grace keeps its leases waiting).
    async fn leave(&mut self, restarts: &mut Restarts) {
        if self.fleet.live.len() > 1
            && let Some(id) = self.fleet.pick(self.rng)
            && !self.fleet.faults.is_paused(&id)
        {
            let stopped = Instant::now();
            self.violations.extend(self.fleet.remove(&id, false).await);
            let down = Instant::now();
            self.fleet.log.lock().leaves.push((id.clone(), down));
            self.stats.leaves += 1;
            if self.fleet.config.restart_grace.is_some() && restarts.rng.random_ratio(2, 3) {
                let back = down + Duration::from_millis(restarts.rng.random_range(500..7_000));
                restarts.pending.push((id.clone(), back));
                self.fleet
                    .log
                    .lock()
                    .restarts
                    .push(super::processor::Restart {
                        worker: id,
                        stopped,
                        down,
                        back: None,
                    });
                self.stats.restarts += 1;
            }
        }
    }

    fn store_faults(&mut self, now: Instant, undo: &mut Undo) {
        let (faults, rng) = (&self.fleet.faults, &mut *self.rng);
        faults.set_error_rate(rng.random_range(0.0..0.2));
        faults.set_throttle_rate(rng.random_range(0.0..0.2));
        faults.set_ambiguous_rate(rng.random_range(0.0..0.1));
        faults.set_max_latency(Duration::from_millis(rng.random_range(0..400)));
        faults.set_expired_iterator_rate(rng.random_range(0.0..0.1));
        let straggle = config().failover_time + Duration::from_millis(rng.random_range(0..3000));
        faults.set_stragglers(rng.random_range(0.0..0.05), straggle);
        let until = now + Duration::from_millis(rng.random_range(500..5000));
        // Writes may land a straggle later: disturbed until then.
        let mut log = self.fleet.log.lock();
        log.disturbed.push((now, until + straggle));
        log.store_faulted.push((now, until + straggle));
        drop(log);
        undo.0.push((until, None));
        self.stats.store_faults += 1;
    }

    /// Cuts one worker off from the lease table, from the stream, or from both.
    fn partition(&mut self, now: Instant, undo: &mut Undo) {
        let Some(id) = self.fleet.pick(self.rng) else {
            return;
        };
        let until = now + Duration::from_millis(self.rng.random_range(500..6000));
        let mut log = self.fleet.log.lock();
        log.disturbed.push((now, until));
        log.worker_disturbed.push((id.clone(), now, until));
        drop(log);
        let stream = stream_client(&id);
        let cut = match self.rng.random_range(0..3) {
            0 => vec![id],
            1 => vec![stream],
            _ => vec![id, stream],
        };
        for client in cut {
            self.fleet.faults.partition(&client);
            undo.0.push((until, Some(client)));
        }
        self.stats.partitions += 1;
    }

    /// A shard is split and its parent ages out of retention before the fleet has read it to
    /// its end (the fleet was slow, or down).
    fn age_out(&mut self) {
        if let Some((shard, unread)) = oldest_closed(self.fleet, self.rng) {
            self.aged_out.insert(
                shard.clone(),
                super::user_records(&self.fleet.stream, &shard),
            );
            if self.fleet.stream.age_out(&shard).is_ok() {
                self.stats.aged_out += 1;
                self.stats.aged_out_unread += usize::from(unread);
            }
        }
    }

    /// An operator resets a shard's checkpoint back to a record already processed (replay
    /// after a bug), while the fleet runs: `kcl-admin reset`'s own code, on the same table.
    async fn reset(&mut self) {
        // Back to a record of the stream's history only where that history is owed.
        if self.fleet.config.initial_position != kcl_core::InitialPosition::TrimHorizon {
            return;
        }
        let leases = self.fleet.store.leases();
        // Now and then at a finished lease, which must be refused: its children may have
        // started (`lineage` would see its records again after theirs).
        let finished = self.rng.random_ratio(1, 4);
        let checkpointed: Vec<_> = leases
            .iter()
            .filter(|l| !is_coordination_key(&l.key))
            .filter_map(|l| match &l.checkpoint {
                Checkpoint::Sequence(s) if !finished => Some((l.key.clone(), s.sequence.clone())),
                Checkpoint::ShardEnd if finished => {
                    let shard = self.fleet.keys.shard_of(&l.key);
                    let last = self
                        .fleet
                        .stream
                        .records(&shard)
                        .last()?
                        .sequence_number
                        .clone();
                    Some((l.key.clone(), last))
                }
                _ => None,
            })
            .collect();
        if checkpointed.is_empty() {
            return;
        }
        let (key, at) = &checkpointed[self.rng.random_range(0..checkpointed.len())];
        let shard = StreamId::split_key(key).map_or_else(|| key.clone(), |(_, shard)| shard);
        let earlier: Vec<_> = self
            .fleet
            .stream
            .records(&shard)
            .into_iter()
            .filter(|r| &r.sequence_number <= at)
            .collect();
        if earlier.is_empty() {
            return;
        }
        let to = &earlier[self.rng.random_range(0..earlier.len())];
        let target = ResetTo {
            checkpoint: Checkpoint::Sequence(ExtendedSequenceNumber::new(
                to.sequence_number.clone(),
            )),
            pin: None,
        };
        let store = self.fleet.store.client(RESET_OWNER);
        if admin::reset(&store, key, &target).await.is_ok() {
            self.stats.resets += 1;
        }
    }

    fn split(&mut self) {
        let open = self.fleet.stream.open_shards();
        if open.len() < MAX_SHARDS
            && !open.is_empty()
            && self
                .fleet
                .stream
                .split(&open[self.rng.random_range(0..open.len())])
                .is_ok()
        {
            self.stats.splits += 1;
        }
    }

    /// A shard closes and one child carries on, as DynamoDB Streams' shards do every few
    /// hours.
    fn roll_over(&mut self) {
        let open = self.fleet.stream.open_shards();
        if !open.is_empty()
            && self
                .fleet
                .stream
                .roll_over(&open[self.rng.random_range(0..open.len())])
                .is_ok()
        {
            self.stats.roll_overs += 1;
        }
    }

    fn merge(&mut self) {
        let shards = self.fleet.stream.shards();
        let mut open: Vec<_> = shards.iter().filter(|s| !s.closed).collect();
        open.sort_by_key(|s| s.hash_key_range.start);
        if open.len() > 1 {
            let i = self.rng.random_range(0..open.len() - 1);
            if self
                .fleet
                .stream
                .merge(&open[i].id, &open[i + 1].id)
                .is_ok()
            {
                self.stats.merges += 1;
            }
        }
    }
}

/// A closed shard to age out of retention, after splitting an open shard of the oldest
/// generation to make one. As in Kinesis, the oldest first: never while a parent of it is
/// still there. Preferably one the fleet has not read to its end yet, which is the case the
/// worker must survive; true if it is one.
fn oldest_closed(fleet: &Fleet, rng: &mut StdRng) -> Option<(ShardId, bool)> {
    let roots = |shards: &[kcl_core::Shard], closed: bool| -> Vec<ShardId> {
        let listed: BTreeSet<&ShardId> = shards.iter().map(|s| &s.id).collect();
        shards
            .iter()
            .filter(|s| {
                s.closed == closed && s.parent_shard_ids.iter().all(|p| !listed.contains(p))
            })
            .map(|s| s.id.clone())
            .collect()
    };
    let open = roots(&fleet.stream.shards(), false);
    if fleet.stream.open_shards().len() < MAX_SHARDS && !open.is_empty() {
        let _ = fleet.stream.split(&open[rng.random_range(0..open.len())]);
    }
    let oldest = roots(&fleet.stream.shards(), true);
    let unfinished: BTreeSet<ShardId> = fleet
        .store
        .leases()
        .into_iter()
        .filter(|l| !l.is_finished())
        .map(|l| l.key)
        .collect();
    let unread: Vec<&ShardId> = oldest.iter().filter(|s| unfinished.contains(*s)).collect();
    let pool: Vec<&ShardId> = if unread.is_empty() {
        oldest.iter().collect()
    } else {
        unread.clone()
    };
    (!pool.is_empty()).then(|| {
        (
            pool[rng.random_range(0..pool.len())].clone(),
            !unread.is_empty(),
        )
    })
}
