//! Postgres and pool errors → [`ErrorKind`], in one place.
//!
//! The worker's retry decisions depend only on the [`ErrorKind`] of a [`BackendError`]. An
//! error is first reduced to a [`Cause`] (from its SQLSTATE, or what failed when the server
//! never answered), and the cause mapped with one exhaustive `match`: adding a cause forces a
//! decision about its kind, whether the connection is worth keeping, and what to tell the
//! operator. A refused condition is no error here: a conditional statement that matched no
//! row is [`ErrorKind::Conflict`], decided by the store.
//!
//! No message carries the connection string: tokio-postgres's errors do not include it, and
//! the context added here is the operation, the application and the lease key.

use deadpool_postgres::{PoolError, TimeoutType};
use kcl_core::{BackendError, ErrorKind};

/// What an error means, whatever the statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The connection could not be made or broke, or the server is going away (SQLSTATE
    /// class 08, 57P01–57P03, an I/O error): try again on another connection.
    Connection,
    /// The pool had no free connection in time: too many calls at once.
    PoolBusy,
    /// A serialization failure or deadlock (40001, 40P01), a lock not available (55P03,
    /// 55006), a statement ended by `statement_timeout` (57014), an object created by
    /// another worker at the same instant (23505, 42P07, 42710), the server's internal
    /// errors (58, XX): try again.
    Transient,
    /// The server is short of connections, memory or disk (class 53): back off.
    Resources,
    /// The connection is to a server that cannot write (25006: a standby, after a
    /// failover): try again on a new connection.
    ReadOnly,
    /// A prepared statement no longer matches the table (0A000 "cached plan must not change
    /// result type", after the table was changed): try again on a new connection.
    StalePlan,
    /// The lease table does not exist (42P01).
    NoTable,
    /// The table lacks a column this crate uses (42703): older than this crate.
    OldTable,
    /// The role lacks a privilege (42501).
    Privilege,
    /// Authentication failed or the role may not connect (class 28).
    Auth,
    /// The database named does not exist (3D000).
    NoDatabase,
    /// The server's certificate was refused.
    Certificate,
    /// A connection pooler (PgBouncer) refused a startup parameter the store sends
    /// (`options`, for `idle_in_transaction_session_timeout`): 08P01 "unsupported startup
    /// parameter". Retrying cannot pass.
    StartupParameter,
    /// A prepared statement the connection had is gone (26000): a pooler in transaction mode
    /// that does not track prepared statements hands each transaction another server
    /// connection.
    LostStatement,
    /// Anything else: an invalid statement or value, a pool that was closed.
    Invalid,
}

impl Cause {
    /// Classifies a SQLSTATE, with the server's message for the one code that needs it.
    pub(crate) fn of_sqlstate(code: &str, message: &str) -> Self {
        match code {
            "40001" | "40P01" | "55P03" | "55006" | "57014" => Self::Transient,
            "23505" | "42P07" | "42710" => Self::Transient,
            "25006" => Self::ReadOnly,
            "57P01" | "57P02" | "57P03" => Self::Connection,
            "0A000" if message.contains("cached plan must not change result type") => {
                Self::StalePlan
            }
            "42P01" => Self::NoTable,
            "42703" => Self::OldTable,
            "42501" => Self::Privilege,
            "3D000" => Self::NoDatabase,
            "08P01" if message.contains("unsupported startup parameter") => Self::StartupParameter,
            "26000" => Self::LostStatement,
            _ => match code.get(..2) {
                Some("08") => Self::Connection,
                Some("53") => Self::Resources,
                Some("28") => Self::Auth,
                Some("58" | "XX") => Self::Transient,
                _ => Self::Invalid,
            },
        }
    }

    /// Classifies an error of tokio-postgres.
    pub(crate) fn of(error: &tokio_postgres::Error) -> Self {
        match error.as_db_error() {
            Some(db) => Self::of_sqlstate(db.code().code(), db.message()),
            None if refused_certificate(error) => Self::Certificate,
            // No answer from the server: connecting, TLS, I/O, a closed connection.
            None => Self::Connection,
        }
    }

    /// Classifies an error of the pool.
    pub(crate) fn of_pool(error: &PoolError) -> Self {
        match error {
            PoolError::Timeout(TimeoutType::Wait) => Self::PoolBusy,
            PoolError::Timeout(TimeoutType::Create | TimeoutType::Recycle) => Self::Connection,
            PoolError::Backend(e) => Self::of(e),
            PoolError::PostCreateHook(_) | PoolError::Closed | PoolError::NoRuntimeSpecified => {
                Self::Invalid
            }
        }
    }

