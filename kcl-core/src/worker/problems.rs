//! Every shard is processed or reported.
//!
//! A worker that cannot coordinate says so (`Status::problem`, the readiness probe). This
//! module covers the quieter failures, where the worker runs and is ready but a shard is read
//! by nobody, and its records would age out of the stream unread:
//!
//! - a lease row the store cannot parse (an attribute of the wrong type, a row holding only
//!   its key): kcl neither processes nor writes it, so an operator must fix or delete it;
//! - a shard the stream lists that has no lease kcl can read (its creation failed, or a row
//!   kcl cannot read holds its key);
//! - a lease ready to be processed that no worker has room for (`max_leases` across the
//!   fleet is below the shard count): the leader finds it in its plan; under `EveryWorker`
//!   each worker at its `max_leases` sees it left available for two failover times;
//! - a held shard whose checkpoint has not moved for `stalled_after` while records past it
//!   wait (its processor hangs, never checkpoints, or keeps failing after a batch or two);
//! - a held shard whose attempts keep failing: five in a row with no progress between them
//!   (no batch processed without an error, no checkpoint moved), in `initialize`,
//!   `process_records` or any hook, or reading; the processor is restarted at the backoff's
//!   pace all along; or whose checkpoint writes keep failing (five in a row over 10 s, none
//!   applied: a commit of outputs refused or denied), whatever its batches do;
//! - a held shard whose reads fail in a way retrying cannot fix (a checkpoint the stream
//!   does not have, access denied): the lease stays held and the read is retried at the
//!   backoff's pace, so that nobody else fails on it too and a fix (`kcl-admin reset`) is
//!   picked up.
//!
//! Each kind is found where the information is (the read of the table, the shard sync, the
//! leader's plan, the shard task), replaced as a whole each time it is looked at again, and
//! published in one place: [`Status::problems`](super::Status::problems), a gauge per kind,
//! and one log line when a problem appears (WARN, with what to do) and when it is gone (INFO).

use std::collections::BTreeMap;
use std::fmt;

use crate::metrics;

/// What kind of thing is wrong with a shard or a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// A lease-table row that cannot be parsed.
    UnreadableRow,
    /// A shard of the stream without a lease kcl can read.
    Unleased,
    /// A lease ready to be processed that no worker has room for.
    Unowned,
    /// A held shard whose reads fail in a way retrying cannot fix.
    ReadFailing,
    /// A held shard whose checkpoint has not moved for
    /// [`stalled_after`](crate::WorkerConfig::stalled_after) while records past it wait.
    Stalled,
    /// A held shard whose attempts keep failing: five in a row with no progress between
    /// them (a batch processed without an error, or the checkpoint moving); or whose
    /// checkpoint writes keep failing (five in a row over 10 s, none applied).
    Failing,
}

impl ProblemKind {
    /// Every kind.
    pub const ALL: [Self; 6] = [
        Self::UnreadableRow,
        Self::Unleased,
        Self::Unowned,
        Self::ReadFailing,
        Self::Stalled,
        Self::Failing,
    ];

    /// A short name, as in logs and `/status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnreadableRow => "unreadable_row",
            Self::Unleased => "unleased",
            Self::Unowned => "unowned",
            Self::ReadFailing => "read_failing",
            Self::Stalled => "stalled",
            Self::Failing => "failing",
        }
    }

    /// The gauge that counts this kind's problems.
    fn gauge(self) -> &'static str {
        match self {
            Self::UnreadableRow => metrics::LEASE_ROWS_UNREADABLE,
            Self::Unleased => metrics::SHARDS_UNLEASED,
            Self::Unowned => metrics::SHARDS_UNOWNED,
            Self::ReadFailing => metrics::SHARD_READ_FAILING,
            Self::Stalled => metrics::SHARDS_STALLED,
            Self::Failing => metrics::SHARDS_FAILING,
        }
    }

    /// What an operator should do about it.
    fn advice(self) -> &'static str {
        match self {
            Self::UnreadableRow => {
                "kcl will not read or write this row: fix its attributes or delete it \
                 (`kcl-admin leases` lists the table)"
            }
            Self::Unleased => {
                "nobody processes this shard: if a row holds its key, fix or delete that row; \
                 kcl creates the lease at its next shard sync"
            }
            Self::Unowned => {
                "no worker has room for it: raise max_leases or add workers \
                 (workers × max_leases must cover the shards)"
            }
            Self::ReadFailing => {
                "the shard stays held and the read is retried: fix the cause, or move the \
                 checkpoint with `kcl-admin reset`"
            }
            Self::Stalled => {
                "its processor hangs, keeps failing, or does not checkpoint: its records wait; \
                 a restart of the worker moves the shard, and replays from the last checkpoint \
                 (a processor that checkpoints only when it stops: set stalled_after off)"
            }
            Self::Failing => {
                "its processor fails every time (restarted from the last checkpoint at the \
                 backoff's pace, each error logged), or its checkpoint writes do (a commit of \
                 outputs refused or denied: the detail names the first error): fix the \
                 processor or what it needs; a record it always fails on is better set aside \
                 than failed"
            }
        }
    }
}

