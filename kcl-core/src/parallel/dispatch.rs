//! The dispatcher: which record runs next, and what a failing one costs.
//!
//! Records wait in one queue per key. A key is *ready* when it has a record waiting and none
//! running; ready keys start in the order their first waiting record was delivered, so the
//! oldest record that may run runs first and the watermark moves as early as it can.
//!
//! Under a failure policy that handles failures in place, a failed record goes back to its
//! key: the key stays busy (no later record of it runs) while the record *rests* for its
//! backoff outside the `max_in_flight` slots, so every other key keeps flowing; then it is
//! the first of its key to run again. Once its tries are spent it is given up (dead-lettered
//! or skipped), its `Ack` done only after that, and its key goes on — or, with
//! `park_keys`, the key is parked: its later records are given up behind it, unrun.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument as _;

use super::KeyFn;
use super::keys::{Job, Keys};
use super::replay::{Replay, Replayed, Request};
use super::work::{Done, Work};
use crate::ack::Ack;
use crate::error::BoxError;
use crate::failure::{Entry, Handling, Next, Permanent, Reason, park_entry, parse_entry};
use crate::mutation::{self, Mutation};
use crate::types::{ExtendedSequenceNumber, Record};

/// How a run of a record ended.
enum Ran {
    /// Finished (its `Ack` is done), or computed (its outputs wait to commit).
    Done,
    /// Given up on (dead-lettered or skipped): its `Ack` is done.
    GivenUp,
    /// The handler failed; the record comes back for the policy to decide.
    Failed(Box<Job>, BoxError),
    /// Its `Ack` failed (or the lease's validity ran out): the shard restarts.
    Stopped,
    /// Given up on, parking its key: the entry is the watermark's to write.
    Parked,
    /// The key's letters were replayed (a redrive), or the replay stopped.
    Replayed(Replayed),
}

/// The failure handling of one shard's dispatcher, and its parked keys.
pub(super) struct Failing {
    pub(super) handling: Handling,
    /// Park a key behind a record given up on (`Parallel::park_keys`).
    pub(super) park: bool,
    /// Parked keys: the record that parked each, and whether its entry was handed to the
    /// watermark (or read from the row): from then on, an entry neither waiting to be written
    /// nor in the row was unparked by a redrive.
    parked: HashMap<u64, (ExtendedSequenceNumber, bool)>,
    /// Keys whose redrive runs or waits for the key's running record to end.
    replaying: HashSet<u64>,
    /// Redrives waiting for their key's running record to end.
    pending: HashMap<u64, Request>,
}

impl Failing {
    /// Failure handling as `handling` says; `parked`: the lease row's parked-key entries.
    pub(super) fn new(handling: Handling, park: bool, parked: &[String]) -> Self {
        let parked = parked
            .iter()
            .filter_map(|entry| match parse_entry(entry) {
                Some(Entry::Park(key, behind)) => Some((key, (behind, true))),
                // A redrive's request: looked at while the dispatcher runs.
                Some(Entry::Redrive { .. }) => None,
                None => {
                    tracing::warn!(entry, "ignoring a malformed parked-key entry of the lease");
                    None
                }
            })
            .collect();
        let failing = Self {
            handling,
            park,
            parked,
            replaying: HashSet::new(),
            pending: HashMap::new(),
        };
        failing.gauge();
        failing
    }

    /// The record that parked `key`, if `job`'s record comes after it and the key is parked,
    /// as far as the lease row `job`'s record came under says: a key whose entry left the row
    /// (`admin::unpark`) runs again. The parking record itself, and a record before it
    /// (replayed after a crash that came before the checkpoint passed them), are not parked
    /// behind it: they run.
    fn parked_behind(&mut self, key: u64, job: &Job) -> Option<ExtendedSequenceNumber> {
        if mutation::on(Mutation::ParkedKeyRuns) {
            return None;
        }
        let (behind, handed) = self.parked.get(&key)?;
        if !comes_after(&job.record.position(), behind) {
            return None;
        }
        let prefix = format!("{key:016x}/");
        if *handed && job.ack.parks(&prefix) == Some(false) {
            tracing::info!(key = %prefix.trim_end_matches('/'), "a parked key was unparked");
            self.parked.remove(&key);
            self.gauge();
            return None;
        }
        Some(behind.clone())
    }

