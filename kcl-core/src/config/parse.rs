//! The modes' spellings, read once here for every binary and configuration file: a value is
//! trimmed and read in any case, with `_` or `-` between words (`every-worker`,
//! `EVERY_WORKER`); a mistake says what was given and what is accepted.

use std::str::FromStr;

use super::modes::{Coordination, Liveness, Retrieval};
#[cfg(doc)]
use crate::types::InitialPosition;

/// A mode's text that names none of its values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected {expected}, got {given:?}")]
pub struct ParseModeError {
    /// The text given.
    pub given: String,
    /// What is accepted, e.g. `every-worker or leader`.
    pub expected: &'static str,
}

/// The value of `table` whose spelling is `given`'s.
fn pick<T: Copy>(
    given: &str,
    table: &[(&str, T)],
    expected: &'static str,
) -> Result<T, ParseModeError> {
    let word = given.trim().to_ascii_lowercase().replace('_', "-");
    table
        .iter()
        .find(|(spelling, _)| *spelling == word)
        .map(|&(_, value)| value)
        .ok_or_else(|| ParseModeError {
            given: given.to_owned(),
            expected,
        })
}

/// How records are read, without what fan-out needs: [`Retrieval`]'s mode, as a setting
/// spells it (`polling`, `fan-out` or `fanout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RetrievalMode {
    /// [`Retrieval::Polling`].
    #[default]
    Polling,
    /// [`Retrieval::FanOut`].
    FanOut,
}

impl RetrievalMode {
    /// The [`Retrieval`] of this mode; fan-out through the stream consumer `consumer_name`.
    pub fn with_consumer(self, consumer_name: impl Into<String>) -> Retrieval {
        match self {
            Self::Polling => Retrieval::Polling,
            Self::FanOut => Retrieval::FanOut {
                consumer_name: consumer_name.into(),
            },
        }
    }
}

impl FromStr for RetrievalMode {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let table = [
            ("polling", Self::Polling),
            ("fan-out", Self::FanOut),
            ("fanout", Self::FanOut),
        ];
        pick(s, &table, "polling or fan-out")
    }
}

/// Where a shard without a checkpoint starts, as a setting spells it (`TRIM_HORIZON`,
/// `LATEST`, `AT_TIMESTAMP`), without `AT_TIMESTAMP`'s time: an [`InitialPosition`]'s kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InitialPositionKind {
    /// [`InitialPosition::TrimHorizon`].
    #[default]
    TrimHorizon,
    /// [`InitialPosition::Latest`].
    Latest,
    /// [`InitialPosition::AtTimestamp`], whose time a setting gives apart.
    AtTimestamp,
}

impl FromStr for InitialPositionKind {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let table = [
            ("trim-horizon", Self::TrimHorizon),
            ("latest", Self::Latest),
            ("at-timestamp", Self::AtTimestamp),
        ];
        pick(s, &table, "TRIM_HORIZON, LATEST or AT_TIMESTAMP")
    }
}

impl FromStr for Coordination {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let table = [
            ("every-worker", Self::EveryWorker),
            ("leader", Self::Leader),
        ];
        pick(s, &table, "every-worker or leader")
    }
}

impl FromStr for Liveness {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let table = [
            ("per-lease", Self::PerLease),
            ("heartbeat", Self::Heartbeat),
        ];
        pick(s, &table, "per-lease or heartbeat")
    }
}

impl FromStr for crate::failure::Exhausted {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let table = [
            ("block", Self::Block),
            ("dead-letter", Self::DeadLetter),
            ("skip", Self::Skip),
        ];
        pick(s, &table, "block, dead-letter or skip")
    }
}

/// Configuration files read a mode as its setting is read ([`FromStr`]).
macro_rules! try_from_string {
    ($($ty:ty),*) => {$(
        impl TryFrom<String> for $ty {
            type Error = ParseModeError;

            fn try_from(s: String) -> Result<Self, Self::Error> {
                s.parse()
            }
        }
    )*};
}

try_from_string!(Coordination, Liveness, RetrievalMode);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_mode_reads_the_same() {
        for s in ["every-worker", "EVERY_WORKER", " Every-Worker "] {
            assert_eq!(s.parse(), Ok(Coordination::EveryWorker), "{s}");
        }
        assert_eq!("heartbeat".parse(), Ok(Liveness::Heartbeat));
        assert_eq!("PER_LEASE".parse(), Ok(Liveness::PerLease));
        assert_eq!("FANOUT".parse(), Ok(RetrievalMode::FanOut));
        assert_eq!("fan-out".parse(), Ok(RetrievalMode::FanOut));
        assert_eq!("at-timestamp".parse(), Ok(InitialPositionKind::AtTimestamp));
        assert_eq!("TRIM_HORIZON".parse(), Ok(InitialPositionKind::TrimHorizon));
    }

    #[test]
    fn a_mistake_says_what_was_given_and_what_is_accepted() {
        assert_eq!(
            "leeder".parse::<Coordination>().map_err(|e| e.to_string()),
            Err(r#"expected every-worker or leader, got "leeder""#.to_owned())
        );
        assert_eq!(
            "beat".parse::<Liveness>().map_err(|e| e.to_string()),
            Err(r#"expected per-lease or heartbeat, got "beat""#.to_owned())
        );
    }
}
