//! `--lease-store` and `--exactly-once-store`: where the leases are kept (DynamoDB, or
//! Postgres through kcl-postgres), and where the exactly-once window table is. A Postgres
//! URL may carry a password: it is kept in a [`PostgresUrl`], which shows itself redacted,
//! and no refusal here quotes it.

use std::fmt;

use super::{Backend, RunArgs, SettingsError, Values};

/// A Postgres connection string (`postgres://…`); shown without its user information and
/// query, which may hold the password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct PostgresUrl(String);

impl PostgresUrl {
    /// The whole string, for the client only.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redacted(&self.0))
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PostgresUrl({self})")
    }
}

#[cfg(feature = "postgres")]
fn redacted(url: &str) -> String {
    kcl_postgres::redacted_url(url)
}

#[cfg(not(feature = "postgres"))]
fn redacted(url: &str) -> String {
    super::endpoints::shown(url)
}

/// Where the leases are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Leases {
    /// The DynamoDB table of the application's name.
    DynamoDb,
    /// The application's rows of `kcl_leases` in this database.
    Postgres(PostgresUrl),
}

/// A value that may be a connection string, as an error may quote it: a URL redacted, a
/// libpq `key=value` string not at all, a word as it is.
fn quoted(value: &str) -> String {
    if value.contains("://") {
        format!("{:?}", redacted(value))
    } else if value.contains(['=', '@', ':']) {
        "a connection string".to_owned()
    } else {
        format!("{value:?}")
    }
}

fn is_postgres_url(value: &str) -> bool {
    value.starts_with("postgres://") || value.starts_with("postgresql://")
}

/// `--lease-store`: `dynamodb`, or a Postgres URL (backend aws, a build with feature
/// `postgres`).
pub(super) fn leases(a: &RunArgs, v: &Values<'_>) -> Result<Leases, SettingsError> {
    let given = a.lease_store.trim();
    if given.eq_ignore_ascii_case("dynamodb") {
        return Ok(Leases::DynamoDb);
    }
    let url = postgres_url(v, "lease_store", given, "`dynamodb` or ")?;
    if a.backend == Backend::Memory {
        return Err(v.fail(
            "lease_store",
            "backend memory keeps its leases in the process: a Postgres lease store needs \
             backend aws (the stream is read from Kinesis)"
                .into(),
        ));
    }
    Ok(Leases::Postgres(url))
}

/// `value` of `key` as a Postgres URL, in a build that has Postgres; `or` is what else the
/// key takes, for the refusal.
fn postgres_url(
    v: &Values<'_>,
    key: &str,
    value: &str,
    or: &str,
) -> Result<PostgresUrl, SettingsError> {
    if !is_postgres_url(value) {
        return Err(v.fail(
            key,
            format!(
                "expected {or}a URL postgres://USER:PASSWORD@HOST:PORT/DATABASE, got {}",
                quoted(value)
            ),
        ));
    }
    if cfg!(not(feature = "postgres")) {
        return Err(v.fail(
            key,
            "this build has no Postgres: build with `--features postgres` (a default feature)"
                .into(),
        ));
    }
    Ok(PostgresUrl(value.to_owned()))
}

/// `--exactly-once-store`: with the leases in DynamoDB and an `--exactly-once-table`, the
/// Postgres database the table is kept in.
pub(super) fn exactly_once_store(
    a: &RunArgs,
    v: &Values<'_>,
    leases: &Leases,
) -> Result<Option<PostgresUrl>, SettingsError> {
    let Some(given) = a.exactly_once_store.as_deref().map(str::trim) else {
        return Ok(None);
    };
    let url = postgres_url(v, "exactly_once_store", given, "")?;
    if a.exactly_once_table.is_none() {
        return Err(v.fail(
            "exactly_once_store",
            "only used with exactly-once-table: name the table to keep there".into(),
        ));
    }
    if let Leases::Postgres(_) = leases {
        return Err(v.fail(
            "exactly_once_store",
            "with lease-store postgres the exactly-once table is a table of the lease \
             database, committed with the lease row: drop exactly-once-store"
                .into(),
        ));
    }
    Ok(Some(url))
}

/// Refuses an `sslmode` that needs TLS for the window table's own connection (its reads and
/// setup): kcl-postgres lends none of its connections, and this example's are plain TCP.
pub(super) fn plain_tcp(v: &Values<'_>, key: &str, url: &PostgresUrl) -> Result<(), SettingsError> {
    let query = url.0.rsplit_once('@').map_or(url.0.as_str(), |(_, h)| h);
    let params = query.split_once('?').map_or("", |(_, q)| q);
    for (name, value) in params.split('&').filter_map(|p| p.split_once('=')) {
        let fine = match name {
            "sslmode" => matches!(value, "disable" | "prefer"),
            "sslrootcert" | "sslcert" | "sslkey" => false,
            _ => true,
        };
        if !fine {
            return Err(v.fail(
                key,
                format!(
                    "{name}={value} with exactly-once-table: the table's reads and setup go \
                     over this example's own plain-TCP connection (kcl-postgres lends none of \
                     its pool), so only sslmode disable or prefer work for it (the leases and \
                     the commits take any sslmode); reach the database without TLS, or keep \
                     the table and the leases in DynamoDB"
                ),
            ));
        }
    }
    Ok(())
}