    /// The redrives the row asks for now, one per key (the lowest count if a crash left two),
    /// that are not under way yet.
    fn requests(&self) -> Vec<(u64, Request)> {
        let row = self.handling.origin().row.as_ref();
        let Some(entries) = row.and_then(|row| row.entries()) else {
            return Vec::new();
        };
        let mut requests: BTreeMap<u64, Request> = BTreeMap::new();
        for entry in entries {
            if let Some(Entry::Redrive {
                key,
                letters,
                shards,
            }) = parse_entry(&entry)
                && !self.replaying.contains(&key)
                && requests.get(&key).is_none_or(|r| letters < r.letters)
            {
                let request = Request {
                    entry,
                    letters,
                    shards,
                };
                requests.insert(key, request);
            }
        }
        requests.into_iter().collect()
    }

    fn gauge(&self) {
        #[allow(clippy::cast_precision_loss)]
        let parked = self.parked.len() as f64;
        let shard = self.handling.shard().to_owned();
        ::metrics::gauge!(crate::metrics::PARKED_KEYS, "shard" => shard).set(parked);
        self.handling.parked_keys(self.parked.len());
    }
}

/// Whether the record at `position` comes after `behind`, the record that parked its key:
/// only such a record is parked behind it.
fn comes_after(position: &ExtendedSequenceNumber, behind: &ExtendedSequenceNumber) -> bool {
    position > behind || mutation::on(Mutation::ParkedMatchIgnoresPosition)
}

/// Runs records as they come until the processor drops its sender; see the module docs.
pub(super) async fn run<H: Work>(
    mut rx: mpsc::UnboundedReceiver<(Record, Ack)>,
    (handler, done): (Arc<H>, Done<H::Output>),
    max_in_flight: usize,
    key: KeyFn,
    failing: Option<Failing>,
) {
    // How often the row is looked at for a redrive's request, while keys are parked.
    let poll = failing.as_ref().map(|f| f.handling.origin().poll);
    let mut look = tokio::time::interval(poll.unwrap_or(Duration::from_secs(3600)));
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut d = Dispatcher {
        handler,
        done,
        max_in_flight,
        failing,
        keys: Keys::default(),
        running: JoinSet::new(),
        resting: JoinSet::new(),
        failed: false,
    };
    loop {
        d.start_ready();
        let watching = d.failing.as_ref().is_some_and(|f| !f.parked.is_empty());
        // Biased (finished runs first, at most max_in_flight of them): the same schedule
        // makes the same choices, which a simulated seed's replay relies on.
        tokio::select! {
            biased;
            Some(joined) = d.running.join_next(), if !d.running.is_empty() => match joined {
                Ok((key, ran)) => d.ran(key, ran),
                Err(_) => d.failed = true,
            },
            Some(joined) = d.resting.join_next(), if !d.resting.is_empty() => {
                if let Ok((key, job)) = joined {
                    d.keys.again(key, job);
                }
            }
            // Before new records: a new dispatcher (a restart, an outage's) looks at once,
            // and holds a key to replay before any record of it starts.
            _ = look.tick(), if watching => d.look_for_requests(),
            received = rx.recv() => match received {
                Some((record, ack)) => d.keys.push(&key, record, ack),
                None => return,
            },
        }
    }
}

/// One shard's dispatcher: the records waiting by key, running, and resting.
struct Dispatcher<H: Work> {
    handler: Arc<H>,
    /// Where a success goes: its `Ack` done, or its outputs to the committer.
    done: Done<H::Output>,
    max_in_flight: usize,
    failing: Option<Failing>,
    keys: Keys,
    running: JoinSet<(u64, Ran)>,
    /// Failed records waiting for their backoff, outside the `max_in_flight` slots.
    resting: JoinSet<(u64, Job)>,
    /// A record failed for good: nothing more starts (the shard restarts).
    failed: bool,
}

impl<H: Work> Dispatcher<H> {
    /// Starts ready records while there is room: each runs, or is given up behind its
    /// parked key.
    fn start_ready(&mut self) {
        while !self.failed && self.running.len() < self.max_in_flight {
            let Some((key, job)) = self.keys.next() else {
                break;
            };
            let parked = self.failing.as_mut().filter(|_| job.unkeyed.is_none());
            let parked =
                parked.and_then(|f| Some((f.parked_behind(key, &job)?, f.handling.clone())));
            let work = match (parked, job.unkeyed.clone()) {
                // In an outage a parked key's record waits with the rest (the shard restarts
                // from the watermark): parking goes on once a record succeeds. (It does not
                // count toward the run: a parked key's traffic alone is no outage.)
                (Some((_, handling)), _) if handling.in_outage() => {
                    job.ack
                        .fail("an outage: a parked key's record waits with the rest");
                    std::future::ready(Ran::Stopped).boxed()
                }
                (Some((behind, handling)), _) => {
                    let reason = Reason::Parked { behind };
                    give_up(handling, job, reason, Some(key), self.done.clone()).boxed()
                }
                (None, Some(why)) => {
                    let error = Permanent::new(format!("key_by panicked: {why}"));
                    std::future::ready(Ran::Failed(Box::new(job), error.into())).boxed()
                }
                (None, None) => attempt(self.handler.clone(), self.done.clone(), job).boxed(),
            };
            let work = work.map(move |ran| (key, ran));
            crate::task::spawn_in(&mut self.running, work.in_current_span());
        }
    }

