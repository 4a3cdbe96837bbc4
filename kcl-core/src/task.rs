//! How the worker runs its work: spawned tasks and bounded backend calls.
//!
//! Every task the worker starts (shard consumers, their renewers and fetch loops) is spawned
//! here, so that with feature `test-util` a simulated process freeze
//! ([`Faults::pause`](crate::memory::Faults::pause)) stops all of one worker's tasks and
//! timers at once, as SIGSTOP or a VM suspend would. Every backend call is bounded here too:
//! a call that hangs must never hang the worker.

use std::future::Future;
use std::time::Duration;

use tokio::task::{AbortHandle, JoinHandle, JoinSet};

use crate::error::{BackendError, ErrorKind};

#[cfg(feature = "test-util")]
use self::process::current_process;
#[cfg(feature = "test-util")]
pub(crate) use self::process::{Freeze, run_in};

/// Simulated processes (feature `test-util`): a future run in one is not polled while the
/// process is frozen, nor is any task spawned from it (see `memory`'s `Faults::run_as`).
#[cfg(feature = "test-util")]
mod process {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    /// What may freeze a simulated process.
    pub(crate) trait Freeze: Send + Sync + std::fmt::Debug {
        /// True while the process is frozen: `waker` is woken when it resumes.
        fn hold(&self, waker: &Waker) -> bool;
    }

    tokio::task_local! {
        static PROCESS: Arc<dyn Freeze>;
    }

    /// The process the current task belongs to, if any.
    pub(super) fn current_process() -> Option<Arc<dyn Freeze>> {
        PROCESS.try_with(Clone::clone).ok()
    }

    /// Runs `future` in `process`: not polled while it is frozen; tasks spawned from it
    /// (through this module) belong to it too.
    pub(crate) fn run_in<F: Future>(
        process: Arc<dyn Freeze>,
        future: F,
    ) -> impl Future<Output = F::Output> {
        let frozen = Frozen {
            process: process.clone(),
            inner: Box::pin(future),
        };
        PROCESS.scope(process, frozen)
    }

    struct Frozen<F> {
        process: Arc<dyn Freeze>,
        inner: Pin<Box<F>>,
    }

    impl<F: Future> Future for Frozen<F> {
        type Output = F::Output;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            let this = self.get_mut();
            if this.process.hold(cx.waker()) {
                return Poll::Pending;
            }
            this.inner.as_mut().poll(cx)
        }
    }
}

/// The message of a caught panic, for the error that reports it.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".to_owned())
}

/// Spawns a task of this worker.
pub(crate) fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    #[cfg(feature = "test-util")]
    if let Some(process) = current_process() {
        return tokio::spawn(run_in(process, future));
    }
    tokio::spawn(future)
}

/// Spawns a task of this worker into `set`.
pub(crate) fn spawn_in<T, F>(set: &mut JoinSet<T>, future: F) -> AbortHandle
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    #[cfg(feature = "test-util")]
    if let Some(process) = current_process() {
        return set.spawn(run_in(process, future));
    }
    set.spawn(future)
}

/// Runs one backend call, giving up after `limit`: a call that has not answered by then
/// fails as `Retryable` (it may or may not have been applied).
///
/// The call is boxed here, before anything awaits it: a backend call's future (an SDK
/// request) is several KiB, and held inline it would make every task that ever awaits one
/// that large for its whole life. Boxed, the memory is taken only while the call is in
/// flight (one allocation a call). Not an `async fn`, whose state would hold `call` unboxed.
pub(crate) fn bounded<T, F>(
    limit: Duration,
    operation: &'static str,
    call: F,
) -> impl Future<Output = Result<T, BackendError>> + use<T, F>
where
    F: Future<Output = Result<T, BackendError>>,
{
    let call = Box::pin(call);
    async move {
        match tokio::time::timeout(limit, call).await {
            Ok(result) => result,
            Err(_) => Err(BackendError::new(
                ErrorKind::Retryable,
                operation,
                format!("no answer within {limit:?}"),
            )),
        }
    }
}
