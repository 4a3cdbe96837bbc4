//! The logger and the signals: how a kcl process starts logging and stops.

use std::io::IsTerminal as _;
use std::time::Duration;

use kcl_core::{ShutdownHandle, Signals};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Output format of the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable, colored on a terminal.
    Pretty,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// `pretty` (or `text`) or `json`, any case.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "pretty" | "text" => Ok(Self::Pretty),
            "json" => Ok(Self::Json),
            _ => Err(format!("expected pretty or json, got {s:?}")),
        }
    }
}

/// Installs the global tracing subscriber, writing to stderr (stdout is the application's):
/// `filter` in tracing-subscriber's syntax. The error names the setting at fault.
pub fn init_logging(format: LogFormat, filter: &str) -> Result<(), String> {
    let filter = EnvFilter::builder()
        .parse(filter)
        .map_err(|e| format!("invalid setting `log-filter`: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Pretty => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    result.map_err(|e| format!("cannot install the logger: {e}"))
}

/// First SIGTERM or SIGINT: graceful shutdown of the worker behind `handle` (and `also`
/// cancelled, for the process's own jobs). Second: force, and `forced` cancelled.
pub async fn on_signals(
    handle: ShutdownHandle,
    forced: CancellationToken,
    deadline: Duration,
    also: CancellationToken,
) {
    let mut signals = Signals::new();
    let first = signals.recv().await;
    also.cancel();
    tracing::info!(
        signal = first,
        deadline = %humantime::format_duration(deadline),
        "shutting down: processors checkpoint and leases are handed back; signal again to force"
    );
    handle.shutdown();
    let second = signals.recv().await;
    tracing::warn!(signal = second, "forcing shutdown");
    handle.force();
    forced.cancel();
}
