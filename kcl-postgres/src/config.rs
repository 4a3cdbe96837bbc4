//! Building a store: the connection string, the pool, TLS, timeouts and who looks after the
//! table. Nothing here reads the environment: the application hands the URL over (from its
//! own settings), and the URL's password never reaches a log line or an error (the builder's
//! `Debug` leaves it out, and tokio-postgres's configuration redacts it).

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, Pool, Runtime};
use kcl_core::{BackendError, ParseModeError};
use percent_encoding::percent_decode_str;

use crate::PostgresLeaseStore;
use crate::error::ConfigError;
use crate::tls::{self, TlsMode};

/// Who looks after the lease table's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TableSetup {
    /// The default. [`ensure_table`](kcl_core::LeaseStore::ensure_table) runs `schema.sql`
    /// (the tables and the owner index) under an advisory lock when one of them is missing.
    /// The role needs `CREATE` on the schema then (and to own `kcl_leases` if it exists
    /// without its index); once they all exist, only the External grants.
    #[default]
    Managed,
    /// The schema is managed elsewhere (migrations, a DBA applying `schema.sql`): the store
    /// creates nothing, checks that the table has every column it uses, and uses the owner
    /// index if there is one. The role needs only `SELECT, INSERT, UPDATE, DELETE` on
    /// `kcl_leases`.
    External,
}

impl FromStr for TableSetup {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "managed" => Ok(Self::Managed),
            "external" => Ok(Self::External),
            _ => Err(ParseModeError {
                given: s.to_owned(),
                expected: "managed or external",
            }),
        }
    }
}

/// A connection string, kept out of `Debug` (it may hold a password).
#[derive(Clone)]
struct Url(String);

impl std::fmt::Debug for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<connection string>")
    }
}

/// Builds a [`PostgresLeaseStore`]: [`PostgresLeaseStore::builder`].
#[derive(Debug, Clone)]
pub struct PostgresLeaseStoreBuilder {
    url: Url,
    application: String,
    pool_size: usize,
    tls: Option<TlsMode>,
    roots_pem: Option<Vec<u8>>,
    setup: TableSetup,
    statement_timeout: Duration,
    connect_timeout: Duration,
    pool_wait: Duration,
}

impl PostgresLeaseStoreBuilder {
    pub(crate) fn new(url: &str, application: &str) -> Self {
        Self {
            url: Url(url.to_owned()),
            application: application.to_owned(),
            pool_size: 8,
            tls: None,
            roots_pem: None,
            setup: TableSetup::Managed,
            statement_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            pool_wait: Duration::from_secs(5),
        }
    }

    /// The most connections the store holds (default 8). A worker's calls are short (one
    /// statement each) and a few at a time: renewals of its leases, a checkpoint, a read of
    /// the table.
    #[must_use]
    pub fn pool_size(mut self, connections: usize) -> Self {
        self.pool_size = connections.max(1);
        self
    }

    /// How connections are encrypted, over the URL's `sslmode` (default: the URL's, else
    /// [`TlsMode::Prefer`], libpq's default).
    #[must_use]
    pub fn tls(mut self, mode: TlsMode) -> Self {
        self.tls = Some(mode);
        self
    }

