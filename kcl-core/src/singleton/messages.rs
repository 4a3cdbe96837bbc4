//! Sending to wherever a singleton runs.
//!
//! The holder of a singleton advertises, in the singleton's row, the address where its
//! process takes messages (its [`Messenger`]'s), and registers the running instance's inbox
//! there. [`SingletonHandle::send`] reads the row, sends to that address, and retries while
//! ownership moves, until a deadline.
//!
//! **The guarantee.** `send` returns `Ok` only once the message is in the inbox of the
//! instance that held the row at that instant: the receiving process accepts a message only
//! while the instance runs and its lease is valid (0.9 × the failover time after its last
//! successful renewal, so no other candidate can hold the row then). Each `Ok` is one
//! delivery, to one instance: `send` retries only after a clear refusal (nobody there, a full
//! inbox), never after an unclear answer, so it never delivers twice. An error with
//! `maybe_delivered` (a reply lost on the way back) may have reached an inbox; one without
//! did not. An application that retries after `maybe_delivered` may deliver twice: make
//! such messages idempotent. A message in the inbox of an instance
//! that stops before reading it is lost with the instance.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep};

use super::COORDINATION_PREFIX;
use crate::lease::LeaseStore;
use crate::task::bounded;
use crate::types::ShardId;

/// Why a message was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The singleton does not run at that address (any more).
    #[error("the singleton does not run there")]
    NotHere,
    /// The instance's inbox is full.
    #[error("the instance's inbox is full")]
    Busy,
    /// The receiving process refused the sender's credentials.
    #[error("not authorized")]
    Unauthorized,
    /// The message is larger than the receiving process takes.
    #[error("the message is too large")]
    TooLarge,
    /// The receiving process takes no more messages for now.
    #[error("rate limited")]
    RateLimited,
    /// No answer, or an answer that cannot be read: the message may have been delivered.
    #[error("unreachable: {0}")]
    Unreachable(String),
}

/// Carries messages between the processes of a fleet. kcl-core has an in-memory one
/// ([`memory::MemoryMessenger`](crate::memory::MemoryMessenger)); the example binary an HTTP
/// one with a shared secret.
pub trait Messenger: Send + Sync + 'static {
    /// Where this process takes messages, as other processes reach it; `None` if it takes
    /// none (then its singletons run without an inbox).
    fn address(&self) -> Option<String>;

    /// The inboxes of the instances running in this process: what the receiving side of an
    /// implementation delivers to.
    fn inboxes(&self) -> &Inboxes;

    /// Sends `message` for the singleton `name` to the process at `address`. `Ok` once the
    /// instance's inbox took it. Boxed, so that a singleton can hold any messenger.
    fn send<'a>(
        &'a self,
        address: &'a str,
        name: &'a str,
        message: Bytes,
    ) -> BoxFuture<'a, Result<(), Refusal>>;
}

/// The inboxes of the singleton instances running in one process, by singleton name.
#[derive(Debug, Clone, Default)]
pub struct Inboxes(Arc<Mutex<BTreeMap<String, Entry>>>);

#[derive(Clone)]
struct Entry {
    inbox: mpsc::Sender<Bytes>,
    /// Whether the instance may still take messages (its lease is valid).
    valid: Arc<dyn Fn() -> bool + Send + Sync>,
    id: u64,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Inboxes {
    /// Puts `message` in the inbox of the running instance of `name`, if there is one that
    /// may take it now.
    pub fn deliver(&self, name: &str, message: Bytes) -> Result<(), Refusal> {
        let entry = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
            .ok_or(Refusal::NotHere)?;
        if !(entry.valid)() {
            return Err(Refusal::NotHere);
        }
        entry.inbox.try_send(message).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Refusal::Busy,
            mpsc::error::TrySendError::Closed(_) => Refusal::NotHere,
        })
    }

    /// Routes messages for `name` to `inbox` while `valid` says so and the registration lives.
    pub(crate) fn register(
        &self,
        name: &str,
        inbox: mpsc::Sender<Bytes>,
        valid: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Registration {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned(), Entry { inbox, valid, id });
        Registration {
            inboxes: self.clone(),
            name: name.to_owned(),
            id,
        }
    }
}

