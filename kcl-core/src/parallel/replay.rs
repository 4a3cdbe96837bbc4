//! A parked key's letters replayed by its holder, before any later record of the key: the
//! holder's side of a redrive ([`failure::replay`](crate::failure) says why and how it is
//! asked). The dispatcher holds the key (its records wait) while this runs.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use tracing::Instrument as _;

use super::work::Work;
use crate::failure::{Handling, Kept, Next, Reader, Row, Tries, redrive_entry};
use crate::types::{ExtendedSequenceNumber, Record, ShardId};

/// Reads of the sink before a replay that finds fewer letters than the request counted gives
/// up (another reader may hold some for a while: SQS hides a message it handed out).
const LIST_ROUNDS: u32 = 5;

/// A holder's request to replay a parked key's letters, as its row holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Request {
    /// The entry itself, as written.
    pub(super) entry: String,
    /// Letters the redrive counted: at least these must be found.
    pub(super) letters: usize,
    /// The shards whose letters are this holder's to replay, ancestors first.
    pub(super) shards: Vec<ShardId>,
}

/// How a replay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Replayed {
    /// Every letter ran again and left the sink; the key is unparked.
    Unparked,
    /// It stopped (a letter failed again, the sink could not be read or written): the key
    /// stays parked, the letters from the one that stopped it on stay in the sink, and the
    /// request is dropped.
    Stopped,
    /// The lease's validity ended: the request stays for the next holder.
    Lost,
}

/// The shard's holder's side of the redrive of parked key `key`; see the module docs.
pub(super) struct Replay<H> {
    pub(super) handler: Arc<H>,
    pub(super) handling: Handling,
    pub(super) reader: Option<Reader>,
    pub(super) row: Arc<dyn Row>,
    /// How long to wait between reads of the sink.
    pub(super) poll: Duration,
}

impl<H: Work> Replay<H> {
    /// Replays the letters `request` names, within the lease's validity.
    pub(super) async fn run(self, key: u64, request: Request) -> Replayed {
        let hex = format!("{key:016x}");
        let span = tracing::info_span!("redrive", parked_key = %hex);
        if !self.handler.replays() {
            tracing::error!(
                parked_key = %hex,
                "a redrive of this parked key was asked, but this Parallel commits outputs \
                 with its checkpoints (with_outputs): a replayed letter is behind the \
                 checkpoint, so its outputs could not commit exactly once; the key stays \
                 parked (redrive its letters to the stream instead)"
            );
            self.drop_request(&request.entry).await;
            return Replayed::Stopped;
        }
        let Some(reader) = self.reader.clone() else {
            tracing::error!(
                parked_key = %hex,
                "a redrive of this parked key was asked, but the worker's DeadLetters has no \
                 reader (DeadLetters::reader; a Kinesis sink has none): the key stays parked"
            );
            self.drop_request(&request.entry).await;
            return Replayed::Stopped;
        };
        let mut done = None;
        let work = async {
            done = Some(self.replay(&*reader, &hex, &request).await);
        };
        let valid = self.row.while_valid(Box::pin(work.instrument(span))).await;
        match done {
            Some(replayed) if valid => replayed,
            _ => Replayed::Lost,
        }
    }

    async fn replay(
        &self,
        reader: &dyn crate::failure::AnyReader,
        hex: &str,
        request: &Request,
    ) -> Replayed {
        let Some(letters) = self.letters(reader, hex, request).await else {
            self.drop_request(&request.entry).await;
            return Replayed::Stopped;
        };
        tracing::info!(
            letters = letters.len(),
            "replaying a parked key's letters (a redrive)"
        );
        let mut entry = request.entry.clone();
        let mut left = request.letters;
        for copies in &letters {
            let record = copies[0].letter.record.clone();
            if !self.try_record(&record).await {
                tracing::error!(
                    sequence_number = %record.position(),
                    shard = %copies[0].letter.shard,
                    "a redriven letter failed again: the key stays parked behind it, and its \
                     letters from this one on stay in the sink"
                );
                self.drop_request(&entry).await;
                return Replayed::Stopped;
            }
            // The count first, then the letter: a crash between replays it again (at least
            // once), never counts a letter gone that is still kept.
            left = left.saturating_sub(1);
            let lower = redrive_entry(hex, left, &request.shards);
            if let Err(error) = self.row.replace(&entry, &lower).await {
                tracing::error!(%error, "the redrive's request could not be updated: stopped");
                return Replayed::Stopped;
            }
            entry = lower;
            for kept in copies {
                if let Err(error) = self.remove(reader, kept).await {
                    tracing::error!(%error, "a replayed letter could not be removed: stopped");
                    self.drop_request(&entry).await;
                    return Replayed::Stopped;
                }
            }
        }
        self.unpark(hex, &entry).await
    }

