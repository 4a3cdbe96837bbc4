//! `--lease-store` and `--exactly-once-store`: a Postgres URL taken from a flag or the
//! config file, never shown with its password, and the combinations that cannot work
//! refused, naming the key.

use super::*;

const URL: &str = "postgres://kcl:PGPASS@db.internal:5432/kcl?application_name=x";

fn postgres(extra: &[&str]) -> Result<Settings, SettingsError> {
    settings(&[REQUIRED, extra].concat(), None)
}

/// Neither the effective settings nor `--print-config` show the password.
fn hides_the_password(s: &Settings, key: &str) {
    let text = s.to_toml_with(&|_| None);
    assert!(!text.contains("PGPASS"), "{text}");
    let shown = format!("{} = \"postgres://db.internal:5432/kcl\"", kebab(key));
    assert!(text.contains(&shown), "{text}");
    assert!(!format!("{s:?}").contains("PGPASS"), "{s:?}");
}

#[test]
fn the_lease_store_is_dynamodb_unless_a_postgres_url_is_given() {
    let s = resolve_ok(REQUIRED, None);
    assert_eq!(s.lease_store, Leases::DynamoDb);
    let text = s.to_toml_with(&|_| None);
    assert!(
        text.contains("lease-store = \"dynamodb\"  # default"),
        "{text}"
    );
    let given = postgres(&["--lease-store", URL]);
    let file = toml_file(&format!("lease-store = \"{URL}\"\n"));
    for s in [given, settings(REQUIRED, Some(&file))] {
        let s = match s {
            Err(e) if cfg!(not(feature = "postgres")) => {
                assert!(e.reason.contains("--features postgres"), "{e}");
                assert!(!e.to_string().contains("PGPASS"), "{e}");
                continue;
            }
            other => other.unwrap_or_else(|e| panic!("{e}")),
        };
        assert!(matches!(&s.lease_store, Leases::Postgres(url) if url.expose() == URL));
        hides_the_password(&s, "lease_store");
        // No DynamoDB is called: the endpoints list the stream only.
        let text = s.to_toml_with(&|_| None);
        assert!(!text.contains("# dynamodb"), "{text}");
    }
}

#[test]
fn a_lease_store_that_cannot_work_is_refused_without_its_password() {
    let cases: [(&[&str], &str); 3] = [
        (
            &["--lease-store", "mysql://kcl:PGPASS@db/kcl"],
            "expected `dynamodb` or a URL postgres://",
        ),
        (
            &["--lease-store", "host=db password=PGPASS"],
            "got a connection string",
        ),
        (
            &["--lease-store", URL, "--backend", "memory"],
            "needs backend aws",
        ),
    ];
    for (extra, reason) in cases {
        let e = resolve_err(&[REQUIRED, extra].concat(), None);
        assert_eq!(e.key, "lease_store", "{e}");
        let shown = e.to_string();
        assert!(!shown.contains("PGPASS"), "{shown}");
        // A build without Postgres refuses any Postgres URL first.
        let reason = if cfg!(not(feature = "postgres")) && extra.contains(&URL) {
            "--features postgres"
        } else {
            reason
        };
        assert!(e.reason.contains(reason), "{e}");
    }
}

#[cfg(feature = "postgres")]
#[test]
fn the_exactly_once_table_goes_to_postgres_with_the_leases_or_the_store() {
    // In the lease database: a plain SQL name.
    let s = postgres(&[
        "--lease-store",
        URL,
        "--exactly-once-table",
        "window_counts",
    ]);
    let s = s.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.exactly_once_table.as_deref(), Some("window_counts"));
    assert_eq!(s.exactly_once_store, None);
    // Beside DynamoDB leases: the DynamoDB endpoint for the lease table only.
    let args = [
        "--exactly-once-table",
        "window_counts",
        "--exactly-once-store",
        URL,
    ];
    let s = postgres(&args).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(&s.exactly_once_store, Some(url) if url.expose() == URL));
    hides_the_password(&s, "exactly_once_store");
    let text = s.to_toml_with(&|_| None);
    assert!(text.contains("# dynamodb (the lease table):"), "{text}");
}

#[cfg(feature = "postgres")]
#[test]
fn an_exactly_once_table_in_postgres_that_cannot_work_is_refused() {
    let with_table = |table: &'static str| ["--exactly-once-table", table];
    let tls = format!("{URL}&sslmode=verify-full");
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        (
            vec!["--exactly-once-store", URL],
            "exactly_once_store",
            "only used with exactly-once-table",
        ),
        (
            [
                &with_table("t")[..],
                &["--lease-store", URL, "--exactly-once-store", URL],
            ]
            .concat(),
            "exactly_once_store",
            "drop exactly-once-store",
        ),
        (
            [&with_table("t")[..], &["--exactly-once-store", &tls]].concat(),
            "exactly_once_store",
            "sslmode=verify-full",
        ),
        (
            [&with_table("window-counts")[..], &["--lease-store", URL]].concat(),
            "exactly_once_table",
            "not a plain Postgres table name",
        ),
        (
            [&with_table("kcl")[..], &["--lease-store", URL]].concat(),
            "exactly_once_table",
            "kcl-postgres's own tables",
        ),
    ];
    for (extra, key, reason) in cases {
        let e = resolve_err(&[REQUIRED, &extra].concat(), None);
        assert_eq!(e.key, key, "{e}");
        assert!(e.reason.contains(reason), "{e}");
        assert!(!e.to_string().contains("PGPASS"), "{e}");
    }
}