/// Unregisters an instance's inbox when dropped.
#[derive(Debug)]
pub(crate) struct Registration {
    inboxes: Inboxes,
    name: String,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self
            .inboxes
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if map.get(&self.name).is_some_and(|e| e.id == self.id) {
            map.remove(&self.name);
        }
    }
}

/// Why [`SingletonHandle::send`] gave up.
#[derive(Debug, thiserror::Error)]
#[error("sending to singleton {name} gave up after {waited:?}: {last}")]
pub struct SendError {
    /// The singleton.
    pub name: String,
    /// How long it tried.
    pub waited: Duration,
    /// The last reason it could not deliver.
    pub last: String,
    /// True if the last attempt got no clear answer: the message may be in an inbox.
    pub maybe_delivered: bool,
}

/// Sends to a singleton from any process, wherever the singleton runs.
pub struct SingletonHandle<L> {
    name: String,
    key: ShardId,
    store: Arc<L>,
    messenger: Arc<dyn Messenger>,
    retry: Duration,
}

impl<L> std::fmt::Debug for SingletonHandle<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SingletonHandle")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<L: LeaseStore> SingletonHandle<L> {
    /// A handle on singleton `name` of the lease table `store`, sending through `messenger`
    /// and reading the row again every `retry` while ownership moves.
    pub fn new(name: &str, store: L, messenger: Arc<dyn Messenger>, retry: Duration) -> Self {
        Self {
            name: name.to_owned(),
            key: ShardId::new(format!("{COORDINATION_PREFIX}{name}")),
            store: Arc::new(store),
            messenger,
            retry,
        }
    }

    /// Delivers `message` to the running instance, retrying while there is none, it moves,
    /// or its inbox is full, until `deadline` has passed. It does not resend after an unclear
    /// answer (no reply, a broken connection): it returns an error with `maybe_delivered`,
    /// so that `Ok` means one delivery. See the module docs.
    pub async fn send(&self, message: Bytes, deadline: Duration) -> Result<(), SendError> {
        let started = Instant::now();
        let mut last = "no holder yet".to_owned();
        while started.elapsed() < deadline {
            let left = deadline.saturating_sub(started.elapsed());
            match bounded(left, "get", self.store.get(&self.key)).await {
                Ok(Some(row)) => match (&row.owner, &row.endpoint) {
                    (Some(_), Some(address)) => {
                        let sent = tokio::time::timeout(
                            left,
                            self.messenger.send(address, &self.name, message.clone()),
                        )
                        .await;
                        match sent {
                            Ok(Ok(())) => return Ok(()),
                            // Resending after an unclear answer could deliver twice.
                            Ok(Err(Refusal::Unreachable(why))) => {
                                return Err(self.error(started, &why, true));
                            }
                            Err(_) => {
                                return Err(self.error(
                                    started,
                                    "no answer before the deadline",
                                    true,
                                ));
                            }
                            Ok(Err(refusal @ (Refusal::Unauthorized | Refusal::TooLarge))) => {
                                return Err(self.error(started, &refusal.to_string(), false));
                            }
                            Ok(Err(refusal)) => last = refusal.to_string(),
                        }
                    }
                    (None, _) => last = "nobody holds it".to_owned(),
                    (Some(owner), None) => last = format!("{owner} holds it but takes no messages"),
                },
                Ok(None) => last = "no such singleton".to_owned(),
                Err(error) => last = error.to_string(),
            }
            let left = deadline.saturating_sub(started.elapsed());
            sleep(self.retry.min(left)).await;
        }
        Err(self.error(started, &last, false))
    }

    fn error(&self, started: Instant, last: &str, maybe_delivered: bool) -> SendError {
        SendError {
            name: self.name.clone(),
            waited: started.elapsed(),
            last: last.to_owned(),
            maybe_delivered,
        }
    }
}
