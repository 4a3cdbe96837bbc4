//! One child process per shard lease: [`ChildProcessor`] is a kcl [`RecordProcessor`] that
//! runs the application's `executableName` and speaks the protocol with it.
//!
//! Each hook is one exchange: a message written to the child's stdin, then lines read from its
//! stdout until the `status` that answers it, with every `checkpoint` on the way carried out
//! through the shard's fenced [`Checkpointer`] and answered. Strictly one message in flight.
//!
//! Failure of a child (it exits, closes its stdout, answers the wrong `responseFor`, does not
//! answer within `timeoutInSeconds`) fails the hook: kcl restarts the shard from its last
//! checkpoint with a backoff, in a new child, and the daemon's other shards carry on. The Java
//! daemon exits the whole process instead; [`FailurePolicy::exit`] keeps that behaviour.
//!
//! An exchange cut short (kcl drops a hook that runs past the lease's validity) leaves the
//! child in the middle of a message: it is killed rather than told anything more. A child left
//! behind any other way (the processor dropped) is killed too (`kill_on_drop`).

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use kcl_core::{
    BoxError, CheckpointError, Checkpointer, ErrorKind, ExtendedSequenceNumber,
    InitializationInput, ProcessRecordsInput, RecordProcessor, SequenceNumber,
};
use tokio::io::AsyncWriteExt as _;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument as _;

use crate::protocol::{CheckpointFailure, FromChild, JsonRecord, ToChild};

/// The longest line read from a child (stdout or stderr); longer ones are skipped.
const MAX_LINE: usize = 1 << 20;
/// How long a child may take to exit once its stdin is closed before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);
/// How much of a skipped stdout line the warning shows.
const SHOWN: usize = 200;

/// How to start the application's child processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildCommand {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// How long the child may take to answer a message (`timeoutInSeconds`); `None` waits as
    /// long as the lease allows.
    pub timeout: Option<Duration>,
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
        })
    }
}

/// What a failed child costs.
#[derive(Debug, Clone, Default)]
pub struct FailurePolicy {
    /// Cancelled when a child fails if the daemon should exit, as the Java daemon does
    /// (`--exit-on-child-failure`); `None` restarts only the child's shard.
    pub exit: Option<CancellationToken>,
}

/// Why an exchange with a child failed.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
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
    #[error("the child did not answer `{action}` within {timeout:?} (timeoutInSeconds)")]
    Timeout {
        /// The message in flight.
        action: &'static str,
        /// The limit.
        timeout: Duration,
    },
}

/// A running child and its pipes.
#[derive(Debug)]
struct Session {
    process: Child,
    stdin: Option<ChildStdin>,
    stdout: FramedRead<ChildStdout, LinesCodec>,
    /// Forwards stderr to the log; ends when the child closes it.
    stderr: Option<AbortOnDropHandle<()>>,
    /// An exchange started and did not finish: the child is mid-message.
    busy: bool,
}

/// A [`RecordProcessor`] that hands its shard to a child process (see the module docs).
#[derive(Debug)]
pub struct ChildProcessor {
    command: Arc<ChildCommand>,
    policy: FailurePolicy,
    session: Option<Session>,
}

impl ChildProcessor {
    /// A processor that will start `command` when initialized.
    pub fn new(command: Arc<ChildCommand>, policy: FailurePolicy) -> Self {
        Self {
            command,
            policy,
            session: None,
        }
    }

    /// Logs a child's failure and tells the failure policy.
    fn failed(&self, error: &ChildError) {
        tracing::error!(error = %kcl_core::error_chain(error), "child failed");
        if let Some(exit) = &self.policy.exit {
            tracing::error!("--exit-on-child-failure: the daemon exits");
            exit.cancel();
        }
    }