    /// The roots that sign the server's certificate under `verify-ca` and `verify-full`, in
    /// PEM (a cloud provider's CA bundle), instead of the system's or the URL's
    /// `sslrootcert` file.
    #[must_use]
    pub fn root_certificates_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.roots_pem = Some(pem.into());
        self
    }

    /// Who looks after the table (default [`TableSetup::Managed`]).
    #[must_use]
    pub fn table_setup(mut self, setup: TableSetup) -> Self {
        self.setup = setup;
        self
    }

    /// The server's `statement_timeout` on the store's connections (default 10 s), unless
    /// the URL's `options` set one. The worker bounds each call by its own `call_timeout`;
    /// this ends the statement on the server too.
    #[must_use]
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// How long opening a connection may take (default 5 s), unless the URL's
    /// `connect_timeout` says.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a call waits for a free connection of the pool (default 5 s) before it
    /// fails as throttled.
    #[must_use]
    pub fn pool_wait(mut self, timeout: Duration) -> Self {
        self.pool_wait = timeout;
        self
    }

    /// The store, its pool empty: the first call connects. Fails (as `Fatal`) on a
    /// connection string, `sslmode` or root certificate it cannot use.
    pub fn build(self) -> Result<PostgresLeaseStore, BackendError> {
        self.pool()
            .map(|pool| PostgresLeaseStore::new(pool, self.application, self.setup))
            .map_err(ConfigError::into_backend)
    }

    /// The store, once one connection could be opened: a wrong password or an unreachable
    /// server is reported here, with its kind (`Retryable` for a server not up yet).
    pub async fn connect(self) -> Result<PostgresLeaseStore, BackendError> {
        let store = self.build()?;
        store.check_connection().await?;
        Ok(store)
    }

    fn pool(&self) -> Result<Pool, ConfigError> {
        if self.application.is_empty() {
            return Err(ConfigError::NoApplication);
        }
        let (rest, params) = take_tls_params(&self.url.0);
        let mut pg = tokio_postgres::Config::from_str(&rest).map_err(ConfigError::Url)?;
        let from_url = params.mode.as_deref().map(TlsMode::from_str).transpose();
        let mode = self
            .tls
            .or(from_url.map_err(ConfigError::SslMode)?)
            .unwrap_or_default();
        pg.ssl_mode(mode.wire());
        let roots = match (&self.roots_pem, &params.root_cert) {
            (Some(pem), _) => Some(pem.clone()),
            (None, Some(path)) => {
                Some(std::fs::read(path).map_err(|source| ConfigError::RootFile {
                    path: path.clone(),
                    source,
                })?)
            }
            (None, None) => None,
        };
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(self.connect_timeout);
        }
        if pg.get_application_name().is_none() {
            pg.application_name("kcl");
        }
        let options = pg.get_options().unwrap_or_default().to_owned();
        if !options.contains("statement_timeout") {
            let ms = self.statement_timeout.as_millis();
            let ours = format!("-c statement_timeout={ms}");
            pg.options(format!("{options} {ours}").trim());
        }
        // A commit's transaction whose client went silent (a partition, a stopped process)
        // would hold its rows' locks, the lease row's among them, until TCP gave up on it.
        let options = pg.get_options().unwrap_or_default().to_owned();
        if !options.contains("idle_in_transaction_session_timeout") {
            let ms = crate::outputs::IDLE_IN_COMMIT.as_millis();
            let ours = format!("-c idle_in_transaction_session_timeout={ms}");
            pg.options(format!("{options} {ours}").trim());
        }
        let connect = tls::connector(mode, roots.as_deref())?;
        let create = *pg.get_connect_timeout().unwrap_or(&self.connect_timeout);
        Pool::builder(Manager::new(pg, connect))
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(self.pool_wait))
            .create_timeout(Some(create + Duration::from_secs(1)))
            .recycle_timeout(Some(self.connect_timeout))
            .build()
            .map_err(ConfigError::Pool)
    }
}

/// What of TLS the connection string says that this crate reads itself: tokio-postgres
/// knows neither `verify-ca` and `verify-full` nor `sslrootcert`.
#[derive(Debug, Default, PartialEq, Eq)]
struct TlsParams {
    mode: Option<String>,
    root_cert: Option<String>,
}

impl TlsParams {
    /// Takes `key`'s value if it is one of ours.
    fn take(&mut self, key: &str, value: String) -> bool {
        match key {
            "sslmode" => self.mode = Some(value),
            "sslrootcert" => self.root_cert = Some(value),
            _ => return false,
        }
        true
    }
}