    /// The letters to replay, each with its copies, in order; `None` (logged) if fewer than
    /// counted are found after a few reads, or the sink cannot be read.
    async fn letters(
        &self,
        reader: &dyn crate::failure::AnyReader,
        hex: &str,
        request: &Request,
    ) -> Option<Vec<Vec<Kept>>> {
        let mut found = Vec::new();
        for round in 1..=LIST_ROUNDS {
            match reader.parked(hex).await {
                Ok(kept) => found = ordered(kept, &request.shards, self.application()),
                Err(error) => tracing::warn!(%error, "reading the parked key's letters failed"),
            }
            if found.len() >= request.letters {
                return Some(found);
            }
            if round < LIST_ROUNDS {
                tokio::time::sleep(self.poll).await;
            }
        }
        tracing::error!(
            found = found.len(),
            counted = request.letters,
            "the sink holds fewer of the parked key's letters than the redrive counted \
             (another reader may hold some): the key stays parked; redrive again"
        );
        None
    }

    /// The application this worker's letters name, if it names one.
    fn application(&self) -> Option<&str> {
        let letters = self.handling.origin().letters.as_ref()?;
        letters.application_name()
    }

    /// Removes a replayed letter, trying again a few times (another reader may hold it for a
    /// while), never running its record again.
    async fn remove(
        &self,
        reader: &dyn crate::failure::AnyReader,
        kept: &Kept,
    ) -> Result<(), crate::error::BackendError> {
        let mut wait = self.poll;
        for _ in 1..LIST_ROUNDS {
            match reader.remove(kept).await {
                Ok(()) => return Ok(()),
                Err(error) if error.kind().is_transient() => {
                    tracing::debug!(%error, "removing a replayed letter failed; trying again");
                    tokio::time::sleep(wait).await;
                    wait = wait.saturating_mul(2);
                }
                Err(error) => return Err(error),
            }
        }
        reader.remove(kept).await
    }

    /// Runs `record` with the policy's tries; `true` once it succeeded.
    async fn try_record(&self, record: &Record) -> bool {
        let mut tries = Tries::default();
        loop {
            let built =
                std::panic::catch_unwind(AssertUnwindSafe(|| self.handler.run(record.clone())));
            let outcome = match built {
                Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
                Err(panic) => Err(panic),
            };
            let error = match outcome {
                Ok(Ok(_)) => {
                    // A success like any other: an outage's run ends.
                    self.handling.succeeded();
                    return true;
                }
                Ok(Err(error)) => error,
                Err(panic) => {
                    let message = crate::task::panic_message(&*panic);
                    format!("record handler panicked: {message}").into()
                }
            };
            match tries.failed(&self.handling.policy, record, &error) {
                Next::Retry(wait) => {
                    self.handling.retrying(record, &tries, wait);
                    tokio::time::sleep(wait).await;
                }
                Next::GiveUp(_) | Next::Block => return false,
            }
        }
    }

    /// Removes every entry of the key from the row (its park entries and the request).
    async fn unpark(&self, hex: &str, entry: &str) -> Replayed {
        let prefix = format!("{hex}/");
        let mut entries: Vec<String> = (self.row.entries().unwrap_or_default().into_iter())
            .filter(|e| e.starts_with(&prefix))
            .collect();
        if !entries.iter().any(|e| e == entry) {
            entries.push(entry.to_owned());
        }
        match self.row.unpark(&entries).await {
            Ok(()) => {
                tracing::info!("a parked key's letters were replayed: the key runs again");
                Replayed::Unparked
            }
            Err(error) => {
                tracing::error!(%error, "the replayed key could not be unparked in its row");
                Replayed::Stopped
            }
        }
    }

    /// Removes the request (the key stays parked), best effort: a request left makes the
    /// holder try again at its next look.
    async fn drop_request(&self, entry: &str) {
        if let Err(error) = self.row.unpark(&[entry.to_owned()]).await {
            tracing::warn!(%error, "the redrive's request could not be removed");
        }
    }
}

/// The letters of `kept` read from `shards` (and of `application`, when both name one: two
/// applications may share a sink), one entry per letter (its copies together), in the
/// shards' order, then by position.
fn ordered(kept: Vec<Kept>, shards: &[ShardId], application: Option<&str>) -> Vec<Vec<Kept>> {
    let mut by_id: BTreeMap<(usize, ExtendedSequenceNumber), Vec<Kept>> = BTreeMap::new();
    for k in kept {
        let theirs = k.letter.application.as_deref();
        if matches!((application, theirs), (Some(a), Some(b)) if a != b) {
            continue;
        }
        if let Some(at) = shards.iter().position(|s| *s == k.letter.shard) {
            let id = (at, k.letter.record.position());
            by_id.entry(id).or_default().push(k);
        }
    }
    by_id.into_values().collect()
}
