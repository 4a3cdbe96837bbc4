//! What a singleton's task gets: its cancellation token, a fencing token, and a heartbeat.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::lease::tenure::Tenure;
pub use crate::types::FencingToken;

/// Handed to a singleton's task each time this candidate starts it.
#[derive(Clone)]
pub struct TaskContext {
    cancelled: CancellationToken,
    fence: FencingToken,
    beat: Arc<watch::Sender<Instant>>,
    inbox: Arc<Mutex<Option<mpsc::Receiver<Bytes>>>>,
    /// Health mode's timeout, if on.
    pub(crate) health: Option<Duration>,
    pub(crate) tenure: Arc<Tenure>,
}

impl fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskContext")
            .field("fence", &self.fence)
            .field("cancelled", &self.cancelled.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl TaskContext {
    pub(crate) fn new(
        tenure: Arc<Tenure>,
        fence: FencingToken,
        inbox: Option<mpsc::Receiver<Bytes>>,
        health: Option<Duration>,
    ) -> Self {
        Self {
            cancelled: CancellationToken::new(),
            fence,
            beat: Arc::new(watch::Sender::new(Instant::now())),
            inbox: Arc::new(Mutex::new(inbox)),
            health,
            tenure,
        }
    }

    /// The messages sent to this instance ([`SingletonHandle::send`](super::SingletonHandle::send)),
    /// if the singleton has a messenger; the first call takes the receiver, later ones get
    /// `None`. Messages are taken only while this instance runs and holds the row; what is
    /// left in the inbox when it stops is lost with it.
    pub fn inbox(&self) -> Option<mpsc::Receiver<Bytes>> {
        self.inbox
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Cancelled when the task must stop: shutdown, the lease at risk, or (health mode) no
    /// heartbeat in time. Return soon after; the task is dropped at its next `.await` once
    /// [`SingletonConfig::stop_timeout`](super::SingletonConfig::stop_timeout) has passed.
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancelled
    }

    /// This holder's fencing token (see [`FencingToken`]).
    pub fn fencing_token(&self) -> FencingToken {
        self.fence
    }

    /// The messages waiting in the inbox, taken without waiting (for a task that looks at
    /// its inbox now and then rather than awaiting it); empty without a messenger or once
    /// [`inbox`](Self::inbox) took the receiver.
    pub fn drain_inbox(&self) -> Vec<Bytes> {
        let mut inbox = self
            .inbox
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut messages = Vec::new();
        while let Some(Ok(message)) = inbox.as_mut().map(mpsc::Receiver::try_recv) {
            messages.push(message);
        }
        messages
    }

    /// Says the task is healthy. Under
    /// [`SingletonConfig::health_timeout`](super::SingletonConfig::health_timeout), a task
    /// that does not call this within the timeout (counted from its start, then from its last
    /// call) is cancelled, dropped, and handed to another candidate.
    pub fn heartbeat(&self) {
        self.beat.send_replace(Instant::now());
    }

    /// Resolves once no heartbeat came within the health timeout; never without one.
    pub(crate) async fn unhealthy(&self) {
        let Some(timeout) = self.health else {
            return std::future::pending().await;
        };
        let beats = self.beat.subscribe();
        loop {
            let deadline = *beats.borrow() + timeout;
            if Instant::now() >= deadline {
                return;
            }
            sleep_until(deadline).await;
        }
    }
}
