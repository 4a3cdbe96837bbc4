//! `--exactly-once-table`: where each window's counts commit with its checkpoint. The
//! table is written in the transactions of the lease store (DynamoDB's, or Postgres's) or of
//! a Postgres sink, so it is checked against the lease table, the backend and the store
//! here, each refusal naming the key.

use kcl_serve::source::is_table_name;

use super::store::PostgresUrl;
use super::{Backend, RunArgs, SettingsError, Values};

/// The table of exactly-once window counts: a DynamoDB table other than the lease table,
/// written in the lease store's transactions, so backend aws only; or, with the leases in
/// Postgres or `--exactly-once-store`, a Postgres table (and its `_positions` table) of
/// that database, named by a plain SQL identifier.
pub(super) fn table(
    a: &RunArgs,
    v: &Values<'_>,
    application_name: &str,
    postgres: Option<(&str, &PostgresUrl)>,
) -> Result<Option<String>, SettingsError> {
    let Some(table) = a.exactly_once_table.as_deref() else {
        return Ok(None);
    };
    let table = v.required("exactly_once_table", Some(table))?;
    if let Some((key, url)) = postgres {
        super::store::plain_tcp(v, key, url)?;
        return sql_name(v, table);
    }
    if !is_table_name(&table) {
        return Err(v.fail(
            "exactly_once_table",
            format!("{table:?} is not a valid DynamoDB table name (3 to 255 of a-z A-Z 0-9 _ - .)"),
        ));
    }
    if table == application_name {
        return Err(v.fail(
            "exactly_once_table",
            format!(
                "{table:?} is the lease table (application-name): the counts need a table of \
                 their own"
            ),
        ));
    }
    if a.backend == Backend::Memory || cfg!(not(feature = "aws")) {
        return Err(v.fail(
            "exactly_once_table",
            "needs backend aws: the counts commit in a transaction of the DynamoDB lease \
             store, which backend memory (and a build without feature `aws`) does not have"
                .into(),
        ));
    }
    Ok(Some(table))
}

/// The longest name of a Postgres window table: its positions table's name (`_positions`
/// added) must fit Postgres's 63 bytes.
const SQL_NAME_MAX: usize = 63 - "_positions".len();

/// A Postgres window table's name: lowercase letters, digits and `_`, not starting with a
/// digit (so it needs no quoting anywhere), at most [`SQL_NAME_MAX`] long, and neither it nor
/// its positions table one of kcl-postgres's own.
fn sql_name(v: &Values<'_>, table: String) -> Result<Option<String>, SettingsError> {
    let plain = table
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && table.chars().next().is_some_and(|c| !c.is_ascii_digit())
        && table.len() <= SQL_NAME_MAX;
    if !plain {
        return Err(v.fail(
            "exactly_once_table",
            format!(
                "{table:?} is not a plain Postgres table name: 1 to {SQL_NAME_MAX} of a-z 0-9 \
                 _, not starting with a digit (the table NAME_positions goes with it)"
            ),
        ));
    }
    let positions = format!("{table}_positions");
    if ["kcl_leases", "kcl_positions"].contains(&table.as_str()) || positions == "kcl_positions" {
        return Err(v.fail(
            "exactly_once_table",
            format!("{table:?} would share a name with kcl-postgres's own tables: choose another"),
        ));
    }
    Ok(Some(table))
}