    fn spawn(&mut self) -> Result<&mut Session, ChildError> {
        let mut command = Command::new(&self.command.program);
        command
            .args(&self.command.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Its own process group: a Ctrl-C at a terminal reaches the daemon only, which then
        // asks each child to checkpoint and stop, in order.
        #[cfg(unix)]
        command.process_group(0);
        let spawn_error = |source| ChildError::Spawn {
            program: self.command.program.clone(),
            source,
        };
        let mut process = command.spawn().map_err(spawn_error)?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (
            process.stdin.take(),
            process.stdout.take(),
            process.stderr.take(),
        ) else {
            return Err(spawn_error(std::io::Error::other("a pipe is missing")));
        };
        tracing::info!(pid = process.id(), program = %self.command.program, "child started");
        let forward = forward_stderr(stderr).instrument(tracing::Span::current());
        Ok(self.session.insert(Session {
            process,
            stdin: Some(stdin),
            stdout: FramedRead::new(stdout, LinesCodec::new_with_max_length(MAX_LINE)),
            stderr: Some(AbortOnDropHandle::new(tokio::spawn(forward))),
            busy: false,
        }))
    }

    /// One exchange: `message` out, lines in until its status. A failure is also reported
    /// to the failure policy.
    async fn exchange(
        &mut self,
        message: &ToChild,
        checkpointer: Option<&mut Checkpointer>,
    ) -> Result<(), ChildError> {
        let result = match self.session.as_mut() {
            Some(session) => session.exchange(message, checkpointer, &self.command).await,
            None => Err(ChildError::Ended {
                action: message.action(),
                status: "never started".to_owned(),
            }),
        };
        if let Err(error) = &result {
            self.failed(error);
        }
        result
    }

    /// Closes the child's stdin and waits for it to exit (killing it after a grace).
    async fn close(&mut self) {
        let Some(mut session) = self.session.take() else {
            return;
        };
        if session.busy {
            tracing::warn!("the child is in the middle of a message: killing it");
            let _ = session.process.start_kill();
        }
        drop(session.stdin.take());
        let drain = async {
            // What the child still prints is logged, as the Java daemon drains it.
            while let Some(line) = session.stdout.next().await {
                if let Ok(line) = line
                    && !line.trim().is_empty()
                {
                    tracing::debug!(line = %shown(&line), "child stdout after its last message");
                }
            }
            session.process.wait().await
        };
        match tokio::time::timeout(EXIT_GRACE, drain).await {
            Ok(Ok(status)) => tracing::info!(%status, "child exited"),
            Ok(Err(error)) => tracing::warn!(%error, "waiting for the child failed"),
            Err(_) => {
                tracing::warn!(grace = ?EXIT_GRACE, "the child did not exit: killing it");
                let _ = session.process.kill().await;
            }
        }
        if let Some(stderr) = session.stderr.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), stderr).await;
        }
    }

    /// The last exchange of a child: `message`, then its stdin closed.
    async fn last(
        &mut self,
        message: &ToChild,
        checkpointer: Option<&mut Checkpointer>,
    ) -> Result<(), ChildError> {
        let ready = self.session.as_ref().is_some_and(|s| !s.busy);
        let result = if ready {
            self.exchange(message, checkpointer).await
        } else {
            Ok(())
        };
        self.close().await;
        result
    }
}

impl Session {
    async fn exchange(
        &mut self,
        message: &ToChild,
        mut checkpointer: Option<&mut Checkpointer>,
        command: &ChildCommand,
    ) -> Result<(), ChildError> {
        let action = message.action();
        self.busy = true;
        self.send(message).await?;
        loop {
            let line = match command.timeout {
                Some(limit) => tokio::time::timeout(limit, self.stdout.next())
                    .await
                    .map_err(|_| ChildError::Timeout {
                        action,
                        timeout: limit,
                    })?,
                None => self.stdout.next().await,
            };
            let line = match line {
                Some(Ok(line)) => line,
                Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                    tracing::warn!(
                        max = MAX_LINE,
                        "skipping an over-long line on the child's stdout"
                    );
                    continue;
                }
                Some(Err(LinesCodecError::Io(source))) => {
                    return Err(ChildError::Io { action, source });
                }
                None => {
                    return Err(ChildError::Ended {
                        action,
                        status: self.exit_status().await,
                    });
                }
            };
            match FromChild::parse(&line) {
                Some(FromChild::Status { response_for }) => {
                    self.busy = false;
                    return match response_for {
                        Some(r) if r == action => Ok(()),
                        other => Err(ChildError::WrongStatus {
                            action,
                            got: other.unwrap_or_else(|| "null".to_owned()),
                        }),
                    };
                }
                Some(FromChild::Checkpoint {
                    sequence_number,
                    sub_sequence_number,
                }) => {
                    let error = checkpoint(
                        checkpointer.as_deref_mut(),
                        sequence_number.as_deref(),
                        sub_sequence_number,
                    )
                    .await;
                    let reply = ToChild::Checkpoint {
                        sequence_number,
                        sub_sequence_number,
                        error,
                    };
                    self.send(&reply).await?;
                }
                Some(FromChild::Other { action: other }) => {
                    tracing::warn!(%other, expected = action, "skipping a message of no use here");
                }
                None if line.trim().is_empty() => {}
                None => {
                    tracing::warn!(line = %shown(&line), "skipping a line on the child's stdout that is not a message");
                }
            }
        }
    }

    async fn send(&mut self, message: &ToChild) -> Result<(), ChildError> {
        let action = message.action();
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(ChildError::Ended {
                action,
                status: "stdin closed".to_owned(),
            });
        };
        let mut line = message.to_line();
        line.push('\n');
        let written = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        };
        match written.await {
            Ok(()) => Ok(()),
            Err(source) if source.kind() == std::io::ErrorKind::BrokenPipe => {
                Err(ChildError::Ended {
                    action,
                    status: self.exit_status().await,
                })
            }
            Err(source) => Err(ChildError::Io { action, source }),
        }
    }

    /// How the child exited, waiting a moment for it.
    async fn exit_status(&mut self) -> String {
        let waited = tokio::time::timeout(Duration::from_secs(1), self.process.wait()).await;
        match waited {
            Ok(Ok(status)) => describe(status),
            Ok(Err(error)) => format!("unknown: {error}"),
            Err(_) => "still running, its stdout closed".to_owned(),
        }
    }
}

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

