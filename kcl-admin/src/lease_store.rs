//! Where the leases are: the DynamoDB table named by the application (the default, as for
//! KCL Java), or the application's rows of the table `kcl_leases` in Postgres
//! (`--lease-store postgres://…`, [`kcl_postgres::PostgresLeaseStore`]). The streams stay
//! where they are (Kinesis, or DynamoDB Streams) either way.
//!
//! `leases`, `reset` and `release` are written over [`LeaseStore`] and run on either store;
//! `copy` and `remove-kcl-rows` work on DynamoDB tables only (a rename between DynamoDB
//! tables, the way back to KCL Java) and refuse a Postgres store rather than quietly use
//! DynamoDB. An admin command never creates a table: the Postgres store is opened with
//! [`TableSetup::External`], and a missing table is named with the file that creates it.
//!
//! The URL may hold a password: it is kept out of `Debug`, of `--help` (the environment's
//! value is hidden) and of every message, which show it through
//! [`kcl_postgres::redacted_url`]. It is read as a plain string and checked here, not by
//! clap, whose refusal of a value would print it whole.

use kcl_aws::DynamoDbLeaseStore;
use kcl_core::{ErrorKind, LeaseStore, TableFeatures};
use kcl_postgres::{PostgresLeaseStore, TableSetup, redacted_url};

/// The file that creates the Postgres lease table, named when it is missing.
const SCHEMA_FILE: &str = "kcl-postgres/schema.sql";

/// `--lease-store` as given; shown only through [`redacted_url`].
#[derive(Clone)]
pub(crate) struct StoreUrl(String);

impl From<String> for StoreUrl {
    fn from(url: String) -> Self {
        Self(url)
    }
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redacted_url(&self.0))
    }
}

/// The flag that says where the leases are, shared by the commands that read them.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StoreArgs {
    /// Where the leases are: by default (or `dynamodb`) the DynamoDB table named by the
    /// application; or a Postgres URL (`postgres://user:password@host:5432/db?sslmode=verify-full`,
    /// `postgresql://…`): the application's rows of the table kcl_leases, as the workers of
    /// kcl-postgres keep them. Never shown with its password.
    #[arg(
        long,
        value_name = "URL",
        env = "KCL_LEASE_STORE",
        hide_env_values = true
    )]
    lease_store: Option<StoreUrl>,
}

/// A lease store, opened.
pub(crate) enum Store {
    DynamoDb(DynamoDbLeaseStore),
    Postgres(PostgresLeaseStore),
}

/// Where `--lease-store` points.
enum Place<'a> {
    DynamoDb,
    Postgres(&'a str),
}

impl StoreArgs {
    fn place(&self) -> anyhow::Result<Place<'_>> {
        let Some(StoreUrl(url)) = &self.lease_store else {
            return Ok(Place::DynamoDb);
        };
        let url = url.trim();
        if url == "dynamodb" {
            return Ok(Place::DynamoDb);
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Place::Postgres(url));
        }
        anyhow::bail!(
            "invalid --lease-store {}: want a URL postgres://… or postgresql://… (or dynamodb, \
             the default)",
            redacted_url(url)
        )
    }

    /// Where `application`'s leases are, for messages.
    pub(crate) fn describe(&self, application: &str) -> String {
        match self.place() {
            Ok(Place::Postgres(url)) => format!(
                "kcl_leases of {} (application {application})",
                redacted_url(url)
            ),
            _ => format!("the DynamoDB table {application}"),
        }
    }

    /// The store of `application`'s leases, changed by nobody but these commands. A Postgres
    /// store is checked at once: the server answers and has the table.
    pub(crate) async fn open(
        &self,
        sdk: &aws_config::SdkConfig,
        application: &str,
    ) -> anyhow::Result<Store> {
        match self.place()? {
            Place::DynamoDb => Ok(Store::DynamoDb(crate::store(sdk, application))),
            Place::Postgres(url) => Ok(Store::Postgres(postgres(url, application).await?)),
        }
    }

    /// Refuses a Postgres store for `command`, which works on DynamoDB tables only
    /// (`why`), before it reads or writes anything.
    pub(crate) fn dynamodb_only(&self, command: &str, why: &str) -> anyhow::Result<()> {
        match self.place()? {
            Place::DynamoDb => Ok(()),
            Place::Postgres(url) => anyhow::bail!(
                "{command} works on DynamoDB lease tables only ({why}): not with --lease-store \
                 {}. Nothing was read or written",
                redacted_url(url)
            ),
        }
    }
}

/// The store of `application`'s rows in the database of `url`, its table checked, created
/// never.
async fn postgres(url: &str, application: &str) -> anyhow::Result<PostgresLeaseStore> {
    let shown = redacted_url(url);
    let store = PostgresLeaseStore::builder(url, application)
        .table_setup(TableSetup::External)
        .pool_size(2)
        .build()
        .map_err(|e| anyhow::anyhow!("--lease-store {shown}: {}", kcl_core::error_chain(&e)))?;
    match store.ensure_table(TableFeatures::NONE).await {
        Ok(_) => Ok(store),
        // 42P01, the one error of kind NotFound here.
        Err(e) if e.kind() == ErrorKind::NotFound => anyhow::bail!(
            "--lease-store {shown}: the database has no lease table kcl_leases (none on the \
             connection's search_path). Create it with {SCHEMA_FILE} (the workers do when they \
             start, unless built with TableSetup::External; kcl-admin never creates it), or \
             name the database the fleet uses"
        ),
        Err(e) => anyhow::bail!("--lease-store {shown}: {}", kcl_core::error_chain(&e)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        store: StoreArgs,
    }

    fn args(given: &[&str]) -> StoreArgs {
        let argv = ["kcl-admin"].iter().chain(given);
        Cli::try_parse_from(argv).unwrap().store
    }

    #[test]
    fn the_url_is_never_shown_with_its_password() {
        let url = "postgres://kcl:hunter2@db:5432/kcl?sslmode=require";
        let given = args(&["--lease-store", url]);
        assert!(matches!(given.place().unwrap(), Place::Postgres(u) if u == url));
        assert!(!format!("{given:?}").contains("hunter2"));
        let refused = given.dynamodb_only("copy", "a rename of DynamoDB tables");
        let text = format!("{:#}", refused.err().unwrap());
        assert!(text.contains("postgres://db:5432/kcl"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        let wrong = args(&["--lease-store", "mysql://kcl:hunter2@db/kcl"]);
        let text = format!("{:#}", wrong.place().err().unwrap());
        assert!(
            text.contains("postgres://") && !text.contains("hunter2"),
            "{text}"
        );
    }

    #[test]
    fn dynamodb_is_the_default() {
        assert!(matches!(args(&[]).place().unwrap(), Place::DynamoDb));
        let named = args(&["--lease-store", "dynamodb"]);
        assert!(matches!(named.place().unwrap(), Place::DynamoDb));
        assert!(named.dynamodb_only("copy", "why").is_ok());
    }
}
