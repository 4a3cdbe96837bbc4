//! One child process per shard lease: [`ChildProcessor`] is a kcl [`RecordProcessor`] that
//! runs the application's `executableName` and speaks the protocol with it.
//!
//! Each hook is one exchange: a message written to the child's stdin, then lines read from its
//! stdout until the `status` that answers it, with every `checkpoint` on the way carried out
//! through the shard's fenced [`Checkpointer`] and answered. Strictly one message in flight.
//!
//! `timeoutInSeconds` bounds each hook as a whole: writing each message (a child that stops
//! reading its stdin blocks the write), the checkpoints the child asks for, its answers, and
//! for a child's last message its exit. Without it every hook is bounded all the same, by
//! [`DEFAULT_HOOK_BOUND`] (5 min), and `lease_lost`, on which kcl puts no deadline, by
//! [`LEASE_LOST_BOUND`] (10 s): a worker that renews its leases keeps them valid however long a
//! hook takes, so without a bound a child that hangs would hold its shard for ever.
//!
//! Failure of a child (it exits, closes its stdout, answers the wrong `responseFor`, does not
//! read or answer within `timeoutInSeconds`) fails the hook: kcl restarts the shard from its
//! last checkpoint with a backoff, in a new child, and the daemon's other shards carry on. The
//! Java daemon exits the whole process instead; [`FailurePolicy::exit`] keeps that behaviour.
//! Under a failure policy that handles failures in place, the worker delivers the batch again
//! (or parts of it) to the same processor instead, which starts a new child for it,
//! initialized as the first was ([`CHILD_RESTARTS`]); and so for the shard's last hook when
//! the last child is gone: `shardEnded`, or `shutdownRequested` on a stop or a handoff while
//! the batch waits for its next try (a clean stop: the child hears it and may checkpoint, at
//! most up to the record before the one that waits).
//!
//! A batch the child answered fails too when, while it processed the batch, the child's client
//! library reported on stderr that the record processor raised (amazon_kclpy catches the
//! exception, writes `Caught exception from action dispatch: …` and a traceback, and answers
//! anyway): [`ChildCommand::errors_fail_batch`], `childErrorsFailBatch`. How the report is
//! told to be the batch's, and no other's: the `stderr` module. Such a child is well: under a
//! policy that handles failures in place it is kept for the next delivery
//! ([`FailurePolicy::in_place`]), so a poison record costs no restart.
//!
//! Each child leads its own process group, and goes as a group: once the child has exited,
//! what is left of its group (a grandchild still holding its pipes) is killed, and the group
//! reaped (the zombies that are the daemon's to reap: its children, and where it is PID 1 or a
//! subreaper, their orphans). An exchange cut short (kcl drops a hook that runs past the
//! lease's validity, or `timeoutInSeconds` passes) leaves the child in the middle of a
//! message: its group is killed rather than told anything more. A child left behind any other
//! way (the processor dropped) has its group killed and reaped too.
//!
//! Lines over 1 MiB on a child's stdout or stderr, and lines that are not UTF-8, are skipped
//! (logged as such) and the pipe read on.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use kcl_core::{BoxError, Checkpointer, InitializationInput, ProcessRecordsInput, RecordProcessor};
use process_wrap::tokio::CommandWrap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::protocol::{JsonRecord, ToChild};

mod checkpoint;
mod group;
mod lines;
mod lookup;
mod session;
mod stderr;

use self::group::Group;
use self::lines::{Line, shown};
use self::session::Session;