    /// The core's kind for this cause, whether the connection that met it is to be dropped
    /// rather than reused, and what to tell the operator. The one exhaustive match.
    pub(crate) fn decide(self) -> (ErrorKind, bool, &'static str) {
        match self {
            Self::Connection => (ErrorKind::Retryable, true, ""),
            Self::PoolBusy => (
                ErrorKind::Throttled,
                false,
                " (every connection of the pool was busy: a larger pool_size, or a longer pool_wait)",
            ),
            Self::Transient => (ErrorKind::Retryable, false, ""),
            Self::Resources => (ErrorKind::Throttled, false, ""),
            Self::ReadOnly => (
                ErrorKind::Retryable,
                true,
                " (a read-only server: after a failover, target_session_attrs=read-write on the URL finds the new primary)",
            ),
            Self::StalePlan => (ErrorKind::Retryable, true, ""),
            Self::NoTable => (
                ErrorKind::NotFound,
                false,
                " (create it: ensure_table does under TableSetup::Managed, or apply kcl-postgres/schema.sql)",
            ),
            Self::OldTable => (
                ErrorKind::Fatal,
                false,
                " (the table is older than this kcl-postgres: apply its kcl-postgres/schema.sql)",
            ),
            Self::Privilege => (
                ErrorKind::Fatal,
                false,
                " (the role needs USAGE on the schema and SELECT, INSERT, UPDATE, DELETE on kcl's tables (kcl_leases, kcl_positions); to create them under TableSetup::Managed, CREATE on the schema: docs/postgres.md, Permissions)",
            ),
            Self::Auth => (
                ErrorKind::Fatal,
                false,
                " (check the user and password of the connection string, and pg_hba.conf)",
            ),
            Self::NoDatabase => (
                ErrorKind::Fatal,
                false,
                " (create the database, or name another in the connection string)",
            ),
            Self::Certificate => (
                ErrorKind::Fatal,
                false,
                " (the server's certificate was refused: give its CA with sslrootcert, connect by a name the certificate has or with sslmode=verify-ca, or sslmode=require to encrypt without verifying)",
            ),
            Self::StartupParameter => (
                ErrorKind::Fatal,
                false,
                " (a connection pooler refused the startup parameter `options`, which sets statement_timeout and idle_in_transaction_session_timeout: add `options` to PgBouncer's ignore_startup_parameters and set both on the role or database, or connect to Postgres directly)",
            ),
            Self::LostStatement => (
                ErrorKind::Fatal,
                true,
                " (a prepared statement vanished from the connection: PgBouncer in transaction mode needs max_prepared_statements above 0 (1.21 and later), or session mode)",
            ),
            Self::Invalid => (ErrorKind::Fatal, false, ""),
        }
    }
}

/// What a failing statement of a processor's commit means (`outputs`): the write's own
/// fault, which fails its record and only it, or the store's, which fails no record.
///
/// Only what a retry of the same statement can never pass, and what depends on the record,
/// is the write's: its own condition (class 23, a constraint), its values (class 22). A
/// statement that cannot run as written (class 42: syntax, an undefined column or function,
/// mismatched types) is the same for every record: code deployed before its migration, or
/// a bug, which must stall the shard for a fix rather than give every record up, so it is
/// the store's, as is everything else, mapped as any call's ([`Cause`]): a table or another
/// object missing and a privilege denied are deployments to fix (an outage must never make
/// records be given up), a serialization failure, deadlock or lock timeout is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Its own condition failed: a unique, check, foreign key, not-null or exclusion
    /// constraint (class 23), a view's `WITH CHECK OPTION` (class 44), a trigger's
    /// `RAISE` (P0001) or `ASSERT` (P0004).
    Refused,
    /// The record's values cannot be written: a data exception (class 22: a value out of
    /// range, too long, malformed), a cardinality violation (class 21: an `ON CONFLICT DO
    /// UPDATE` reaching one row twice), a program limit (class 54: a value too large).
    Invalid,
    /// Not the statement's fault: the store's, as for any call.
    Store(Cause),
}

impl Fault {
    /// Classifies the SQLSTATE of a processor's failing statement. The one match.
    pub(crate) fn of_sqlstate(code: &str, message: &str) -> Self {
        match (code.get(..2), code) {
            (Some("23" | "44"), _) | (_, "P0001" | "P0004") => Self::Refused,
            (Some("21" | "22" | "54"), _) => Self::Invalid,
            // The statement as written (class 42), a table or another object missing, a
            // privilege, a feature not supported, the connection, a conflict, resources:
            // the store's.
            _ => Self::Store(Cause::of_sqlstate(code, message)),
        }
    }

