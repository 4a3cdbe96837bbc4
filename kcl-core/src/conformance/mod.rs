//! One conformance suite for every [`LeaseStore`]: the same checks of each operation's
//! condition, effect, fencing and failure answer, run unchanged against the in-memory store,
//! DynamoDB and any store to come.
//!
//! Why it exists: the lease protocol is only as safe as the store's conditional writes. A
//! store that applies a renewal whose counter moved, forgets to clear a handoff on a take,
//! or answers a lost race with anything but [`Conflict`](crate::ErrorKind::Conflict) breaks
//! the guarantees of `docs/guarantees.md` without any test of the worker noticing. Each
//! check here states one rule of [`LeaseStore`]'s documentation (the in-memory store is the
//! reference where the docs leave a detail open) and fails naming the operation and the
//! fields that differ.
//!
//! # Running it against a store
//!
//! In an integration test of the store's crate (with `kcl-core`'s `test-util` feature and
//! `tokio` as dev-dependencies), give [`lease_store_conformance!`](crate::lease_store_conformance)
//! an expression that makes a fresh, empty store with a table of its own: it is evaluated
//! once per test, and the tests run in parallel. It may evaluate to the store or to an
//! `Option` of it (`None` skips the test, for a store whose server is missing and tests that
//! are allowed to skip):
//!
//! ```ignore
//! // kcl-core/tests/conformance.rs
//! kcl_core::lease_store_conformance!(kcl_core::memory::MemoryLeaseStore::new());
//!
//! // tests/tests/conformance.rs: a table of its own per test on the emulator
//! kcl_core::lease_store_conformance!(fresh_store().await);
//!
//! // kcl-postgres/tests/conformance.rs: a schema of its own per test on KCL_POSTGRES_URL
//! kcl_core::lease_store_conformance!(fresh_store().await);
//! ```
//!
//! Each check becomes one `#[tokio::test]` named after it (see [`LEASE_STORE_CHECKS`]), so
//! `cargo test` reports each rule. A store that implements
//! [`Transact`](crate::outputs::Transact) runs the commit checks too, through a
//! [`TransactFixture`] that knows how to make and read the store's writes:
//! [`transact_conformance!`](crate::transact_conformance).
//!
//! A store that disagrees with a rule on purpose, or until it is fixed, lists the check in
//! `known_failures`: it still runs, says on stderr how it failed, and fails if it passes (so
//! the list cannot go stale). The list is the record of how the store differs:
//!
//! ```ignore
//! kcl_core::lease_store_conformance!(fresh_store().await;
//!     known_failures = ["request_handoff_on_a_missing_row_is_refused"]);
//! ```
//!
//! # What the checks assume of a store
//!
//! - Each test calls [`LeaseStore::ensure_table`] itself, asking for
//!   [`TableFeatures::ALL`](crate::TableFeatures::ALL); the change feed and request counts
//!   are checked only if the store serves them.
//! - Rows are set up with [`LeaseStore::create`], which must store every field of the lease
//!   given (counter, owner and fence included).
//! - Times are whole milliseconds and durations too (what DynamoDB keeps); sets
//!   (parents, children, parked keys) are compared as sets.
//! - Eventually consistent reads ([`peek`](LeaseStore::peek),
//!   [`snapshot`](LeaseStore::snapshot), [`owned_by`](LeaseStore::owned_by), the feed) are
//!   polled for up to [`EVENTUALLY`]; each check gives up after [`CHECK_LIMIT`].

mod checkpoint;
mod extras;
mod ownership;
mod support;
mod table;
mod transact;

use std::fmt;
use std::future::Future;
use std::time::Duration;

pub use self::checkpoint::*;
pub use self::extras::*;
pub use self::ownership::*;
pub use self::table::*;
pub use self::transact::*;
use crate::error::{BackendError, BoxError, error_chain};
use crate::lease::LeaseStore;
use crate::outputs::CommitError;

/// How long an eventually consistent read may lag before a check fails.
pub const EVENTUALLY: Duration = Duration::from_secs(10);