/// The longest line read from a child (stdout or stderr): 1 MiB; longer ones are skipped.
const MAX_LINE: usize = 1 << 20;
/// How long a child may take to exit once its stdin is closed before its group is killed
/// (less if the hook's `timeoutInSeconds` runs out first).
const EXIT_GRACE: Duration = Duration::from_secs(10);
/// How long `lease_lost` may take when `timeoutInSeconds` is not set: kcl puts no deadline on
/// it, and the shard is not free for another child until it returns.
pub(crate) const LEASE_LOST_BOUND: Duration = Duration::from_secs(10);
/// How long any other hook may take with its child when `timeoutInSeconds` is not set: 5 min.
/// The worker keeps renewing the lease while a hook runs, so the lease's validity never cuts
/// a hung child's hook; this does, and the shard restarts from its checkpoint in a new child.
/// Longer than any batch a working child should take (10,000 records at 30 ms each), and
/// shorter than `stalledAfterSeconds` (10 min). Raise it with `timeoutInSeconds`.
pub const DEFAULT_HOOK_BOUND: Duration = Duration::from_secs(300);
/// How long what a killed group leaves behind is waited for: its reaping, the end of its
/// pipes (held open only by a process that left the group).
const AFTER_KILL: Duration = Duration::from_secs(1);
/// How much of a skipped stdout line the warning shows.
const SHOWN: usize = 200;

/// How to start the application's child processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildCommand {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// How long each hook may take with the child (`timeoutInSeconds`): its messages written,
    /// the checkpoints on the way, its answers and, after its last message, its exit. `None`:
    /// [`DEFAULT_HOOK_BOUND`] (5 min), and 10 s for `lease_lost`.
    pub timeout: Option<Duration>,
    /// Whether a batch fails when the child's client library reports on stderr that the
    /// record processor raised while processing it, though it answered the batch
    /// (`childErrorsFailBatch`, default `true`; amazon_kclpy reports so, with `Caught
    /// exception from action dispatch`). `false` counts such a batch as processed, as the
    /// Java daemon does.
    pub errors_fail_batch: bool,
}

impl ChildCommand {
    /// `executableName` as the Java daemon reads it: split at spaces, empty parts dropped.
    pub fn parse(executable: &str) -> Option<Self> {
        let mut parts = executable.split(' ').filter(|p| !p.is_empty());
        let program = parts.next()?.to_owned();
        Some(Self {
            program,
            args: parts.map(str::to_owned).collect(),
            timeout: None,
            errors_fail_batch: true,
        })
    }
}

/// What a failed child costs.
#[derive(Debug, Clone, Default)]
pub struct FailurePolicy {
    /// Cancelled when a child fails if the daemon should exit, as the Java daemon does
    /// (`--exit-on-child-failure`); `None` restarts only the child's shard. A batch failed
    /// because the child reported that its processor raised
    /// ([`errors_fail_batch`](ChildCommand::errors_fail_batch)) is not a failed child: the
    /// Java daemon, which counts such a batch as processed, does not exit for it either.
    pub exit: Option<CancellationToken>,
    /// Whether the worker delivers a failed batch again, whole or in parts, to the same
    /// processor: its failure policy handles failures in place (`failureExhausted` is
    /// `dead-letter` or `skip`). A child whose record processor raised, and which answered
    /// the batch, is then kept for the next delivery: a poison record costs no restart. A
    /// child that exited, broke the protocol or timed out is replaced all the same. Without
    /// (`block`), the shard restarts in a new processor and child, and the child is closed
    /// at once.
    pub in_place: bool,
}

/// Why an exchange with a child failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChildError {
    /// The child could not be started.
    #[error("cannot start `{program}`")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Writing to or reading from the child failed.
    #[error("talking to the child failed while waiting for `{action}`")]
    Io {
        /// The message in flight.
        action: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The child closed its stdout (it exited, most likely).
    #[error("the child ended while processing `{action}` ({status})")]
    Ended {
        /// The message in flight.
        action: &'static str,
        /// How it exited, if it did.
        status: String,
    },
    /// The child answered another message than the one in flight.
    #[error("the child answered `{got}` while `{action}` was in flight")]
    WrongStatus {
        /// The message in flight.
        action: &'static str,
        /// What its status named.
        got: String,
    },
    /// The child did not answer in time.
    #[error("the child did not answer `{action}` within {timeout:?} ({bound})")]
    Timeout {
        /// The message in flight.
        action: &'static str,
        /// The limit.
        timeout: Duration,
        /// What set it.
        bound: &'static str,
    },
    /// The child's client library reported on stderr that the record processor raised while
    /// processing the message, and answered it anyway (`childErrorsFailBatch`).
    #[error(
        "the child's record processor raised `{exception}` in `{action}` (reported on its stderr; its client library answered the message anyway)"
    )]
    Raised {
        /// The message in flight.
        action: &'static str,
        /// The exception, as the child reported it.
        exception: String,
    },
    /// The child did not read its message in time (it stopped reading its stdin).
    #[error(
        "the child did not read `{action}` within {timeout:?} ({bound}): it stopped reading its stdin"
    )]
    WriteTimeout {
        /// The message in flight.
        action: &'static str,
        /// The limit.
        timeout: Duration,
        /// What set it.
        bound: &'static str,
    },
}