    /// Classifies a processor's failing statement.
    pub(crate) fn of(error: &tokio_postgres::Error) -> Self {
        match error.as_db_error() {
            Some(db) => Self::of_sqlstate(db.code().code(), db.message()),
            None => Self::Store(Cause::of(error)),
        }
    }
}

/// What the server said of a processor's failing statement, safe to show: its message and
/// SQLSTATE, never the error's detail (which shows the row: `Key (id)=(42)`), and a data
/// exception's quoted values left out (`invalid input syntax for type integer: "…"`).
/// A failure before the server answered is described by what failed.
pub(crate) fn describe_write(error: &tokio_postgres::Error) -> String {
    let Some(db) = error.as_db_error() else {
        return kcl_core::error_chain(error);
    };
    let code = db.code().code();
    let message = match code.get(..2) {
        Some("22") => unquoted(db.message()),
        _ => db.message().to_owned(),
    };
    let mut said = format!("{message} (SQLSTATE {code}");
    for (what, name) in [
        ("table", db.table()),
        ("column", db.column()),
        ("constraint", db.constraint()),
    ] {
        if let Some(name) = name {
            said.push_str(&format!(", {what} {name}"));
        }
    }
    said.push(')');
    said
}

/// `message` with what lies between its first and its last double quote left out: a data
/// exception quotes the value at fault, and does not escape the quotes a value holds.
fn unquoted(message: &str) -> String {
    match (message.find('"'), message.rfind('"')) {
        (Some(first), Some(last)) if first < last => {
            format!("{}…{}", &message[..=first], &message[last..])
        }
        (Some(first), _) => format!("{}…", &message[..=first]),
        _ => message.to_owned(),
    }
}

/// Whether a rustls error is in `error`'s chain (tokio-rustls wraps it in an `io::Error`,
/// whose `source` skips it).
fn refused_certificate(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .map(|i| i as &(dyn std::error::Error + 'static));
        if e.is::<rustls::Error>() || inner.is_some_and(|i| i.is::<rustls::Error>()) {
            return true;
        }
        next = e.source();
    }
    false
}

/// What failed, for the error's message: the operation's object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Subject<'a> {
    pub(crate) application: &'a str,
    pub(crate) key: Option<&'a str>,
    /// `kcl_leases`, or `kcl_positions` for a sink's calls.
    pub(crate) table: &'static str,
}

impl std::fmt::Display for Subject<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.key {
            Some(key) => write!(
                f,
                "lease {key} of application {} in {}",
                self.application, self.table
            ),
            None => write!(f, "application {} in {}", self.application, self.table),
        }
    }
}

/// What the server said (its message and SQLSTATE), or what failed before it could answer.
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => kcl_core::error_chain(error),
    }
}

/// What failed before the pool could lend a connection.
pub(crate) fn describe_pool(error: &PoolError) -> String {
    match error {
        PoolError::Backend(e) => describe(e),
        other => other.to_string(),
    }
}

/// A failed call: its kind, and whether its connection is to be dropped.
pub(crate) fn backend_error(
    operation: &'static str,
    subject: Subject<'_>,
    cause: Cause,
    detail: &str,
    source: impl Into<kcl_core::BoxError>,
) -> (BackendError, bool) {
    let (kind, drop_connection, hint) = cause.decide();
    let message = format!("{subject}: {detail}{hint}");
    let error = BackendError::new(kind, operation, message).with_source(source);
    (error, drop_connection)
}