/// How long one check may take before it fails.
pub const CHECK_LIMIT: Duration = Duration::from_secs(120);

/// Why a conformance check failed. Its `Debug` is the whole chain, so that a test returning
/// it prints every cause.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// The store answered, but not as the contract says.
    #[error("{0}")]
    Contract(String),
    /// An operation the check needed failed.
    #[error("{what} failed")]
    Store {
        /// The operation and what it was for.
        what: String,
        /// The store's error.
        #[source]
        source: BackendError,
    },
    /// A commit the check needed failed.
    #[error("{what} failed")]
    Commit {
        /// The commit and what it was for.
        what: String,
        /// The commit's error.
        #[source]
        source: CommitError,
    },
    /// The fixture of a [`TransactFixture`] failed (reading an output item).
    #[error("the fixture failed to {what}")]
    Fixture {
        /// What it was asked.
        what: String,
        /// Its error.
        #[source]
        source: BoxError,
    },
    /// The check took longer than [`CHECK_LIMIT`].
    #[error("the check did not finish within {0:?}")]
    TimedOut(Duration),
    /// A check listed in `known_failures` passed: the store conforms now, so the entry must
    /// go.
    #[error("`{0}` is listed in known_failures but passed: remove it from the list")]
    KnownFailurePassed(&'static str),
    /// An entry of `known_failures` names no check of the suite.
    #[error("known_failures names `{0}`, which is no check of the conformance suite")]
    UnknownCheck(String),
    /// A check failed (the failure is the source).
    #[error("conformance check `{check}`")]
    In {
        /// The check's name.
        check: &'static str,
        /// How it failed.
        #[source]
        failure: Box<Failure>,
    },
}

impl Failure {
    /// A broken rule, in words.
    pub fn contract(what: impl Into<String>) -> Self {
        Self::Contract(what.into())
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&error_chain(self))
    }
}

/// What the expression given to [`lease_store_conformance!`](crate::lease_store_conformance)
/// may evaluate to: a store, or `Option` of one (`None` skips the test).
pub trait FreshStore {
    /// The store.
    type Store: LeaseStore;

    /// The store, or `None` to skip the test.
    fn into_store(self) -> Option<Self::Store>;
}

impl<S: LeaseStore> FreshStore for S {
    type Store = S;

    fn into_store(self) -> Option<S> {
        Some(self)
    }
}

impl<S: LeaseStore> FreshStore for Option<S> {
    type Store = S;

    fn into_store(self) -> Option<S> {
        self
    }
}

/// What the expression given to [`transact_conformance!`](crate::transact_conformance) may
/// evaluate to: a fixture, or `Option` of one (`None` skips the test).
pub trait FreshFixture {
    /// The fixture.
    type Fixture: TransactFixture;

    /// The fixture, or `None` to skip the test.
    fn into_fixture(self) -> Option<Self::Fixture>;
}

impl<F: TransactFixture> FreshFixture for F {
    type Fixture = F;

    fn into_fixture(self) -> Option<F> {
        Some(self)
    }
}

impl<F: TransactFixture> FreshFixture for Option<F> {
    type Fixture = F;

    fn into_fixture(self) -> Option<F> {
        self
    }
}

/// Runs the check `name` (the body) of a generated test, within [`CHECK_LIMIT`], and reads
/// its outcome against `known` (the instantiation's `known_failures`): a known failure that
/// fails is said on stderr and passes, one that passes fails. Called by the macros.
#[doc(hidden)]
#[allow(
    clippy::print_stderr,
    reason = "a known failure is said where the test's output goes"
)]
pub async fn run(
    name: &'static str,
    known: &[&str],
    body: impl Future<Output = Result<(), Failure>>,
) -> Result<(), Failure> {
    if let Some(unknown) = known
        .iter()
        .find(|k| !LEASE_STORE_CHECKS.contains(k) && !TRANSACT_CHECKS.contains(k))
    {
        return Err(Failure::UnknownCheck((*unknown).to_owned()));
    }
    let outcome = tokio::time::timeout(CHECK_LIMIT, body)
        .await
        .unwrap_or(Err(Failure::TimedOut(CHECK_LIMIT)));
    match (outcome, known.contains(&name)) {
        (Ok(()), false) => Ok(()),
        (Ok(()), true) => Err(Failure::KnownFailurePassed(name)),
        (Err(failure), false) => Err(Failure::In {
            check: name,
            failure: Box::new(failure),
        }),
        (Err(failure), true) => {
            eprintln!("conformance: `{name}` failed, as known_failures says: {failure:?}");
            Ok(())
        }
    }
}

