//! Value parsers of `run`'s options, for clap: a flag's, a `KCL_…` variable's and a config
//! file's value go through the same one, and its error is the reason a value is rejected.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};

pub(crate) fn parse_timestamp(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!("expected an RFC 3339 time such as 2024-05-01T12:00:00Z, got {s:?} ({e})")
        })
}

pub(crate) fn parse_count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| format!("expected a whole number, got {s:?}"))
}

pub(crate) fn parse_u32(s: &str) -> Result<u32, String> {
    s.trim()
        .parse::<u32>()
        .map_err(|_| format!("expected a whole number, got {s:?}"))
}

pub(crate) fn parse_max_leases(s: &str) -> Result<usize, String> {
    if s.trim().eq_ignore_ascii_case("unlimited") {
        Ok(usize::MAX)
    } else {
        parse_count(s).map_err(|_| format!("expected a whole number or `unlimited`, got {s:?}"))
    }
}

/// `load` or `count` (kcl-core's `BalanceBy`, whose serde names these are).
pub(crate) fn parse_balance_by(s: &str) -> Result<kcl_core::BalanceBy, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "load" => Ok(kcl_core::BalanceBy::Load),
        "count" => Ok(kcl_core::BalanceBy::Count),
        _ => Err(format!("expected load or count, got {s:?}")),
    }
}

/// A finite number (its range is kcl-core's to check: `Balancing::capacity`).
pub(crate) fn parse_capacity(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|c| c.is_finite())
        .ok_or_else(|| format!("expected a number such as 1 or 2.5, got {s:?}"))
}

/// A finite number (its range is kcl-core's to check: `Autoscaling::utilization`).
pub(crate) fn parse_fraction(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|c| c.is_finite())
        .ok_or_else(|| format!("expected a number such as 0.7, got {s:?}"))
}

/// A TCP port (0: any free one).
pub(crate) fn parse_port(s: &str) -> Result<u16, String> {
    s.trim()
        .parse::<u16>()
        .map_err(|_| format!("expected a port number (0 to 65535), got {s:?}"))
}

/// A whole number, or `unlimited` (`None`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unlimited(pub(crate) Option<u32>);

impl FromStr for Unlimited {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("unlimited") {
            return Ok(Self(None));
        }
        parse_u32(s)
            .map(|n| Self(Some(n)))
            .map_err(|_| format!("expected a whole number or `unlimited`, got {s:?}"))
    }
}

pub(crate) fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    s.trim()
        .parse::<SocketAddr>()
        .map_err(|e| format!("expected an address such as 0.0.0.0:8080, got {s:?} ({e})"))
}

/// A duration such as `10s`, at most 7 days ([`parse_duration`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span(pub(crate) Duration);

impl FromStr for Span {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_duration(s).map(Self)
    }
}

/// A duration such as `10m`, or `off` (`None`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OffOr(pub(crate) Option<Duration>);

impl FromStr for OffOr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("off") {
            return Ok(Self(None));
        }
        parse_duration(s)
            .map(|d| Self(Some(d)))
            .map_err(|e| format!("{e}; or off"))
    }
}

/// Parses `10s`, `500ms`, `1m30s`.
/// A duration such as `10s`, at most [`kcl_core::MAX_DURATION`] (7 days): beyond any useful
/// value, and small enough that adding it to a clock reading never overflows.
pub(crate) fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("expected a duration such as 10s, 500ms or 1m30s, got {s:?} ({e})"))?;
    if d > kcl_core::MAX_DURATION {
        return Err(format!("must be at most 7 days, got {}", s.trim()));
    }
    Ok(d)
}
