//! `--exactly-once-table`: where each window's counts commit with its checkpoint. The
//! table is written in the transactions of the DynamoDB lease store, so it is checked
//! against the lease table and the backend here, each refusal naming the key.

use kcl_serve::source::is_table_name;

use super::{Backend, RunArgs, SettingsError, Values};

/// The table of exactly-once window counts: a DynamoDB table other than the lease table,
/// written in the lease store's transactions, so backend aws only.
pub(super) fn table(
    a: &RunArgs,
    v: &Values<'_>,
    application_name: &str,
) -> Result<Option<String>, SettingsError> {
    let Some(table) = a.exactly_once_table.as_deref() else {
        return Ok(None);
    };
    let table = v.required("exactly_once_table", Some(table))?;
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