/// Says on stderr that a check has nothing to check in this store (a feature it does not
/// serve), so that a pass is not read as coverage.
#[allow(clippy::print_stderr, reason = "said where the test's output goes")]
pub(crate) fn not_applicable(check: &str, why: &str) {
    eprintln!("conformance: `{check}` not applicable: {why}");
}

/// The checks of [`lease_store_conformance!`](crate::lease_store_conformance), each a
/// function of this module taking `&impl LeaseStore`, in the order the macro lists them.
/// The one list of the suite: the macro expands it.
#[doc(hidden)]
#[macro_export]
macro_rules! __lease_store_checks {
    ($callback:ident { $($args:tt)* }) => {
        $crate::$callback! { $($args)* ;
            ensure_table_is_idempotent,
            get_and_peek_of_a_missing_row_answer_none,
            create_writes_a_row_only_when_absent,
            list_and_snapshot_return_every_row,
            a_row_with_every_field_round_trips,
            a_multi_stream_row_with_every_field_round_trips,
            every_checkpoint_kind_round_trips,
            renew_bumps_the_counter_and_keeps_the_rest,
            renew_writes_the_load_it_carries,
            renew_is_refused_unless_owner_and_counter_hold,
            take_makes_the_taker_owner_and_fences_its_tenure,
            take_from_another_owner_counts_a_switch_and_clears_the_handoff,
            an_adoption_keeps_the_handoff_request,
            take_is_refused_unless_owner_and_counter_hold,
            release_frees_the_lease_and_bumps_the_counter,
            release_is_refused_unless_owner_and_counter_hold,
            request_handoff_names_the_target_and_leaves_the_counter,
            request_handoff_is_refused_unless_the_owner_holds,
            request_handoff_on_a_missing_row_is_refused,
            checkpoint_writes_the_update_and_bumps_the_counter,
            checkpoint_removes_the_pending_checkpoint,
            checkpoint_writes_acked_with_its_checkpoint_and_removes_it_otherwise,
            checkpoint_adds_parked_entries,
            checkpoint_writes_children_and_keeps_them_when_none_are_given,
            checkpoint_leaves_what_the_update_does_not_set,
            checkpoint_writes_the_load_it_carries,
            checkpoint_is_refused_unless_owner_counter_and_checkpoint_hold,
            reset_takes_and_checkpoints_in_one_write,
            reset_writes_every_field_of_its_update,
            reset_keeps_a_restart_grace_its_update_sets,
            reset_is_refused_unless_owner_and_counter_hold,
            delete_is_conditioned_on_the_counter_alone,
            owned_by_names_the_rows_of_one_owner,
            the_change_feed_serves_every_write_in_order,
            usage_counts_every_request,
            unpark_removes_entries_and_leaves_the_counter,
            request_redrive_adds_its_entry_while_the_key_is_parked,
        }
    };
}

/// The checks of [`transact_conformance!`](crate::transact_conformance), each a function of
/// this module taking `&impl TransactFixture`. The one list: the macro expands it.
#[doc(hidden)]
#[macro_export]
macro_rules! __transact_checks {
    ($callback:ident { $($args:tt)* }) => {
        $crate::$callback! { $($args)* ;
            commit_writes_outputs_and_checkpoint_and_leaves_the_counter,
            commit_ignores_the_counter,
            commit_is_refused_unless_owner_fence_and_checkpoint_hold,
            commit_names_the_refused_write_by_its_index,
            commit_resets_owner_switches_and_writes_its_update,
            a_plain_checkpoint_from_before_a_commit_is_refused,
            a_retried_commit_applies_its_writes_once,
            a_token_reused_by_another_commit_is_refused,
        }
    };
}