    /// Starts the redrives the row asks for: each at once if its key is idle, else once the
    /// key's running record ends (its later records wait meanwhile).
    fn look_for_requests(&mut self) {
        let Some(requests) = self.failing.as_ref().map(Failing::requests) else {
            return;
        };
        for (key, request) in requests {
            let Some(failing) = self.failing.as_mut() else {
                return;
            };
            failing.replaying.insert(key);
            if self.keys.hold(key) {
                if mutation::on(Mutation::ReplayWithoutHold) {
                    self.keys.finished(key);
                }
                self.start_replay(key, request);
            } else {
                failing.pending.insert(key, request);
            }
        }
    }

    /// Replays `key`'s letters, the key held meanwhile.
    fn start_replay(&mut self, key: u64, request: Request) {
        let Some(failing) = &self.failing else {
            return;
        };
        let origin = failing.handling.origin();
        let Some(row) = origin.row.clone() else {
            return;
        };
        let replay = Replay {
            handler: self.handler.clone(),
            handling: failing.handling.clone(),
            reader: origin.letters.as_ref().and_then(|l| l.reader.clone()),
            row,
            poll: origin.poll,
        };
        let work = replay
            .run(key, request)
            .map(move |r| (key, Ran::Replayed(r)));
        crate::task::spawn_in(&mut self.running, work.in_current_span());
    }

    /// `key`'s running record (or replay) ended: a redrive waiting for it starts, else the
    /// key's next record is ready.
    fn finish(&mut self, key: u64) {
        let pending = self.failing.as_mut().and_then(|f| f.pending.remove(&key));
        match pending {
            Some(request) if !self.failed => self.start_replay(key, request),
            _ => self.keys.finished(key),
        }
    }

    /// A run of `key`'s record ended as `ran`.
    fn ran(&mut self, key: u64, ran: Ran) {
        match ran {
            Ran::Replayed(replayed) => {
                if let Some(failing) = self.failing.as_mut() {
                    failing.replaying.remove(&key);
                    if replayed == Replayed::Unparked {
                        failing.parked.remove(&key);
                        failing.gauge();
                    }
                }
                if replayed == Replayed::Lost {
                    self.failed = true;
                }
                self.finish(key);
            }
            Ran::Done => {
                if let Some(failing) = &self.failing {
                    failing.handling.succeeded();
                }
                self.finish(key);
            }
            Ran::GivenUp => self.finish(key),
            Ran::Parked => {
                if let Some((_, handed)) =
                    self.failing.as_mut().and_then(|f| f.parked.get_mut(&key))
                {
                    *handed = true;
                }
                self.finish(key);
            }
            Ran::Failed(job, error) => match decide(self.failing.as_mut(), key, job, error) {
                Decided::Rest(wait, job) => {
                    let rest = async move {
                        tokio::time::sleep(wait).await;
                        (key, *job)
                    };
                    crate::task::spawn_in(&mut self.resting, rest.in_current_span());
                }
                Decided::GiveUp(given, parks) => {
                    let (handling, job, reason) = *given;
                    let parks = parks.then_some(key);
                    let work = give_up(handling, job, reason, parks, self.done.clone());
                    let work = work.map(move |ran| (key, ran));
                    crate::task::spawn_in(&mut self.running, work.in_current_span());
                }
                Decided::Stop => {
                    // Nothing more starts: the shard restarts from the watermark, and no
                    // later record of the key may finish before it.
                    self.failed = true;
                    self.finish(key);
                }
            },
            Ran::Stopped => {
                self.failed = true;
                self.finish(key);
            }
        }
    }
}

/// What the policy decided for a failed record.
enum Decided {
    /// It rests this long, then runs again.
    Rest(std::time::Duration, Box<Job>),
    /// It is given up on (and parks its key, if true).
    GiveUp(Box<(Handling, Job, Reason)>, bool),
    /// The shard restarts (no policy, or one that blocks): its `Ack` failed.
    Stop,
}

