//! A child's stderr: every line logged, in the shard's span, as the Java daemon logs it; and
//! the exceptions a client library caught in the record processor and reported there, for
//! `childErrorsFailBatch`.
//!
//! amazon_kclpy catches what the record processor raises, writes it to stderr, and answers
//! the message with `status` anyway, so under the Java daemon a batch whose processor raised
//! counts as processed. To fail that batch instead, the exchange must know, once the
//! `status` is read, whether the child reported an exception while it processed the batch:
//!
//! - kclpy writes the report and flushes stderr *before* it writes the `status` to stdout
//!   (`KCLProcess._perform_action`, then `_report_done`), so once the daemon has read the
//!   `status`, every byte of the report is in the kernel's stderr pipe, or already read out of
//!   it;
//! - the stderr reader is shared (behind a mutex) by the task that forwards it to the log
//!   between and during exchanges and the exchange itself, which ([`Stderr::raised`]) reads
//!   the pipe directly, without waiting, to its end (`EAGAIN`) and decodes the lines it holds
//!   before it looks at what was reported. Nothing waits on the forwarding task, nor on
//!   tokio's readiness of the pipe (which may lag the data by a reactor turn), so no report
//!   is missed or left for the next batch, and none is added: it costs one `read(2)` that
//!   finds the pipe empty, per batch;
//! - what is reported before the batch is written (a report of `initialize`'s, say) is taken
//!   and dropped by the same call before the batch goes out.
//!
//! A line over 1 MiB is skipped (said so), not read for a report.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};

use futures_util::StreamExt as _;
use tokio::process::ChildStderr;
use tokio_util::codec::{Decoder as _, FramedRead};

use super::lines::{ChildLines, Line};

/// How client libraries begin the stderr line that reports an exception they caught from the
/// record processor, and then answered the message for anyway:
///
/// - amazon_kclpy (`amazon_kclpy/kcl.py`, `KCLProcess._perform_action`, 1.x to 3.x):
///   `Caught exception from action dispatch: <str(ex)>`, the traceback right after it
///   (`traceback.print_exc`, its first line run on after the message, no newline between),
///   a flush, then the `status`.
///
/// aws-kcl (Node.js) catches nothing: an exception ends the child, which fails the batch
/// already.
pub(crate) const RAISED_MARKERS: &[&str] = &["Caught exception from action dispatch"];

/// What follows a marker on its line: the traceback's first line, run on.
const TRACEBACK: &str = "Traceback (most recent call last):";

/// A child's stderr, shared by the task that logs it and the exchanges that ask what it
/// reported.
#[derive(Debug, Clone)]
pub(super) struct Stderr(Arc<Mutex<Reader>>);

#[derive(Debug)]
struct Reader {
    lines: FramedRead<ChildStderr, ChildLines>,
    /// The exceptions reported since [`Stderr::raised`] last took them.
    raised: Vec<Reported>,
}

/// An exception a client library reported.
#[derive(Debug)]
struct Reported {
    /// What follows the marker: the exception's text.
    message: String,
    /// The traceback's last line so far that reads as an exception (`ValueError: …`).
    exception: Option<String>,
}

impl Stderr {
    pub(super) fn new(pipe: ChildStderr) -> Self {
        Self(Arc::new(Mutex::new(Reader {
            lines: ChildLines::reader(pipe),
            raised: Vec::new(),
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Reader> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Logs each line until the pipe closes (a task of its own, for the child's lifetime).
    pub(super) async fn forward(self) {
        std::future::poll_fn(|cx| self.lock().poll_forward(cx)).await;
    }

    /// The exceptions the child reported since the last call, each as its traceback's last
    /// line (`ValueError: poison`) or else the text after the marker; the pipe read to its
    /// end first, without waiting (see the module docs).
    pub(super) fn raised(&self) -> Vec<String> {
        let mut reader = self.lock();
        reader.read_now();
        std::mem::take(&mut reader.raised)
            .into_iter()
            .map(|r| r.exception.unwrap_or(r.message))
            .collect()
    }
}

impl Reader {
    fn poll_forward(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match ready!(self.lines.poll_next_unpin(cx)) {
                Some(Ok(line)) => self.line(line),
                Some(Err(_)) | None => return Poll::Ready(()),
            }
        }
    }

    /// Reads what the pipe holds now into the reader's buffer, and takes the whole lines out.
    /// The forwarding task reads the rest (a line not ended yet, the end of the pipe).
    #[cfg(unix)]
    fn read_now(&mut self) {
        let mut chunk = [0u8; 8192];
        loop {
            match nix::unistd::read(self.lines.get_ref(), &mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    self.lines.read_buffer_mut().extend_from_slice(&chunk[..n]);
                    self.decode_buffered();
                }
                Err(nix::errno::Errno::EINTR) => {}
                // EAGAIN: nothing more for now.
                Err(_) => break,
            }
        }
        self.decode_buffered();
    }

    /// Elsewhere, what the forwarding task has read.
    #[cfg(not(unix))]
    fn read_now(&mut self) {
        self.decode_buffered();
    }

    /// The whole lines in the reader's buffer, handled in order.
    fn decode_buffered(&mut self) {
        let mut buffer = std::mem::take(self.lines.read_buffer_mut());
        while let Ok(Some(line)) = self.lines.decoder_mut().decode(&mut buffer) {
            self.line(line);
        }
        *self.lines.read_buffer_mut() = buffer;
    }

    fn line(&mut self, line: Line) {
        match line {
            Line::Text(line) => {
                tracing::info!(target: "kcl_multilang::child", "{line}");
                self.note(&line);
            }
            Line::TooLong => {
                tracing::warn!(target: "kcl_multilang::child", "skipping a line over 1 MiB on the child's stderr");
            }
            Line::NotUtf8 => {
                tracing::info!(target: "kcl_multilang::child", "(a line that is not UTF-8, skipped)");
            }
        }
    }

    /// Notes a report's start, or a line of its traceback that reads as the exception.
    fn note(&mut self, line: &str) {
        if let Some(rest) = RAISED_MARKERS.iter().find_map(|m| line.strip_prefix(m)) {
            let message = rest.strip_prefix(':').unwrap_or(rest);
            let message = message.strip_suffix(TRACEBACK).unwrap_or(message).trim();
            self.raised.push(Reported {
                message: message.to_owned(),
                exception: None,
            });
        } else if let Some(report) = self.raised.last_mut()
            && exception_line(line)
        {
            report.exception = Some(line.trim_end().to_owned());
        }
    }
}

/// Whether a line reads as the last line of a Python traceback: `ValueError: bad`,
/// `pkg.mod.Error: …` or `StopIteration` (not indented; a dotted name, then `:` or nothing).
fn exception_line(line: &str) -> bool {
    let name = line
        .split_once(':')
        .map_or(line, |(name, _)| name)
        .trim_end();
    let mut parts = name.split('.');
    !name.is_empty()
        && parts.all(|part| {
            part.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_alphanumeric() || c == '_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exception_lines_are_told_from_the_rest_of_a_traceback() {
        for yes in [
            "ValueError: poison",
            "mod.sub.Error: x: y",
            "StopIteration",
            "KeyError: 'k'",
        ] {
            assert!(exception_line(yes), "{yes}");
        }
        for no in [
            TRACEBACK,
            "  File \"x.py\", line 3, in f",
            "    raise ValueError('x')",
            "During handling of the above exception, another exception occurred:",
            "",
            "an application's own line",
        ] {
            assert!(!exception_line(no), "{no}");
        }
    }
}