/// The names of a check list, as a constant.
#[doc(hidden)]
#[macro_export]
macro_rules! __check_names {
    ($(#[$attr:meta])* $name:ident ; $($check:ident),* $(,)?) => {
        $(#[$attr])*
        pub const $name: &[&str] = &[$(stringify!($check)),*];
    };
}

/// One test per check, calling `$crate::conformance::$check(&subject)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($into:ident, $fresh:expr, $known:tt ; $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $check() -> ::core::result::Result<(), $crate::conformance::Failure> {
                let Some(subject) = $crate::conformance::$into($fresh) else {
                    return Ok(());
                };
                let known: &[&str] = &$known;
                $crate::conformance::run(
                    stringify!($check),
                    known,
                    $crate::conformance::$check(&subject),
                )
                .await
            }
        )*
    };
}

__lease_store_checks!(__check_names {
    /// The names of the checks [`lease_store_conformance!`](crate::lease_store_conformance)
    /// makes tests of, each a function of this module.
    LEASE_STORE_CHECKS
});

__transact_checks!(__check_names {
    /// The names of the checks [`transact_conformance!`](crate::transact_conformance) makes
    /// tests of, each a function of this module.
    TRANSACT_CHECKS
});

/// The store of `fresh`, or `None` to skip (the macros' argument, evaluated per test).
#[doc(hidden)]
pub fn store<F: FreshStore>(fresh: F) -> Option<F::Store> {
    fresh.into_store()
}

/// The fixture of `fresh`, or `None` to skip.
#[doc(hidden)]
pub fn fixture<F: FreshFixture>(fresh: F) -> Option<F::Fixture> {
    fresh.into_fixture()
}

/// Expands to one `#[tokio::test]` per check of the [conformance suite](crate::conformance)
/// ([`LEASE_STORE_CHECKS`](crate::conformance::LEASE_STORE_CHECKS)), each run against a
/// store made by `$fresh`: an expression evaluated once per test, inside the test's async
/// body, to a fresh and empty store with a table of its own, or `Option` of one (`None`
/// skips the test). Optionally, `known_failures = ["check", ...]` lists the checks the store
/// is known to fail (see the module docs).
///
/// ```ignore
/// kcl_core::lease_store_conformance!(kcl_core::memory::MemoryLeaseStore::new());
/// kcl_core::lease_store_conformance!(fresh_store().await;
///     known_failures = ["usage_counts_every_request"]);
/// ```
#[macro_export]
macro_rules! lease_store_conformance {
    ($fresh:expr) => {
        $crate::lease_store_conformance!($fresh; known_failures = []);
    };
    ($fresh:expr; known_failures = $known:tt) => {
        $crate::__lease_store_checks!(__conformance_tests { store, $fresh, $known });
    };
}

/// Expands to one `#[tokio::test]` per check of a store's exactly-once commits
/// ([`TRANSACT_CHECKS`](crate::conformance::TRANSACT_CHECKS)), each run against a
/// [`TransactFixture`](crate::conformance::TransactFixture) made by `$fresh` (evaluated once
/// per test, to the fixture or `Option` of it), with `known_failures` as
/// [`lease_store_conformance!`](crate::lease_store_conformance) has it.
///
/// ```ignore
/// kcl_core::transact_conformance!(MemoryCommits::new());
/// ```
#[macro_export]
macro_rules! transact_conformance {
    ($fresh:expr) => {
        $crate::transact_conformance!($fresh; known_failures = []);
    };
    ($fresh:expr; known_failures = $known:tt) => {
        $crate::__transact_checks!(__conformance_tests { fixture, $fresh, $known });
    };
}