/// The deadline of one hook.
#[derive(Debug, Clone, Copy)]
struct Bound {
    at: Instant,
    limit: Duration,
    /// What set it, for the error.
    by: &'static str,
}

impl Bound {
    /// `timeoutInSeconds` from now, else [`DEFAULT_HOOK_BOUND`].
    fn hook(timeout: Option<Duration>) -> Option<Self> {
        Some(match timeout {
            Some(limit) => Self::from_now(limit, "timeoutInSeconds"),
            None => Self::from_now(
                DEFAULT_HOOK_BOUND,
                "the default hook bound, timeoutInSeconds not being set",
            ),
        })
    }

    /// `lease_lost`'s: `timeoutInSeconds` or [`LEASE_LOST_BOUND`], within `hook`'s if given.
    fn lease_lost(timeout: Option<Duration>, hook: Option<Self>) -> Self {
        hook.unwrap_or_else(|| match timeout {
            Some(limit) => Self::from_now(limit, "timeoutInSeconds"),
            None => Self::from_now(
                LEASE_LOST_BOUND,
                "leaseLost's bound, timeoutInSeconds not being set",
            ),
        })
    }

    fn from_now(limit: Duration, by: &'static str) -> Self {
        Self {
            at: Instant::now() + limit,
            limit,
            by,
        }
    }

    /// How long a child may take to exit within this bound.
    fn grace(bound: Option<Self>) -> Duration {
        bound.map_or(EXIT_GRACE, |b| {
            EXIT_GRACE.min(b.at.saturating_duration_since(Instant::now()))
        })
    }
}

/// A [`RecordProcessor`] that hands its shard to a child process (see the module docs).
#[derive(Debug)]
pub struct ChildProcessor {
    command: Arc<ChildCommand>,
    policy: FailurePolicy,
    session: Option<Session>,
    /// What `initialize` told the child, to start a new child after one failed a batch (the
    /// worker's failure policy then delivers the batch again, or a part of it, or stops the
    /// shard while the batch waits for its next try).
    initialized: Option<ToChild>,
}

impl ChildProcessor {
    /// A processor that will start `command` when initialized.
    pub fn new(command: Arc<ChildCommand>, policy: FailurePolicy) -> Self {
        Self {
            command,
            policy,
            session: None,
            initialized: None,
        }
    }

    /// Logs a child's failure and tells the failure policy.
    fn failed(&self, error: &ChildError) {
        if let ChildError::Raised { .. } = error {
            // The child is well: its processor failed the batch, as a Rust processor's error
            // does (the Java daemon, which does not see it, would not exit either).
            tracing::error!(error = %error, "the child's record processor raised: the batch failed");
            return;
        }
        tracing::error!(error = %kcl_core::error_chain(error), "child failed");
        if let Some(exit) = &self.policy.exit {
            tracing::error!("--exit-on-child-failure: the daemon exits");
            exit.cancel();
        }
    }

