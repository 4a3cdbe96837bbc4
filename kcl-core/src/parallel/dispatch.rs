//! The dispatcher: which record runs next.
//!
//! Records wait in one queue per key. A key is *ready* when it has a record waiting and none
//! running; ready keys start in the order their first waiting record was delivered, so the
//! oldest record that may run runs first and the watermark moves as early as it can.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt as _;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument as _;

use super::{KeyFn, RecordHandler};
use crate::ack::Ack;
use crate::mutation::{self, Mutation};
use crate::types::Record;

/// A record waiting for its turn: its delivery order, the record, its acknowledgement.
type Waiting = (u64, Record, Ack);

/// Runs records as they come until the processor drops its sender; see the module docs.
pub(super) async fn run<H: RecordHandler>(
    mut rx: mpsc::UnboundedReceiver<(Record, Ack)>,
    handler: Arc<H>,
    max_in_flight: usize,
    key: KeyFn,
) {
    let mut keys = Keys::default();
    let mut running: JoinSet<(u64, bool)> = JoinSet::new();
    let mut failed = false;
    loop {
        while !failed && running.len() < max_in_flight {
            let Some((key, record, ack)) = keys.next() else {
                break;
            };
            let handler = handler.clone();
            let work = async move {
                let handle = AssertUnwindSafe(handler.handle(record)).catch_unwind();
                // Fencing in time, as for hooks: dropped at the lease's validity.
                let Some(outcome) = ack.while_valid(handle).await else {
                    return (key, false);
                };
                match outcome {
                    Ok(Ok(())) => {
                        ack.done();
                        (key, true)
                    }
                    Ok(Err(error)) => {
                        ack.fail(error);
                        (key, false)
                    }
                    Err(panic) => {
                        ack.fail(format!(
                            "record handler panicked: {}",
                            crate::task::panic_message(&*panic)
                        ));
                        (key, false)
                    }
                }
            };
            crate::task::spawn_in(&mut running, work.in_current_span());
        }
        // Biased (finished runs first, at most max_in_flight of them): the same schedule
        // makes the same choices, which a simulated seed's replay relies on.
        tokio::select! {
            biased;
            Some(joined) = running.join_next(), if !running.is_empty() => match joined {
                Ok((key, ok)) => {
                    // After a failure nothing more starts: the shard restarts from the
                    // watermark, and no later record of the key may finish before it.
                    failed |= !ok;
                    keys.finished(key);
                }
                Err(_) => failed = true,
            },
            received = rx.recv() => match received {
                Some((record, ack)) => keys.push(key(&record), record, ack),
                None => return,
            },
        }
    }
}

/// The waiting records, by key.
#[derive(Default)]
struct Keys {
    waiting: HashMap<u64, VecDeque<Waiting>>,
    /// Keys with a record waiting and none running, by the delivery order of that record.
    ready: BTreeMap<u64, u64>,
    running: HashSet<u64>,
    delivered: u64,
}

impl Keys {
    fn push(&mut self, key: u64, record: Record, ack: Ack) {
        let order = self.delivered;
        self.delivered += 1;
        let queue = self.waiting.entry(key).or_default();
        if queue.is_empty() && !self.running.contains(&key) {
            self.ready.insert(order, key);
        }
        queue.push_back((order, record, ack));
    }

    /// The next record to run, marking its key running.
    fn next(&mut self) -> Option<(u64, Record, Ack)> {
        let (_, key) = if mutation::on(Mutation::ReadyKeysNewestFirst) {
            self.ready.pop_last()?
        } else {
            self.ready.pop_first()?
        };
        let queue = self.waiting.get_mut(&key)?;
        let (_, record, ack) = queue.pop_front()?;
        if mutation::on(Mutation::KeysOverlap) {
            // The bug: the key's next record is ready at once.
            if let Some((order, ..)) = queue.front() {
                self.ready.insert(*order, key);
            }
        } else {
            self.running.insert(key);
        }
        if queue.is_empty() {
            self.waiting.remove(&key);
        }
        Some((key, record, ack))
    }

    /// `key`'s running record finished: its next one, if any, is ready.
    fn finished(&mut self, key: u64) {
        self.running.remove(&key);
        if let Some((order, ..)) = self.waiting.get(&key).and_then(VecDeque::front)
            && !self.running.contains(&key)
        {
            self.ready.insert(*order, key);
        }
    }
}
