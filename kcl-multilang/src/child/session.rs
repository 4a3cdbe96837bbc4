//! A running child and its pipes: one exchange at a time, a message out and lines in until
//! the `status` that answers it.

use std::time::Duration;

use futures_util::StreamExt as _;
use kcl_core::Checkpointer;
use tokio::io::AsyncWriteExt as _;
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio_util::codec::FramedRead;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument as _;

use super::checkpoint::checkpoint;
use super::group::Group;
use super::lines::{ChildLines, Line, shown};
use super::stderr::Stderr;
use super::{ChildError, describe};
use crate::protocol::{FromChild, ToChild};

/// A running child and its pipes.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) group: Group,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) stdout: FramedRead<ChildStdout, ChildLines>,
    /// The child's stderr, shared with the task that forwards it to the log.
    errors: Stderr,
    /// Forwards stderr to the log; ends when the child closes it.
    pub(super) stderr: Option<AbortOnDropHandle<()>>,
    /// Whether an exception the child's client library reports on stderr during
    /// `processRecords` fails the batch (`childErrorsFailBatch`).
    raised_fails: bool,
    /// An exchange started and did not finish: the child is mid-message.
    pub(super) busy: bool,
    /// A message is being written: a deadline passing now means the child stopped reading.
    pub(super) writing: bool,
}

impl Session {
    /// A session on a child just started, its stderr forwarded to the log (in the current
    /// span) from now on.
    pub(super) fn new(
        group: Group,
        stdin: ChildStdin,
        stdout: ChildStdout,
        stderr: ChildStderr,
        raised_fails: bool,
    ) -> Self {
        let errors = Stderr::new(stderr);
        let forward = errors
            .clone()
            .forward()
            .instrument(tracing::Span::current());
        Self {
            group,
            stdin: Some(stdin),
            stdout: ChildLines::reader(stdout),
            errors,
            stderr: Some(AbortOnDropHandle::new(tokio::spawn(forward))),
            raised_fails,
            busy: false,
            writing: false,
        }
    }

    /// One exchange, unbounded: the caller bounds it.
    pub(super) async fn exchange(
        &mut self,
        message: &ToChild,
        checkpointer: Option<&mut Checkpointer>,
    ) -> Result<(), ChildError> {
        let action = message.action();
        let watch = self.raised_fails && matches!(message, ToChild::ProcessRecords { .. });
        if watch {
            // What the child reported before this batch was written is not the batch's.
            drop(self.errors.raised());
        }
        self.busy = true;
        self.send(message).await?;
        self.answered(action, checkpointer).await?;
        // The status is read: whatever the child wrote to stderr before it is in the pipe
        // now, and `raised` reads the pipe to its end first (see `stderr`).
        if watch && let Some(exception) = self.errors.raised().into_iter().next() {
            return Err(ChildError::Raised { action, exception });
        }
        Ok(())
    }

    /// Lines from the child until the status that answers `action`, each checkpoint it asks
    /// for on the way carried out and answered.
    async fn answered(
        &mut self,
        action: &'static str,
        mut checkpointer: Option<&mut Checkpointer>,
    ) -> Result<(), ChildError> {
        loop {
            let line = self.next_line(action).await?;
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

    /// The child's next line on stdout, lines it cannot be read as skipped.
    async fn next_line(&mut self, action: &'static str) -> Result<String, ChildError> {
        loop {
            match self.stdout.next().await {
                Some(Ok(Line::Text(line))) => return Ok(line),
                Some(Ok(Line::TooLong)) => {
                    tracing::warn!("skipping a line over 1 MiB on the child's stdout");
                }
                Some(Ok(Line::NotUtf8)) => {
                    tracing::warn!("skipping a line on the child's stdout that is not UTF-8");
                }
                Some(Err(source)) => return Err(ChildError::Io { action, source }),
                None => {
                    return Err(ChildError::Ended {
                        action,
                        status: self.exit_status().await,
                    });
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
        self.writing = true;
        let written = written.await;
        self.writing = false;
        match written {
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
        let waited = tokio::time::timeout(Duration::from_secs(1), self.group.exited()).await;
        match waited {
            Ok(Ok(status)) => describe(status),
            Ok(Err(error)) => format!("unknown: {error}"),
            Err(_) => "still running, its stdout closed".to_owned(),
        }
    }
}
