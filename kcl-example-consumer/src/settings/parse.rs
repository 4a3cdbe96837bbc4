//! Parsers of single values: each returns the reason a value is rejected.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};

#[derive(Debug, Clone, Copy, Default)]
pub(super) enum Position {
    #[default]
    TrimHorizon,
    Latest,
    AtTimestamp,
}

pub(super) fn parse_position(s: &str) -> Result<Position, String> {
    match s.trim().to_ascii_uppercase().replace('-', "_").as_str() {
        "TRIM_HORIZON" => Ok(Position::TrimHorizon),
        "LATEST" => Ok(Position::Latest),
        "AT_TIMESTAMP" => Ok(Position::AtTimestamp),
        _ => Err(format!(
            "expected TRIM_HORIZON, LATEST or AT_TIMESTAMP, got {s:?}"
        )),
    }
}

pub(super) fn parse_timestamp(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!("expected an RFC 3339 time such as 2024-05-01T12:00:00Z, got {s:?} ({e})")
        })
}

pub(super) fn parse_count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| format!("expected a whole number, got {s:?}"))
}

pub(super) fn parse_u32(s: &str) -> Result<u32, String> {
    s.trim()
        .parse::<u32>()
        .map_err(|_| format!("expected a whole number, got {s:?}"))
}

pub(super) fn parse_max_leases(s: &str) -> Result<usize, String> {
    if s.trim().eq_ignore_ascii_case("unlimited") {
        Ok(usize::MAX)
    } else {
        parse_count(s).map_err(|_| format!("expected a whole number or `unlimited`, got {s:?}"))
    }
}

/// A value of a type that reads itself ([`FromStr`]): a mode of kcl-core or kcl-aws, whose
/// error says what was given and what is accepted.
pub(super) fn from_str<T: FromStr>(s: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e: T::Err| e.to_string())
}

/// A duration such as `10m`, or `off` (`None`).
pub(super) fn parse_stalled_after(s: &str) -> Result<Option<Duration>, String> {
    if s.trim().eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    crate::cli::parse_duration(s)
        .map(Some)
        .map_err(|e| format!("{e}; or off"))
}