/// Why a store could not be built from what it was given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ConfigError {
    #[error("the connection string cannot be read: {0}")]
    Url(#[source] tokio_postgres::Error),
    #[error("sslmode: {0}")]
    SslMode(#[source] kcl_core::ParseModeError),
    #[error("sslrootcert {path}: {source}")]
    RootFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("root certificates: {0}")]
    Roots(String),
    #[error("TLS: {0}")]
    Tls(#[source] rustls::Error),
    #[error("the application name is empty")]
    NoApplication,
    #[error("the connection pool: {0}")]
    Pool(#[source] deadpool_postgres::BuildError),
}

impl ConfigError {
    pub(crate) fn into_backend(self) -> BackendError {
        BackendError::new(ErrorKind::Fatal, "connect", self.to_string()).with_source(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_kinds() {
        let kind = |code: &str| Cause::of_sqlstate(code, "").decide().0;
        assert_eq!(kind("40001"), ErrorKind::Retryable, "serialization failure");
        assert_eq!(kind("40P01"), ErrorKind::Retryable, "deadlock");
        assert_eq!(kind("08006"), ErrorKind::Retryable, "connection failure");
        assert_eq!(kind("57P01"), ErrorKind::Retryable, "admin shutdown");
        assert_eq!(kind("57014"), ErrorKind::Retryable, "statement timeout");
        assert_eq!(kind("53300"), ErrorKind::Throttled, "too many connections");
        assert_eq!(kind("42P01"), ErrorKind::NotFound, "no table");
        assert_eq!(kind("42703"), ErrorKind::Fatal, "no column");
        assert_eq!(kind("28P01"), ErrorKind::Fatal, "bad password");
        assert_eq!(kind("42601"), ErrorKind::Fatal, "syntax error");
        assert_eq!(kind("22003"), ErrorKind::Fatal, "out of range");
        assert_eq!(kind("XX000"), ErrorKind::Retryable, "internal error");
        assert_eq!(kind("25006"), ErrorKind::Retryable, "read-only");
        let stale = Cause::of_sqlstate("0A000", "cached plan must not change result type");
        assert_eq!(stale.decide().0, ErrorKind::Retryable);
        assert!(stale.decide().1, "a stale plan's connection is dropped");
        assert_eq!(kind("0A000"), ErrorKind::Fatal);
        // What PgBouncer answers (1.18: an `options` startup parameter; transaction mode
        // without prepared-statement tracking): not retried for ever, and said what to do.
        let pooler = Cause::of_sqlstate("08P01", "unsupported startup parameter: options");
        assert_eq!(pooler.decide().0, ErrorKind::Fatal);
        assert!(pooler.decide().2.contains("ignore_startup_parameters"));
        assert_eq!(
            kind("08P01"),
            ErrorKind::Retryable,
            "another protocol violation"
        );
        let lost = Cause::of_sqlstate("26000", "prepared statement \"s4\" does not exist");
        assert_eq!(lost.decide().0, ErrorKind::Fatal);
        assert!(lost.decide().2.contains("max_prepared_statements"));
    }

    #[test]
    fn a_failing_statement_is_its_writes_fault_or_the_stores() {
        let fault = |code: &str| Fault::of_sqlstate(code, "");
        for refused in [
            "23505", "23503", "23514", "23502", "23P01", "44000", "P0001",
        ] {
            assert_eq!(fault(refused), Fault::Refused, "{refused}");
        }
        for invalid in ["22P02", "22003", "22001", "21000", "54000"] {
            assert_eq!(fault(invalid), Fault::Invalid, "{invalid}");
        }
        // The same for every record: stalls the shard, gives no record up.
        for statement in ["42601", "42703", "42804", "42883", "0A000"] {
            assert!(matches!(fault(statement), Fault::Store(_)), "{statement}");
        }
        let kind = |code: &str| match fault(code) {
            Fault::Store(cause) => Some(cause.decide().0),
            _ => None,
        };
        assert_eq!(kind("42P01"), Some(ErrorKind::NotFound), "no table");
        assert_eq!(kind("42501"), Some(ErrorKind::Fatal), "no privilege");
        assert_eq!(kind("42704"), Some(ErrorKind::Fatal), "no object");
        for retried in ["40001", "40P01", "55P03", "57014", "57P01", "08006"] {
            assert_eq!(kind(retried), Some(ErrorKind::Retryable), "{retried}");
        }
        assert_eq!(
            kind("53300"),
            Some(ErrorKind::Throttled),
            "too many connections"
        );
        let stale = Fault::of_sqlstate("0A000", "cached plan must not change result type");
        assert_eq!(stale, Fault::Store(Cause::StalePlan));
    }

    #[test]
    fn a_data_exception_is_said_without_its_values() {
        let said = unquoted(r#"value "12345678901" is out of range for type integer"#);
        assert_eq!(said, r#"value "…" is out of range for type integer"#);
        let said = unquoted(r#"invalid input syntax for type integer: "a"b""#);
        assert_eq!(said, r#"invalid input syntax for type integer: "…""#);
        let said = unquoted(r#"malformed array literal: "{1,"#);
        assert_eq!(said, r#"malformed array literal: "…"#);
    }

    #[test]
    fn a_busy_pool_is_throttled() {
        let busy = Cause::of_pool(&PoolError::Timeout(TimeoutType::Wait));
        assert_eq!(busy.decide().0, ErrorKind::Throttled);
        let slow = Cause::of_pool(&PoolError::Timeout(TimeoutType::Create));
        assert_eq!(slow.decide().0, ErrorKind::Retryable);
    }
}