    fn spawn(&mut self) -> Result<&mut Session, ChildError> {
        let mut command = CommandWrap::with_new(&self.command.program, |command| {
            command
                .args(&self.command.args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
        });
        // Its own process group: a Ctrl-C at a terminal reaches the daemon only, which then
        // asks each child to checkpoint and stop, in order; and the child goes with whatever
        // it started (killed and reaped as a group).
        #[cfg(unix)]
        command.wrap(process_wrap::tokio::ProcessGroup::leader());
        let spawn_error = |source| ChildError::Spawn {
            program: self.command.program.clone(),
            source,
        };
        let mut process = command.spawn().map_err(spawn_error)?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (
            process.stdin().take(),
            process.stdout().take(),
            process.stderr().take(),
        ) else {
            let _ = process.start_kill();
            return Err(spawn_error(std::io::Error::other("a pipe is missing")));
        };
        let group = Group::new(process);
        tracing::info!(pid = group.id(), program = %self.command.program, "child started");
        let raised_fails = self.command.errors_fail_batch;
        let session = Session::new(group, stdin, stdout, stderr, raised_fails);
        Ok(self.session.insert(session))
    }

    /// One exchange: `message` out, lines in until its status, all within `bound`. A
    /// failure is also reported to the failure policy.
    async fn exchange(
        &mut self,
        message: &ToChild,
        checkpointer: Option<&mut Checkpointer>,
        bound: Option<Bound>,
    ) -> Result<(), ChildError> {
        let action = message.action();
        let result = match (self.session.as_mut(), bound) {
            (Some(session), None) => session.exchange(message, checkpointer).await,
            (Some(session), Some(bound)) => {
                let exchanged =
                    tokio::time::timeout_at(bound.at, session.exchange(message, checkpointer))
                        .await;
                match exchanged {
                    Ok(result) => result,
                    Err(_) if session.writing => Err(ChildError::WriteTimeout {
                        action,
                        timeout: bound.limit,
                        bound: bound.by,
                    }),
                    Err(_) => Err(ChildError::Timeout {
                        action,
                        timeout: bound.limit,
                        bound: bound.by,
                    }),
                }
            }
            (None, _) => Err(ChildError::Ended {
                action,
                status: "never started".to_owned(),
            }),
        };
        if let Err(error) = &result {
            self.failed(error);
        }
        result
    }

    /// Closes the child's stdin and waits for it to exit, within `bound` and at most
    /// [`EXIT_GRACE`]; then kills what is left of its process group and reaps it.
    async fn close(&mut self, bound: Option<Bound>) {
        let Some(mut session) = self.session.take() else {
            return;
        };
        if session.busy {
            tracing::warn!("the child is in the middle of a message: killing its process group");
            session.group.kill();
        }
        drop(session.stdin.take());
        let grace = Bound::grace(bound);
        let Session { group, stdout, .. } = &mut session;
        let exited = async {
            let mut drained = false;
            loop {
                tokio::select! {
                    status = group.exited() => return status,
                    line = stdout.next(), if !drained => match line {
                        // What the child still prints is logged, as the Java daemon drains it.
                        Some(Ok(Line::Text(line))) if !line.trim().is_empty() => {
                            tracing::debug!(line = %shown(&line), "child stdout after its last message");
                        }
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => drained = true,
                    },
                }
            }
        };
        match tokio::time::timeout(grace, exited).await {
            Ok(Ok(status)) => tracing::info!(status = %describe(status), "child exited"),
            Ok(Err(error)) => tracing::warn!(%error, "waiting for the child failed"),
            Err(_) => tracing::warn!(?grace, "the child did not exit: killing its process group"),
        }
        // Whatever is left of its group (a grandchild holding its pipes) goes with it.
        session.group.reap().await;
        let stderr = session.stderr.take();
        let ends = async {
            while session.stdout.next().await.is_some() {}
            if let Some(stderr) = stderr {
                let _ = stderr.await;
            }
        };
        if tokio::time::timeout(AFTER_KILL, ends).await.is_err() {
            tracing::warn!(
                "the child's pipes are still open after its process group was killed (held by a process that left the group)"
            );
        }
    }

    /// A new child in place of one that failed a batch, initialized as the first was, unless
    /// a child runs (or none was ever initialized); counted in [`CHILD_RESTARTS`]. One that
    /// cannot be started or initialized is closed, the failure reported.
    async fn revive(&mut self, bound: Option<Bound>, why: &'static str) -> Result<(), ChildError> {
        let Some(initialize) = self.initialized.clone() else {
            return Ok(());
        };
        if self.session.is_some() {
            return Ok(());
        }
        tracing::info!("starting a new child after the last one failed a batch, {why}");
        ::metrics::counter!(CHILD_RESTARTS).increment(1);
        if let Err(error) = self.spawn() {
            self.failed(&error);
            return Err(error);
        }
        let initialized = self.exchange(&initialize, None, bound).await;
        if initialized.is_err() {
            self.close(bound).await;
        }
        initialized
    }

    /// The last exchange of a child: `message`, then its stdin closed, all within `bound`.
    async fn last(
        &mut self,
        message: &ToChild,
        checkpointer: Option<&mut Checkpointer>,
        bound: Option<Bound>,
    ) -> Result<(), ChildError> {
        let ready = self.session.as_ref().is_some_and(|s| !s.busy);
        let result = if ready {
            self.exchange(message, checkpointer, bound).await
        } else {
            Ok(())
        };
        self.close(bound).await;
        result
    }
}

/// Children that exited with a status other than 0, or were killed (counter).
pub const CHILDREN_FAILED: &str = "kcl_multilang_children_failed_total";

/// Children started in place of one that failed a batch, for the batch's next delivery (or
/// a part of it) under a failure policy, or for the shard's last hook (counter). A child whose
/// processor raised, still answering, is kept ([`FailurePolicy::in_place`]), and not counted.
/// A shard that restarts from its checkpoint (no policy: `block`) starts a new processor, and
/// its child, without counting here: `kcl_processor_failures_total` counts those.
pub const CHILD_RESTARTS: &str = "kcl_multilang_child_restarts_total";

/// Registers the daemon's own counters ([`CHILDREN_FAILED`], [`CHILD_RESTARTS`]) at zero and
/// keeps them fresh, as kcl-core does its own: an exporter's idle timeout drops a counter not
/// touched for a while, and its count with it. Call every taker interval.
pub fn refresh_series() {
    for name in [CHILDREN_FAILED, CHILD_RESTARTS] {
        ::metrics::counter!(name).increment(0);
    }
}

/// A child's exit, described (`exit status: 3`, `killed by signal 9`).
fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(signal) = status.signal() {
            return format!("killed by signal {signal}");
        }
    }
    status.to_string()
}

