//! Whole-process freezes: what SIGSTOP, a long GC pause or a VM suspend do to a worker.
//!
//! A future run with [`Faults::run_as`] belongs to a simulated process named after a client.
//! While that client is [paused](Faults::pause), the future is not polled at all, and neither
//! is any task the worker spawns from it (the worker spawns through `crate::task`, which
//! hands the process on). Time keeps going: timers that fall due meanwhile fire at resume,
//! and the worker carries on with the state it had, as a thawed process does.

use std::future::Future;
use std::sync::Arc;
use std::task::Waker;

use super::Faults;
use crate::task::{self, Freeze};

/// One simulated process: the faults that can freeze it, and its client name.
#[derive(Debug)]
struct Process {
    faults: Faults,
    client: Arc<str>,
}

impl Freeze for Process {
    fn hold(&self, waker: &Waker) -> bool {
        self.faults.hold_if_paused(&self.client, waker)
    }
}

impl Faults {
    /// Runs `future` as the process `client` (use the worker id): while `client` is
    /// [paused](Self::pause), neither it nor any task the worker spawns from it runs.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use kcl_core::memory::{Faults, MemoryLeaseStore, MemoryStream};
    /// use kcl_core::{ShardId, Worker, WorkerConfig};
    /// # struct P;
    /// # impl kcl_core::RecordProcessor for P {
    /// #     async fn process_records(&mut self, _: kcl_core::ProcessRecordsInput<'_>, _: &mut kcl_core::Checkpointer) -> Result<(), kcl_core::BoxError> { Ok(()) }
    /// # }
    /// let faults = Faults::seeded(7);
    /// let stream = MemoryStream::with_faults(2, faults.clone());
    /// let store = MemoryLeaseStore::with_faults(faults.clone());
    /// let worker = Worker::new("w1", WorkerConfig::default(), stream.client("w1"), store.client("w1"), |_: &ShardId| P)?;
    /// let running = tokio::spawn(faults.run_as("w1", worker.run()));
    /// faults.pause("w1"); // the whole worker stops, timers and all
    /// faults.resume("w1"); // and goes on with the state it had
    /// # running.abort();
    /// # Ok(())
    /// # }
    /// ```
    pub fn run_as<F: Future>(
        &self,
        client: &str,
        future: F,
    ) -> impl Future<Output = F::Output> + use<F> {
        let process = Process {
            faults: self.clone(),
            client: Arc::from(client),
        };
        task::run_in(Arc::new(process), future)
    }
}