/// The connection string without `sslmode` and `sslrootcert`, and their values. A URL
/// (`postgres://…?sslmode=verify-full`) or libpq's `key=value` words.
fn take_tls_params(url: &str) -> (String, TlsParams) {
    let mut params = TlsParams::default();
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    if is_url {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_owned(), params);
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode_str(key).decode_utf8_lossy();
            let value = percent_decode_str(value).decode_utf8_lossy().into_owned();
            if !params.take(&key, value) {
                kept.push(pair);
            }
        }
        let rest = match kept.is_empty() {
            true => base.to_owned(),
            false => format!("{base}?{}", kept.join("&")),
        };
        return (rest, params);
    }
    let mut rest = String::new();
    for word in words(url) {
        let (key, value) = word.split_once('=').unwrap_or((word, ""));
        if !params.take(key.trim(), unquote(value)) {
            rest.push_str(word);
            rest.push(' ');
        }
    }
    (rest.trim_end().to_owned(), params)
}

/// The `key=value` words of a libpq connection string, quotes and escapes kept.
fn words(s: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let (mut start, mut quoted, mut escaped) = (None, false, false);
    for (i, c) in s.char_indices() {
        if start.is_none() {
            if c.is_whitespace() {
                continue;
            }
            start = Some(i);
        }
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '\'' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                words.extend(start.take().map(|from| &s[from..i]));
            }
            _ => {}
        }
    }
    words.extend(start.map(|from| &s[from..]));
    words
}

/// A value as libpq reads it: without its quotes and escapes.
fn unquote(value: &str) -> String {
    let inner = value
        .strip_prefix('\'')
        .and_then(|v| v.strip_suffix('\''))
        .unwrap_or(value);
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.extend(if c == '\\' { chars.next() } else { Some(c) });
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use kcl_core::ErrorKind;

    #[test]
    fn tls_params_come_off_a_url() {
        let (rest, params) = take_tls_params(
            "postgres://u:p%3Fw@db:5432/kcl?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u:p%3Fw@db:5432/kcl?application_name=x");
        assert_eq!(params.mode.as_deref(), Some("verify-full"));
        assert_eq!(params.root_cert.as_deref(), Some("/etc/ca.pem"));
        let (rest, params) = take_tls_params("postgresql://db/kcl?sslmode=require");
        assert_eq!(rest, "postgresql://db/kcl");
        assert_eq!(params.mode.as_deref(), Some("require"));
        let (rest, params) = take_tls_params("postgres://db/kcl");
        assert_eq!(
            (rest.as_str(), params),
            ("postgres://db/kcl", TlsParams::default())
        );
    }

    #[test]
    fn tls_params_come_off_key_value_words() {
        let (rest, params) = take_tls_params(
            "host=db password='a b\\'c' sslmode=verify-ca  sslrootcert='/ca dir/ca.pem' dbname=kcl",
        );
        assert_eq!(rest, "host=db password='a b\\'c' dbname=kcl");
        assert_eq!(params.mode.as_deref(), Some("verify-ca"));
        assert_eq!(params.root_cert.as_deref(), Some("/ca dir/ca.pem"));
    }

    #[test]
    fn a_bad_connection_string_is_fatal_without_its_password() {
        let built =
            PostgresLeaseStore::builder("postgres://u:hunter2@db:notaport/kcl", "app").build();
        let error = built.err().unwrap();
        assert_eq!(error.kind(), ErrorKind::Fatal);
        let text = kcl_core::error_chain(&error);
        assert!(!text.contains("hunter2"), "{text}");
        let built = PostgresLeaseStore::builder("postgres://db/kcl?sslmode=verify", "app").build();
        assert!(built.err().unwrap().to_string().contains("verify-full"));
    }

    #[test]
    fn the_builder_debug_hides_the_url() {
        let builder = PostgresLeaseStore::builder("postgres://u:hunter2@db/kcl", "app");
        assert!(!format!("{builder:?}").contains("hunter2"));
    }
}