/// A line cut to what a log line should show.
fn shown(line: &str) -> &str {
    match line.char_indices().nth(SHOWN) {
        Some((at, _)) => &line[..at],
        None => line,
    }
}

/// Logs each line of the child's stderr, in the shard's span.
async fn forward_stderr(stderr: tokio::process::ChildStderr) {
    let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(MAX_LINE));
    while let Some(line) = lines.next().await {
        match line {
            Ok(line) => tracing::info!(target: "kcl_multilang::child", "{line}"),
            Err(LinesCodecError::MaxLineLengthExceeded) => {
                tracing::info!(target: "kcl_multilang::child", "(a line over {MAX_LINE} bytes)");
            }
            Err(LinesCodecError::Io(_)) => break,
        }
    }
}

/// Carries out a child's checkpoint; the error name to answer with, if it failed.
async fn checkpoint(
    checkpointer: Option<&mut Checkpointer>,
    sequence_number: Option<&str>,
    sub_sequence_number: Option<i64>,
) -> Option<CheckpointFailure> {
    let Some(checkpointer) = checkpointer else {
        tracing::warn!("the child asked to checkpoint where no checkpoint is possible");
        return Some(CheckpointFailure::InvalidStateException);
    };
    let result = match sequence_number {
        None => checkpointer.checkpoint().await,
        Some(given) => {
            let sub = u64::try_from(sub_sequence_number.unwrap_or(0)).ok();
            let Some((sequence, sub_sequence)) = SequenceNumber::parse(given).zip(sub) else {
                tracing::warn!(
                    sequence_number = given,
                    sub_sequence_number,
                    "the child asked to checkpoint at a position that is not one"
                );
                return Some(CheckpointFailure::IllegalArgumentException);
            };
            let position = ExtendedSequenceNumber {
                sequence,
                sub_sequence,
            };
            checkpointer.checkpoint_at(position).await
        }
    };
    let error = result.err()?;
    tracing::warn!(error = %kcl_core::error_chain(&error), "checkpoint refused");
    Some(failure(&error))
}

/// The Java exception KCL Java's checkpointer would throw for `error`.
fn failure(error: &CheckpointError) -> CheckpointFailure {
    match error {
        CheckpointError::LeaseLost { .. } => CheckpointFailure::ShutdownException,
        CheckpointError::NotDelivered { .. }
        | CheckpointError::Backwards { .. }
        | CheckpointError::NothingDelivered { .. } => CheckpointFailure::IllegalArgumentException,
        CheckpointError::Store { source, .. } => match source.kind() {
            ErrorKind::Throttled => CheckpointFailure::ThrottlingException,
            ErrorKind::Conflict => CheckpointFailure::ShutdownException,
            _ => CheckpointFailure::KinesisClientLibDependencyException,
        },
        _ => CheckpointFailure::KinesisClientLibDependencyException,
    }
}

impl RecordProcessor for ChildProcessor {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        if self.session.is_some() {
            self.close().await;
        }
        if let Err(error) = self.spawn() {
            self.failed(&error);
            return Err(error.into());
        }
        let message = ToChild::initialize(input.shard_id.as_str(), &input.checkpoint);
        Ok(self.exchange(&message, None).await?)
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let message = ToChild::ProcessRecords {
            records: input.records().iter().map(JsonRecord::from).collect(),
            millis_behind_latest: input.millis_behind_latest(),
        };
        Ok(self.exchange(&message, Some(checkpointer)).await?)
    }

    async fn lease_lost(&mut self) {
        let _ = self.last(&ToChild::LeaseLost, None).await;
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), BoxError> {
        Ok(self.last(&ToChild::ShardEnded, Some(checkpointer)).await?)
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let asked = self
            .exchange(&ToChild::ShutdownRequested, Some(checkpointer))
            .await;
        // Then, as KCL Java does when its worker stops, the lease is gone for this child.
        let lost = self.last(&ToChild::LeaseLost, None).await;
        asked?;
        Ok(lost?)
    }
}
