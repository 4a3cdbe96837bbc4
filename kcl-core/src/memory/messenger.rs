//! [`MemoryMessenger`]: singleton messages between the workers of one process, through the
//! fault injector, for tests and the simulation.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use futures_util::future::BoxFuture;

use super::faults::{Fate, Faults};
use crate::singleton::{Inboxes, Messenger, Refusal};

/// Called with (address, singleton, message) for every message put in an inbox.
pub type DeliveryHook = Arc<dyn Fn(&str, &str, &Bytes) + Send + Sync>;

/// Every messenger of a simulated fleet, by address. Clones share it.
#[derive(Clone, Default)]
pub struct MemoryNetwork {
    by_address: Arc<Mutex<BTreeMap<String, Inboxes>>>,
    hook: Option<DeliveryHook>,
}

impl std::fmt::Debug for MemoryNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryNetwork").finish_non_exhaustive()
    }
}

impl MemoryNetwork {
    /// A network whose every delivery is also reported to `hook` (a test's ledger).
    #[must_use]
    pub fn with_hook(hook: DeliveryHook) -> Self {
        Self {
            by_address: Arc::default(),
            hook: Some(hook),
        }
    }

    /// A messenger at `address` (use the worker id: faults aimed at that client also hit
    /// its messages: a frozen process takes none until it resumes).
    pub fn messenger(&self, address: &str, faults: Faults) -> MemoryMessenger {
        let inboxes = Inboxes::default();
        self.by_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(address.to_owned(), inboxes.clone());
        MemoryMessenger {
            network: self.clone(),
            address: address.to_owned(),
            inboxes,
            faults,
        }
    }
}

/// One process's messenger on a [`MemoryNetwork`].
#[derive(Debug, Clone)]
pub struct MemoryMessenger {
    network: MemoryNetwork,
    address: String,
    inboxes: Inboxes,
    faults: Faults,
}

impl Messenger for MemoryMessenger {
    fn address(&self) -> Option<String> {
        Some(self.address.clone())
    }

    fn inboxes(&self) -> &Inboxes {
        &self.inboxes
    }

    fn send<'a>(
        &'a self,
        address: &'a str,
        name: &'a str,
        message: Bytes,
    ) -> BoxFuture<'a, Result<(), Refusal>> {
        Box::pin(async move {
            // The sender's side of the network: errors, latency, lost replies.
            let fate = self
                .faults
                .enter(&self.address, "send", true)
                .await
                .map_err(|e| Refusal::Unreachable(e.to_string()))?;
            // A frozen receiver takes nothing until it resumes (and by then its lease may
            // have run out).
            self.faults.wait_while_paused(address).await;
            let inboxes = self
                .network
                .by_address
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(address)
                .cloned()
                .ok_or_else(|| Refusal::Unreachable(format!("no process at {address}")))?;
            inboxes.deliver(name, message.clone())?;
            if let Some(hook) = &self.network.hook {
                hook(address, name, &message);
            }
            match fate {
                Fate::Apply => Ok(()),
                _ => Err(Refusal::Unreachable("injected: the reply was lost".into())),
            }
        })
    }
}