impl RecordProcessor for ChildProcessor {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        let bound = Bound::hook(self.command.timeout);
        if self.session.is_some() {
            self.close(bound).await;
        }
        if let Err(error) = self.spawn() {
            self.failed(&error);
            return Err(error.into());
        }
        let message = ToChild::initialize(input.shard_id.as_str(), &input.checkpoint);
        self.exchange(&message, None, bound).await?;
        self.initialized = Some(message);
        Ok(())
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let bound = Bound::hook(self.command.timeout);
        self.revive(bound, "for the next delivery").await?;
        let message = ToChild::ProcessRecords {
            records: input.records().iter().map(JsonRecord::from).collect(),
            millis_behind_latest: input.millis_behind_latest(),
        };
        let result = self.exchange(&message, Some(checkpointer), bound).await;
        match &result {
            Ok(()) => {}
            // Its processor raised, and it answered: it is well, and takes the next delivery.
            Err(ChildError::Raised { .. }) if self.policy.in_place => {}
            // Whatever state it is in, it is not used again.
            Err(_) => self.close(bound).await,
        }
        Ok(result?)
    }

    async fn lease_lost(&mut self) {
        let bound = Bound::lease_lost(self.command.timeout, None);
        let _ = self.last(&ToChild::LeaseLost, None, Some(bound)).await;
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), BoxError> {
        let bound = Bound::hook(self.command.timeout);
        // The last child failed a batch the policy then gave up on: a child checkpoints the end.
        self.revive(bound, "to checkpoint the shard's end").await?;
        Ok(self
            .last(&ToChild::ShardEnded, Some(checkpointer), bound)
            .await?)
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let bound = Bound::hook(self.command.timeout);
        // A stop while a batch waits for its next try, its last child gone: a new child hears
        // it (its checkpoint is at most the record before the one that waits).
        self.revive(bound, "to hear shutdownRequested").await?;
        let asked = self
            .exchange(&ToChild::ShutdownRequested, Some(checkpointer), bound)
            .await;
        // Then, as KCL Java does when its worker stops, the lease is gone for this child.
        let bound = Bound::lease_lost(self.command.timeout, bound);
        let lost = self.last(&ToChild::LeaseLost, None, Some(bound)).await;
        asked?;
        Ok(lost?)
    }
}
