//! [`Sql`]: one statement of the processor's with its values, the write of a commit into
//! Postgres.
//!
//! The core retries a commit with the same writes, so a write is cheap to clone: the
//! statement and each value are shared, not copied. A value is any `ToSql` (bound as a
//! parameter, never spliced into the text, so no value can change what the statement does).
//! Values may be personal data: `Debug` shows the statement and how many values, never a
//! value, and no error of a commit quotes one.

use std::fmt::{self, Write as _};
use std::sync::Arc;

use tokio_postgres::types::ToSql;

/// One SQL statement of the processor's with the values of its parameters (`$1`, `$2`, …):
/// a write of [`Transact`](kcl_core::outputs::Transact) on Postgres, committed in one
/// transaction with the checkpoint of the records it is an output of.
///
/// ```
/// use kcl_postgres::Sql;
/// let order_id = 42_i64;
/// let total = String::from("19.90");
/// let write = Sql::new(
///     "INSERT INTO orders (id, total) VALUES ($1, $2::text::numeric) ON CONFLICT (id) DO NOTHING",
/// )
/// .bind(order_id)
/// .bind(total);
/// assert_eq!(write.param_count(), 2);
/// // Debug never shows a value.
/// assert!(!format!("{write:?}").contains("19.90"));
/// ```
///
/// A statement that names kcl's own tables (`kcl_leases`, `kcl_positions`) is refused as
/// invalid before anything is sent: the checkpoint is kcl's to write, in the same
/// transaction.
#[derive(Clone)]
pub struct Sql {
    statement: Arc<str>,
    params: Vec<Arc<dyn ToSql + Send + Sync>>,
    /// The values' rough size: the length of their `Debug` form.
    param_bytes: usize,
}

impl Sql {
    /// `statement`, with no values bound yet.
    pub fn new(statement: impl Into<Arc<str>>) -> Self {
        Self {
            statement: statement.into(),
            params: Vec::new(),
            param_bytes: 0,
        }
    }

    /// Binds `value` to the next parameter (`$1` first). Its type must be one Postgres
    /// accepts for the parameter (as for `tokio_postgres::Client::execute`): a mismatch
    /// refuses the write as invalid, naming the parameter and both types.
    #[must_use]
    pub fn bind(mut self, value: impl ToSql + Send + Sync + 'static) -> Self {
        let mut counted = Counted(0);
        // A rough size for `measure`: writing into a counter cannot fail.
        let _ = write!(counted, "{value:?}");
        self.param_bytes = self.param_bytes.saturating_add(counted.0);
        self.params.push(Arc::new(value));
        self
    }

    /// The statement.
    pub fn statement(&self) -> &str {
        &self.statement
    }

    /// How many values are bound.
    pub fn param_count(&self) -> usize {
        self.params.len()
    }

    /// The values, as tokio-postgres binds them.
    pub(crate) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| &**p as &(dyn ToSql + Sync))
            .collect()
    }

    /// The statement's length and its values' rough size.
    pub(crate) fn bytes(&self) -> usize {
        self.statement.len().saturating_add(self.param_bytes)
    }

    /// Whether the statement names one of kcl's tables (a word `kcl_leases` or
    /// `kcl_positions`, quoted or not, in any case).
    pub(crate) fn names_kcl_tables(&self) -> bool {
        self.statement
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
            .any(|word| {
                word.eq_ignore_ascii_case("kcl_leases")
                    || word.eq_ignore_ascii_case("kcl_positions")
            })
    }
}

impl fmt::Debug for Sql {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sql")
            .field("statement", &&*self.statement)
            .field("params", &self.params.len())
            .finish()
    }
}

/// Counts what is written to it.
struct Counted(usize);

impl fmt::Write for Counted {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0 = self.0.saturating_add(s.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Sql;

    #[test]
    fn debug_shows_the_statement_and_the_count_never_a_value() {
        let write = Sql::new("INSERT INTO people (name, email) VALUES ($1, $2)")
            .bind("Ada Lovelace")
            .bind(Some("ada@example.com".to_owned()));
        let shown = format!("{write:?}");
        assert!(shown.contains("INSERT INTO people"), "{shown}");
        assert!(shown.contains("params: 2"), "{shown}");
        assert!(
            !shown.contains("Ada") && !shown.contains("example"),
            "{shown}"
        );
    }

    #[test]
    fn its_size_counts_the_statement_and_the_values() {
        let bare = Sql::new("INSERT INTO t (v) VALUES ($1)");
        let bound = bare.clone().bind("x".repeat(1000));
        assert_eq!(bare.bytes(), bare.statement().len());
        assert!(bound.bytes() >= bare.bytes() + 1000, "{}", bound.bytes());
    }

    #[test]
    fn kcl_tables_are_found_as_words() {
        let named = |s: &str| Sql::new(s).names_kcl_tables();
        assert!(named("UPDATE kcl_leases SET checkpoint = $1"));
        assert!(named("update public.\"KCL_POSITIONS\" set checkpoint = $1"));
        assert!(!named("INSERT INTO my_kcl_leases_audit (v) VALUES ($1)"));
        assert!(!named("INSERT INTO orders (id) VALUES ($1)"));
    }
}
