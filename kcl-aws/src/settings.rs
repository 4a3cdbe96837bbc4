//! What a binary's settings choose of the AWS backends, each spelled once for every binary
//! and configuration file: who looks after the lease table ([`TableSetup`]) and how a table
//! created for it is billed ([`TableBilling`]). A value is read in any case, with `_` or `-`
//! between words; a mistake says what was given and what is accepted
//! ([`ParseModeError`]).

use std::str::FromStr;

#[cfg(doc)]
use kcl_core::LeaseStore;
use kcl_core::ParseModeError;

/// How a lease table created by [`LeaseStore::ensure_table`] is billed. An existing table is
/// used as it is.
///
/// Read from `PAY_PER_REQUEST` (or `on-demand`) and `PROVISIONED`, which has
/// [`TableBilling::DEFAULT_CAPACITY`] units of each until set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TableBilling {
    /// On-demand (`PAY_PER_REQUEST`), as KCL Java creates it. The default.
    #[default]
    OnDemand,
    /// Provisioned capacity.
    Provisioned {
        /// Read capacity units.
        read_capacity_units: i64,
        /// Write capacity units.
        write_capacity_units: i64,
    },
}

impl TableBilling {
    /// The read and write capacity units of `PROVISIONED` when none are given.
    pub const DEFAULT_CAPACITY: i64 = 10;
}

/// Who looks after the lease table's shape: its creation, its index and its stream.
///
/// Read from `managed` and `external`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TableSetup {
    /// The default. [`LeaseStore::ensure_table`] creates the table if it is missing (as KCL
    /// Java does) and adds what the worker's coordination uses: under `Coordination::Leader`
    /// the `leaseOwner` index (keys only, as KCL Java 3.x adds it) and a `NEW_IMAGE` stream.
    /// Needs `dynamodb:CreateTable` and `dynamodb:UpdateTable` (see `deploy/iam-policy.json`).
    #[default]
    Managed,
    /// The table is managed elsewhere (Terraform, CloudFormation, a DBA): the store creates
    /// and changes nothing. It uses the index and the stream where the table has them and
    /// reads the whole table where it has not (the worker says so at start); a missing table
    /// is an error naming what to create.
    External,
}

/// `given`, trimmed, in lower case, with `-` between words.
fn word(given: &str) -> String {
    given.trim().to_ascii_lowercase().replace('_', "-")
}

impl FromStr for TableSetup {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match word(s).as_str() {
            "managed" => Ok(Self::Managed),
            "external" => Ok(Self::External),
            _ => Err(ParseModeError {
                given: s.to_owned(),
                expected: "managed or external",
            }),
        }
    }
}

impl FromStr for TableBilling {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match word(s).as_str() {
            "pay-per-request" | "on-demand" => Ok(Self::OnDemand),
            "provisioned" => Ok(Self::Provisioned {
                read_capacity_units: Self::DEFAULT_CAPACITY,
                write_capacity_units: Self::DEFAULT_CAPACITY,
            }),
            _ => Err(ParseModeError {
                given: s.to_owned(),
                expected: "PAY_PER_REQUEST or PROVISIONED",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_read_in_any_case_and_mistakes_say_what_is_accepted() {
        assert_eq!("External".parse(), Ok(TableSetup::External));
        assert_eq!("pay_per_request".parse(), Ok(TableBilling::OnDemand));
        assert!(matches!(
            "PROVISIONED".parse(),
            Ok(TableBilling::Provisioned {
                read_capacity_units: 10,
                write_capacity_units: 10
            })
        ));
        assert_eq!(
            "extern".parse::<TableSetup>().map_err(|e| e.to_string()),
            Err(r#"expected managed or external, got "extern""#.to_owned())
        );
    }
}
