//! Stopping a worker: the handle, running until a future or a signal, and the signals.
//!
//! Kubernetes and ECS stop a container with SIGTERM and kill it after a grace period (30 s
//! by default); a terminal sends SIGINT. A worker that does not listen for SIGTERM dies
//! holding every lease, and the fleet waits the failover time for each. So the ready-made
//! way to run a worker, [`Worker::run_until_signal`], listens for both: the first asks for a
//! graceful shutdown (processors checkpoint, leases are released so that others take them at
//! once), a second forces it. [`Worker::run_until`] takes any other future, such as a
//! `CancellationToken`'s `cancelled()` when the worker is part of a larger service.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use super::Worker;
use crate::error::Error;
use crate::lease::LeaseStore;
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;

/// Stops a running [`Worker`]; cheap to clone, usable from any task or from a processor.
#[derive(Debug, Clone, Default)]
pub struct ShutdownHandle {
    pub(super) graceful: CancellationToken,
    pub(super) force: CancellationToken,
    /// Cancelled by [`drain`](Self::drain): leases are released whatever `restart_grace` says.
    pub(super) release: CancellationToken,
}

impl ShutdownHandle {
    /// Graceful shutdown: stop taking leases, let processors checkpoint in
    /// `shutdown_requested`, release every lease so others take them at once (under
    /// [`WorkerConfig::restart_grace`](crate::WorkerConfig::restart_grace), keep them for
    /// this worker's return instead).
    pub fn shutdown(&self) {
        self.graceful.cancel();
    }

    /// Graceful shutdown for a worker that leaves the fleet for good (a scale-in): as
    /// [`shutdown`](Self::shutdown), but every lease is released for others to take at once
    /// even under [`WorkerConfig::restart_grace`](crate::WorkerConfig::restart_grace), whose
    /// leases would otherwise wait for a return that will not come.
    pub fn drain(&self) {
        self.release.cancel();
        self.graceful.cancel();
    }

    /// True once [`drain`](Self::drain) was asked for.
    pub fn is_draining(&self) -> bool {
        self.release.is_cancelled()
    }

    /// Stops what graceful shutdown has not finished yet (e.g. on a second signal): `run`
    /// returns at once, leaving unreleased leases to expire.
    pub fn force(&self) {
        self.graceful.cancel();
        self.force.cancel();
    }

    /// True once shutdown was asked for.
    pub fn is_shutdown(&self) -> bool {
        self.graceful.is_cancelled()
    }

    /// Completes once shutdown was asked for, or the worker's `run` returned.
    pub async fn requested(&self) {
        self.graceful.cancelled().await;
    }

    /// A token cancelled when the worker shuts down, whatever the cause: a signal under
    /// [`Worker::run_until_signal`], [`shutdown`](Self::shutdown), or `run` returning with an
    /// error. Hand it to what must stop with the worker, such as
    /// [`Singleton::run`](crate::singleton::Singleton::run), so that a process whose worker
    /// stopped does not stay on as a singleton candidate. Cancelling the token itself does
    /// not stop the worker (it is a child token).
    ///
    /// ```no_run
    /// # async fn demo<S: kcl_core::ShardSource, L: kcl_core::LeaseStore, F: kcl_core::ProcessorFactory>(
    /// #     worker: kcl_core::Worker<S, L, F>,
    /// #     summary: kcl_core::singleton::Singleton<L>,
    /// # ) -> Result<(), kcl_core::Error> {
    /// let stop = worker.shutdown_handle().token();
    /// let job = summary.run(stop, |lost| async move { lost.cancelled().await });
    /// let (worked, ran) = tokio::join!(worker.run_until_signal(), job);
    /// worked.and(ran)
    /// # }
    /// ```
    pub fn token(&self) -> CancellationToken {
        self.graceful.child_token()
    }
}

impl<S: ShardSource, L: LeaseStore, F: ProcessorFactory> Worker<S, L, F> {
    /// Runs until `shutdown` completes, then shuts down gracefully and returns when the
    /// leases are handed back (or `shutdown_timeout` passed). For example
    /// `worker.run_until(token.cancelled())` with a `tokio_util` `CancellationToken` that
    /// the rest of a service shares.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let handle = self.shutdown_handle();
        let ask = async move {
            shutdown.await;
            tracing::info!("shutting down: processors checkpoint and leases are handed back");
            handle.shutdown();
            std::future::pending::<()>().await;
        };
        tokio::select! {
            biased;
            result = self.run() => result,
            () = ask => Ok(()),
        }
    }

    /// Runs until SIGTERM or SIGINT (Ctrl-C), then shuts down gracefully; a second signal
    /// forces the shutdown (leases not yet released then expire after the failover time).
    /// What a service on Kubernetes, ECS or systemd wants.
    pub async fn run_until_signal(self) -> Result<(), Error> {
        let handle = self.shutdown_handle();
        let mut signals = Signals::new();
        let listen = async move {
            let first = signals.recv().await;
            tracing::info!(
                signal = first,
                "shutting down: processors checkpoint and leases are handed back; signal again to force"
            );
            handle.shutdown();
            let second = signals.recv().await;
            tracing::warn!(signal = second, "forcing shutdown");
            handle.force();
            std::future::pending::<()>().await;
        };
        tokio::select! {
            biased;
            result = self.run() => result,
            () = listen => Ok(()),
        }
    }
}

/// SIGTERM and SIGINT, listened for from creation on so that none is missed in between (on
/// other platforms than Unix, Ctrl-C only).
///
/// ```no_run
/// # async fn demo() {
/// let mut signals = kcl_core::Signals::new();
/// let name = signals.recv().await; // "SIGTERM" or "SIGINT"
/// # let _ = name;
/// # }
/// ```
#[derive(Debug)]
pub struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Starts listening. Must be called inside a tokio runtime.
    pub fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let term = signal(SignalKind::terminate())
                .map_err(|error| {
                    tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the worker");
                })
                .ok();
            Self { term }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// The next signal's name: `"SIGTERM"` or `"SIGINT"`.
    pub async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        if let Some(term) = &mut self.term {
            return tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
            };
        }
        let _ = tokio::signal::ctrl_c().await;
        "SIGINT"
    }
}

impl Default for Signals {
    fn default() -> Self {
        Self::new()
    }
}