/// A shard kcl does not process, or a row it cannot read: what an operator must fix.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub struct Problem {
    /// What is wrong.
    pub kind: ProblemKind,
    /// The shard or row it is about (a lease key; `<no key>` for a row without one).
    pub key: String,
    /// The cause, as found (a parse error, a service error).
    pub detail: String,
}

impl Problem {
    /// A problem, e.g. to test what a binary makes of a [`Status`](super::Status).
    pub fn new(kind: ProblemKind, key: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            kind,
            key: key.into(),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.kind.as_str(), self.key, self.detail)
    }
}

/// The problems a worker knows of, by kind; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Problems {
    by_kind: BTreeMap<ProblemKind, BTreeMap<String, String>>,
}

impl Problems {
    /// Replaces the problems of `kind` with `found` (key → detail), logging those that
    /// appeared and those that are gone, and sets the kind's gauge. Returns whether anything
    /// changed.
    pub(crate) fn replace(&mut self, kind: ProblemKind, found: BTreeMap<String, String>) -> bool {
        let known = self.by_kind.entry(kind).or_default();
        let mut changed = false;
        for (key, detail) in &found {
            if known.get(key) != Some(detail) {
                changed = true;
                tracing::warn!(
                    problem = kind.as_str(),
                    key = %key,
                    detail = %detail,
                    "{}",
                    kind.advice()
                );
            }
        }
        for key in known.keys().filter(|k| !found.contains_key(*k)) {
            changed = true;
            tracing::info!(problem = kind.as_str(), key = %key, "problem solved");
        }
        *known = found;
        Self::set_gauge(kind, known.len());
        changed
    }

    /// Sets every kind's gauge again (so its series stays fresh; see [`metrics`]).
    pub(crate) fn refresh(&self) {
        for kind in ProblemKind::ALL {
            Self::set_gauge(kind, self.by_kind.get(&kind).map_or(0, BTreeMap::len));
        }
    }

    /// Every problem, by kind and key.
    pub(crate) fn list(&self) -> Vec<Problem> {
        let all = self.by_kind.iter().flat_map(|(kind, problems)| {
            problems.iter().map(|(key, detail)| Problem {
                kind: *kind,
                key: key.clone(),
                detail: detail.clone(),
            })
        });
        all.collect()
    }

    #[allow(clippy::cast_precision_loss)]
    fn set_gauge(kind: ProblemKind, n: usize) {
        ::metrics::gauge!(kind.gauge()).set(n as f64);
    }
}

/// One line for [`Status::problem`](super::Status::problem): the coordination problem if
/// there is one, else a summary of the shard problems.
pub(super) fn summary(coordination: Option<&str>, problems: &[Problem]) -> Option<String> {
    if let Some(text) = coordination {
        return Some(text.to_owned());
    }
    let first = problems.first()?;
    let more = match problems.len() {
        1 => String::new(),
        n => format!(" (and {} more, see /status)", n - 1),
    };
    Some(format!(
        "{} shard or row problem{}: {first}; {}{more}",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" },
        first.kind.advice()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(keys: &[&str]) -> BTreeMap<String, String> {
        keys.iter()
            .map(|k| ((*k).to_owned(), "why".to_owned()))
            .collect()
    }

    #[test]
    fn a_kind_is_replaced_as_a_whole_and_others_stay() {
        let mut p = Problems::default();
        assert!(p.replace(ProblemKind::Unleased, found(&["s1", "s2"])));
        assert!(p.replace(ProblemKind::UnreadableRow, found(&["s1"])));
        assert!(!p.replace(ProblemKind::Unleased, found(&["s1", "s2"])));
        assert!(p.replace(ProblemKind::Unleased, found(&["s2"])));
        let listed: Vec<_> = p.list().into_iter().map(|x| (x.kind, x.key)).collect();
        assert_eq!(
            listed,
            [
                (ProblemKind::UnreadableRow, "s1".to_owned()),
                (ProblemKind::Unleased, "s2".to_owned())
            ]
        );
    }

    #[test]
    fn the_summary_puts_coordination_first_then_counts_shard_problems() {
        let mut p = Problems::default();
        assert_eq!(summary(None, &p.list()), None);
        p.replace(ProblemKind::Unowned, found(&["s1", "s2"]));
        let text = summary(None, &p.list()).unwrap_or_default();
        assert!(
            text.starts_with("2 shard or row problems: unowned s1: why"),
            "{text}"
        );
        assert!(text.contains("and 1 more"), "{text}");
        assert_eq!(summary(Some("x"), &p.list()).as_deref(), Some("x"));
    }
}