fn decide(failing: Option<&mut Failing>, key: u64, mut job: Box<Job>, error: BoxError) -> Decided {
    let Some(failing) = failing else {
        job.ack.fail(error);
        return Decided::Stop;
    };
    match job
        .tries
        .failed(&failing.handling.policy, &job.record, &error)
    {
        Next::Retry(wait) => {
            failing.handling.retrying(&job.record, &job.tries, wait);
            Decided::Rest(wait, job)
        }
        Next::GiveUp(_) if !failing.handling.may_give_up() => {
            // An outage: the record blocks (the shard restarts from the watermark).
            job.ack.fail(error);
            Decided::Stop
        }
        Next::GiveUp(reason) => {
            let park = failing.park && job.unkeyed.is_none();
            if park {
                failing.parked.insert(key, (job.record.position(), false));
                failing.gauge();
            }
            Decided::GiveUp(Box::new((failing.handling.clone(), *job, reason)), park)
        }
        Next::Block => {
            job.ack.fail(error);
            Decided::Stop
        }
    }
}

/// One run of the handler on a record. A panic fails the record like an error, whether it
/// comes while the handler builds its future (work before its `async` block) or while the
/// future runs.
async fn attempt<H: Work>(handler: Arc<H>, done: Done<H::Output>, job: Job) -> Ran {
    let record = job.record.clone();
    let built = std::panic::catch_unwind(AssertUnwindSafe(|| handler.run(record)));
    let outcome = match built {
        Ok(handle) => {
            let handle = AssertUnwindSafe(handle).catch_unwind();
            // Fencing in time, as for hooks: dropped at the lease's validity.
            let Some(outcome) = job.ack.while_valid(handle).await else {
                return Ran::Stopped;
            };
            outcome
        }
        Err(panic) => Err(panic),
    };
    match outcome {
        Ok(Ok(output)) => {
            // Finished, or computed: finished once its outputs committed.
            done(job.record.position(), Some(output), job.ack);
            Ran::Done
        }
        Ok(Err(error)) => Ran::Failed(Box::new(job), error),
        Err(panic) => {
            let message = crate::task::panic_message(&*panic);
            Ran::Failed(
                Box::new(job),
                format!("record handler panicked: {message}").into(),
            )
        }
    }
}

/// Gives a record up as the policy says; its `Ack` is done once that is over (the sink took
/// it), so the checkpoint passes it only then (with outputs, once a commit covers it).
async fn give_up<O>(
    handling: Handling,
    job: Job,
    reason: Reason,
    parks: Option<u64>,
    done: Done<O>,
) -> Ran {
    let parked = matches!(reason, Reason::Parked { .. });
    let position = job.record.position();
    // The record that parks its key writes the entry with the checkpoint that passes it.
    let entry = parks
        .filter(|_| !parked)
        .map(|key| park_entry(key, &job.record.position()));
    let mut letter = handling.letter(job.record, &job.tries, reason);
    letter.parked_key = parks.map(|key| format!("{key:016x}"));
    if parked {
        letter.last_error = format!("not run: {}", letter.reason);
        letter.first_error.clone_from(&letter.last_error);
    }
    match job.ack.while_valid(handling.give_up(letter)).await {
        Some(Ok(())) => match entry {
            Some(entry) => {
                job.ack.done_parking(entry);
                Ran::Parked
            }
            None => {
                done(position, None, job.ack);
                Ran::GivenUp
            }
        },
        Some(Err(error)) => {
            job.ack.fail(error);
            Ran::Stopped
        }
        None => Ran::Stopped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::SequenceNumber;

    fn at(sequence: u128, sub_sequence: u64) -> ExtendedSequenceNumber {
        ExtendedSequenceNumber {
            sequence: SequenceNumber::from(sequence),
            sub_sequence,
        }
    }

    #[test]
    fn only_records_after_the_one_that_parked_a_key_are_parked_behind_it() {
        crate::mutation::set_from_env();
        let behind = at(50, 1);
        assert!(comes_after(&at(51, 0), &behind));
        assert!(comes_after(&at(50, 2), &behind));
        // The parking record itself, and one before it replayed after a crash, run.
        assert!(!comes_after(&at(50, 1), &behind));
        assert!(!comes_after(&at(50, 0), &behind));
        assert!(!comes_after(&at(49, 7), &behind));
    }
}
