//! Resolving settings: precedence, defaults, and errors that name the key.

#![allow(clippy::panic)]

use std::ffi::OsString;
use std::path::Path;

use clap::FromArgMatches;

use chrono::{DateTime, Utc};
use kcl_core::{Coordination, InitialPosition, Liveness, Retrieval};

use super::*;
use crate::cli::Cli;

/// `args` (after the program's name) parsed, with `file` laid under them.
fn parsed(args: &[&str], file: Option<&FileValues>) -> Result<ArgMatches, SettingsError> {
    let argv: Vec<OsString> = std::iter::once("kcl-example-consumer")
        .chain(args.iter().copied())
        .map(OsString::from)
        .collect();
    let m = match file {
        Some(file) => layered(&crate::cli::command(), &argv, file),
        None => matches(&crate::cli::command(), &argv).map(|(m, _)| m),
    };
    let m = m.map_err(|f| match f {
        Failure::Settings(e) => e,
        Failure::Clap(e) => panic!("{e}"),
    })?;
    // The derive must accept what the command parsed.
    assert!(Cli::from_arg_matches(&m).is_ok());
    Ok(m)
}

fn toml_file(text: &str) -> FileValues {
    FileValues::parse(Path::new("kcl.toml"), text, false).unwrap_or_else(|e| panic!("{e}"))
}

fn settings(args: &[&str], file: Option<&FileValues>) -> Result<Settings, SettingsError> {
    let m = parsed(args, file)?;
    resolve(m.subcommand_matches("run").unwrap_or(&m), file)
}

fn resolve_ok(args: &[&str], file: Option<&FileValues>) -> Settings {
    settings(args, file).unwrap_or_else(|e| panic!("{e}"))
}

fn resolve_err(args: &[&str], file: Option<&FileValues>) -> SettingsError {
    match settings(args, file) {
        Ok(s) => panic!("expected an error, got {s:?}"),
        Err(e) => e,
    }
}

const REQUIRED: &[&str] = &["--stream", "orders", "--application-name", "orders-app"];

#[test]
fn defaults_apply_without_flags_or_file() {
    let s = resolve_ok(REQUIRED, None);
    let core = WorkerConfig::default();
    assert_eq!(s.worker.failover_time, core.failover_time);
    assert_eq!(s.worker.shutdown_timeout, core.shutdown_timeout);
    assert_eq!(s.worker.max_leases, core.max_leases);
    assert_eq!(s.worker.max_leases_to_steal, core.max_leases_to_steal);
    assert_eq!(s.worker.max_concurrent_reads, core.max_concurrent_reads);
    assert_eq!(s.worker.max_records, core.max_records);
    assert_eq!(
        s.worker.idle_time_between_reads,
        core.idle_time_between_reads
    );
    assert_eq!(s.worker.shard_sync_interval, core.shard_sync_interval);
    assert_eq!(s.worker.initial_position, InitialPosition::TrimHorizon);
    assert_eq!(s.window, Duration::from_secs(60));
    assert_eq!(s.listen, SocketAddr::from(([0, 0, 0, 0], 8080)));
    assert_eq!(s.log_format, LogFormat::Pretty);
    assert_eq!(s.effective["failover_time"].1, Origin::Default);
    assert!(!s.worker_id.is_empty());
}

#[test]
fn file_overrides_defaults_and_flags_override_file() {
    let file = toml_file(
        "stream = \"from-file\"\napplication-name = \"file-app\"\nfailover-time = \"5s\"\n\
         max_leases = 7\nwindow = \"10s\"\nlog-format = \"json\"\n",
    );
    let s = resolve_ok(
        &["--failover-time", "2s", "--stream", "from-flag"],
        Some(&file),
    );
    assert_eq!(s.input, SourceSpec::Stream("from-flag".into()));
    assert_eq!(s.effective["stream"].1, Origin::Flag);
    assert_eq!(s.application_name, "file-app");
    assert_eq!(
        s.effective["application_name"].1,
        Origin::File("kcl.toml".into())
    );
    assert_eq!(s.worker.failover_time, Duration::from_secs(2));
    assert_eq!(s.worker.renew_interval, Duration::from_secs(2) / 3);
    assert_eq!(s.worker.max_leases, 7);
    assert_eq!(s.window, Duration::from_secs(10));
    assert_eq!(s.log_format, LogFormat::Json);
    // Untouched by both: the default.
    assert_eq!(s.worker.shutdown_timeout, Duration::from_secs(30));
    assert_eq!(s.effective["shutdown_timeout"].1, Origin::Default);
}

#[test]
fn the_run_subcommand_resolves_like_the_default_command() {
    let file = toml_file("max-records = 500\n");
    let args = [
        "run",
        "--stream",
        "s",
        "--application-name",
        "app",
        "--max-records",
        "100",
    ];
    let s = resolve_ok(&args, Some(&file));
    assert_eq!(s.worker.max_records, 100);
}

#[test]
fn yaml_files_work_too() {
    let file = FileValues::parse(
        Path::new("kcl.yaml"),
        "stream: arn:aws:kinesis:eu-west-1:123456789012:stream/orders\napplication_name: app\n\
         initial-position: AT_TIMESTAMP\ninitial-timestamp: 2024-05-01T12:00:00Z\nmax-leases: unlimited\n",
        true,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let s = resolve_ok(&[], Some(&file));
    assert_eq!(
        s.input,
        SourceSpec::Stream("arn:aws:kinesis:eu-west-1:123456789012:stream/orders".into())
    );
    let expected = DateTime::parse_from_rfc3339("2024-05-01T12:00:00Z")
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        s.worker.initial_position,
        InitialPosition::AtTimestamp(expected)
    );
    assert_eq!(s.worker.max_leases, usize::MAX);
}

#[test]
fn toml_datetimes_are_accepted_for_the_timestamp() {
    let file = toml_file(
        "stream = \"s\"\napplication-name = \"app\"\ninitial-position = \"AT_TIMESTAMP\"\n\
         initial-timestamp = 2024-05-01T12:00:00Z\n",
    );
    let s = resolve_ok(&[], Some(&file));
    assert!(matches!(
        s.worker.initial_position,
        InitialPosition::AtTimestamp(_)
    ));
}

#[cfg(feature = "aws")]
#[test]
fn the_table_is_managed_unless_external_is_asked_for() {
    use kcl_aws::TableSetup;
    let s = resolve_ok(REQUIRED, None);
    assert_eq!(s.table_setup, TableSetup::Managed);
    let s = resolve_ok(&[REQUIRED, &["--table-setup", "external"]].concat(), None);
    assert_eq!(s.table_setup, TableSetup::External);
    let e = resolve_err(&[REQUIRED, &["--table-setup", "terraform"]].concat(), None);
    assert_eq!(e.key, "table_setup");
    assert!(e.to_string().contains("managed or external"), "{e}");
}

/// `--exactly-once-table`: shown by `--print-config` with the endpoint it is written
/// through; refused on backend memory, as the lease table, or as no table name, each time
/// naming the key.
#[test]
fn the_exactly_once_table_is_a_dynamodb_table_beside_the_lease_table() {
    let s = resolve_ok(REQUIRED, None);
    assert_eq!(s.exactly_once_table, None);
    let given = [REQUIRED, &["--exactly-once-table", "window-counts"]].concat();
    let file = toml_file("exactly-once-table = \"window-counts\"\n");
    for (args, file, origin) in [
        (given.as_slice(), None, "--exactly-once-table"),
        (REQUIRED, Some(&file), "kcl.toml"),
    ] {
        let s = match settings(args, file) {
            Err(e) if cfg!(not(feature = "aws")) => {
                assert_eq!(e.key, "exactly_once_table", "{e}");
                continue;
            }
            other => other.unwrap_or_else(|e| panic!("{e}")),
        };
        assert_eq!(s.exactly_once_table.as_deref(), Some("window-counts"));
        let text = s.to_toml_with(&|_| None);
        assert!(
            text.contains(&format!(
                "exactly-once-table = \"window-counts\"  # {origin}"
            )),
            "{text}"
        );
        assert!(
            text.contains("# dynamodb (the lease table and the exactly-once table):"),
            "{text}"
        );
    }
    let cases: [(&[&str], &str); 3] = [
        (
            &["--exactly-once-table", "orders-app"],
            "is the lease table",
        ),
        (
            &["--exactly-once-table", "no/slashes"],
            "not a valid DynamoDB table name",
        ),
        (
            &["--exactly-once-table", "counts", "--backend", "memory"],
            "needs backend aws",
        ),
    ];
    for (extra, reason) in cases {
        let e = resolve_err(&[REQUIRED, extra].concat(), None);
        assert_eq!(e.key, "exactly_once_table", "{e}");
        assert!(e.reason.contains(reason), "{e}");
        assert!(
            e.to_string()
                .starts_with("invalid setting `exactly-once-table` (from --exactly-once-table)"),
            "{e}"
        );
    }
}

#[test]
fn coordination_is_leader_unless_every_worker_is_asked_for() {
    let s = resolve_ok(REQUIRED, None);
    assert_eq!(s.worker.coordination, Coordination::Leader);
    let s = resolve_ok(
        &[REQUIRED, &["--coordination", "every-worker"]].concat(),
        None,
    );
    assert_eq!(s.worker.coordination, Coordination::EveryWorker);
    let e = resolve_err(&[REQUIRED, &["--coordination", "raft"]].concat(), None);
    assert_eq!(e.key, "coordination");
    assert!(e.to_string().contains("every-worker or leader"), "{e}");
}

#[test]
fn liveness_is_per_lease_unless_heartbeats_are_asked_for() {
    let s = resolve_ok(REQUIRED, None);
    assert_eq!(s.worker.liveness, Liveness::PerLease);
    assert_eq!(s.worker.renew_interval, s.worker.failover_time / 3);
    let s = resolve_ok(&[REQUIRED, &["--liveness", "heartbeat"]].concat(), None);
    assert_eq!(s.worker.liveness, Liveness::Heartbeat);
    assert_eq!(s.worker.renew_interval, s.worker.failover_time / 2);
    let e = resolve_err(&[REQUIRED, &["--liveness", "gossip"]].concat(), None);
    assert_eq!(e.key, "liveness");
    assert!(e.to_string().contains("per-lease or heartbeat"), "{e}");
}

#[test]
fn invalid_values_name_the_key_and_the_source() {
    let e = resolve_err(&[REQUIRED, &["--failover-time", "ten"]].concat(), None);
    assert_eq!(e.key, "failover_time");
    let line = e.to_string();
    assert!(line.contains("`failover-time`"), "{line}");
    assert!(line.contains("--failover-time"), "{line}");
    assert!(line.contains("\"ten\""), "{line}");
    assert!(!line.contains('\n'), "{line}");

    let file = toml_file("max-leases = \"lots\"\n");
    let e = resolve_err(REQUIRED, Some(&file));
    assert_eq!(e.key, "max_leases");
    assert!(e.to_string().contains("kcl.toml"), "{e}");

    let e = resolve_err(&[REQUIRED, &["--max-records", "20000"]].concat(), None);
    assert_eq!(e.key, "max_records");
    assert!(e.to_string().contains("10000"), "{e}");

    let e = resolve_err(&[REQUIRED, &["--failover-time", "10ms"]].concat(), None);
    assert_eq!(e.key, "failover_time");

    let e = resolve_err(
        &[REQUIRED, &["--initial-position", "EARLIEST"]].concat(),
        None,
    );
    assert_eq!(e.key, "initial_position");

    let e = resolve_err(
        &[REQUIRED, &["--initial-position", "AT_TIMESTAMP"]].concat(),
        None,
    );
    assert_eq!(e.key, "initial_timestamp");

    let e = resolve_err(&[REQUIRED, &["--listen", "8080"]].concat(), None);
    assert_eq!(e.key, "listen");

    let e = resolve_err(&[REQUIRED, &["--log-format", "xml"]].concat(), None);
    assert_eq!(e.key, "log_format");

    let e = resolve_err(&["--stream", "s"], None);
    assert_eq!(e.key, "application_name");
    assert!(e.to_string().contains("KCL_APPLICATION_NAME"), "{e}");

    let e = resolve_err(&["--stream", "s", "--application-name", "a b"], None);
    assert_eq!(e.key, "application_name");
}

#[test]
fn streams_select_multi_stream_mode_and_are_checked() {
    let app: &[&str] = &["--application-name", "app"];
    let s = resolve_ok(&[app, &["--streams", "orders, clicks"]].concat(), None);
    let both = vec!["orders".to_owned(), "clicks".to_owned()];
    assert_eq!(
        s.input,
        SourceSpec::Streams {
            names: both.clone(),
            removal_grace: None
        }
    );
    // One stream in multi-stream mode is still multi-stream mode.
    let s = resolve_ok(
        &[
            app,
            &["--streams", "orders", "--stream-removal-grace", "1m"],
        ]
        .concat(),
        None,
    );
    assert_eq!(
        s.input,
        SourceSpec::Streams {
            names: vec!["orders".into()],
            removal_grace: Some(Duration::from_secs(60))
        }
    );
    // A list in a file, TOML or YAML.
    let file = toml_file("streams = [\"orders\", \"clicks\"]\n");
    let s = resolve_ok(app, Some(&file));
    assert!(matches!(&s.input, SourceSpec::Streams { names, .. } if *names == both));
    let yaml = FileValues::parse(
        Path::new("k.yaml"),
        "streams:\n  - orders\n  - clicks\n",
        true,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let s = resolve_ok(app, Some(&yaml));
    assert!(matches!(&s.input, SourceSpec::Streams { names, .. } if *names == both));

    for (args, key, why) in [
        (
            &["--stream", "a", "--streams", "b"][..],
            "streams",
            "not both",
        ),
        (&["--streams", "a,,b"], "streams", "separated by commas"),
        (&["--streams", "a,b,a"], "streams", "listed twice"),
        (
            &["--streams", "arn:aws:kinesis:eu-west-1:1:x"],
            "streams",
            "not a Kinesis stream ARN",
        ),
        (
            &["--stream", "a", "--stream-removal-grace", "1m"],
            "stream_removal_grace",
            "only used with streams",
        ),
        (
            &["--streams", "a", "--stream-removal-grace", "soon"],
            "stream_removal_grace",
            "expected a duration",
        ),
        (&[], "stream", "--streams"),
    ] {
        let e = resolve_err(&[app, args].concat(), None);
        assert_eq!(e.key, key, "{args:?}: {e}");
        assert!(e.to_string().contains(why), "{args:?}: {e}");
    }
}

#[test]
fn file_errors_name_the_key() {
    let e = FileValues::parse(Path::new("kcl.toml"), "failover = \"1s\"\n", false)
        .err()
        .unwrap_or_else(|| panic!("unknown key accepted"));
    assert_eq!(e.key, "failover");
    assert!(e.to_string().contains("unknown key"), "{e}");

    let e = FileValues::parse(Path::new("kcl.toml"), "window = [1, 2]\n", false)
        .err()
        .unwrap_or_else(|| panic!("array accepted"));
    assert_eq!(e.key, "window");

    let e = FileValues::parse(Path::new("kcl.toml"), "window = \n", false)
        .err()
        .unwrap_or_else(|| panic!("bad syntax accepted"));
    assert_eq!(e.key, "config");
    assert!(!e.to_string().contains('\n'), "{e}");
}

#[test]
fn a_key_given_in_both_spellings_is_refused() {
    for text in [
        "failover-time = \"6s\"\nfailover_time = \"5s\"\n",
        "failover_time = \"5s\"\nfailover-time = \"6s\"\n",
    ] {
        let e = FileValues::parse(Path::new("kcl.toml"), text, false)
            .err()
            .unwrap_or_else(|| panic!("accepted: {text}"));
        assert!(e.to_string().contains("given twice"), "{e}");
        assert!(e.to_string().contains("kcl.toml"), "{e}");
    }
}

#[test]
fn print_config_lists_every_key_with_its_origin() {
    let file = toml_file("window = \"5s\"\n");
    let s = resolve_ok(REQUIRED, Some(&file));
    let text = s.to_toml();
    assert!(text.contains("stream = \"orders\"  # --stream"), "{text}");
    assert!(text.contains("window = \"5s\"  # kcl.toml"), "{text}");
    assert!(
        text.contains("failover-time = \"10s\"  # default"),
        "{text}"
    );
    // The output is itself a valid config file, which pins no worker id made from this host.
    let read_back = text.parse::<toml::Table>();
    assert!(
        read_back
            .as_ref()
            .is_ok_and(|t| !t.contains_key("worker-id")),
        "{text}"
    );
    assert!(text.contains("# worker-id = "), "{text}");
}

#[test]
fn fan_out_names_its_consumer_after_the_application() {
    let s = resolve_ok(REQUIRED, None);
    assert_eq!(s.worker.retrieval, Retrieval::Polling);
    let s = resolve_ok(&[REQUIRED, &["--retrieval", "fan-out"]].concat(), None);
    assert_eq!(
        s.worker.retrieval,
        Retrieval::FanOut {
            consumer_name: s.application_name.clone()
        }
    );
    let e = resolve_err(&[REQUIRED, &["--retrieval", "push"]].concat(), None);
    assert_eq!(e.key, "retrieval");
}

#[test]
fn the_summary_job_needs_a_period_and_a_strong_secret() {
    let s = resolve_ok(REQUIRED, None);
    assert!(s.summary.is_none());
    let e = resolve_err(
        &[REQUIRED, &["--messages-secret-file", "/nonexistent"]].concat(),
        None,
    );
    assert_eq!(e.key, "messages_secret_file");
    let e = resolve_err(&[REQUIRED, &["--summary-every", "100ms"]].concat(), None);
    assert_eq!(e.key, "summary_every");
    let dir = std::env::temp_dir().join(format!("kcl-settings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let short = dir.join("short");
    std::fs::write(&short, "tiny\n").unwrap_or_else(|e| panic!("{e}"));
    let short = short.to_string_lossy().into_owned();
    let args = [
        "--summary-every",
        "10s",
        "--messages-secret-file",
        short.as_str(),
    ];
    let e = resolve_err(&[REQUIRED, &args].concat(), None);
    assert_eq!(e.key, "messages_secret_file");
    assert!(e.reason.contains("16"), "{}", e.reason);
    let long = dir.join("long");
    std::fs::write(&long, "0123456789abcdef-secret\n").unwrap_or_else(|e| panic!("{e}"));
    let long = long.to_string_lossy().into_owned();
    let args = [
        "--summary-every",
        "10s",
        "--messages-secret-file",
        long.as_str(),
    ];
    let e = resolve_err(&[REQUIRED, &args].concat(), None);
    assert_eq!(e.key, "advertise", "the address to advertise is needed");
    let args = [&args[..], &["--advertise", "http://10.0.0.7:8080"]].concat();
    let s = resolve_ok(&[REQUIRED, &args].concat(), None);
    let summary = s.summary.unwrap_or_else(|| panic!("a summary job"));
    assert_eq!(summary.every, Duration::from_secs(10));
    let (secret, advertise) = summary.messages.unwrap_or_else(|| panic!("messages"));
    assert_eq!(secret.0, "0123456789abcdef-secret");
    assert_eq!(advertise, "http://10.0.0.7:8080");
    assert!(
        !format!("{secret:?}").contains("0123"),
        "a secret is never printed"
    );
}

// DynamoDB stream ARNs are checked through kcl-aws.
#[cfg(feature = "aws")]
#[test]
fn a_dynamodb_table_stream_is_read_by_table_or_by_arn_and_misfits_are_named() {
    let app: &[&str] = &["--application-name", "app", "--source", "dynamodb-streams"];
    let arn = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2026-11-26T00:00:00.000";
    let s = resolve_ok(&[app, &["--table", "orders"]].concat(), None);
    assert_eq!(
        s.input,
        SourceSpec::DynamoDb {
            table: Some("orders".into()),
            arn: None
        }
    );
    let s = resolve_ok(&[app, &["--stream", arn]].concat(), None);
    assert_eq!(
        s.input,
        SourceSpec::DynamoDb {
            table: None,
            arn: Some(arn.into())
        }
    );
    let s = resolve_ok(
        &[app, &["--table", "orders", "--stream", arn]].concat(),
        None,
    );
    assert!(matches!(
        s.input,
        SourceSpec::DynamoDb {
            table: Some(_),
            arn: Some(_)
        }
    ));
    let other = arn.replace("table/orders", "table/payments");
    let s = resolve_ok(
        &[app, &["--streams", &format!("{arn},{other}")]].concat(),
        None,
    );
    assert_eq!(
        s.input,
        SourceSpec::DynamoDbStreams {
            arns: vec![arn.to_owned(), other.clone()],
            removal_grace: None
        }
    );
    let e = resolve_err(
        &[app, &["--streams", &other, "--table", "orders"]].concat(),
        None,
    );
    assert_eq!(e.key, "table");
    let file = toml_file("source = \"dynamodb-streams\"\ntable = \"orders\"\n");
    let s = resolve_ok(&["--application-name", "app"], Some(&file));
    assert!(matches!(s.input, SourceSpec::DynamoDb { .. }));
}

// DynamoDB stream ARNs are checked through kcl-aws.
#[cfg(feature = "aws")]
#[test]
fn a_dynamodb_stream_setting_that_does_not_fit_is_named() {
    let app: &[&str] = &["--application-name", "app", "--source", "dynamodb-streams"];
    let arn = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2026-11-26T00:00:00.000";

    for (args, key, why) in [
        (&[][..], "table", "required with source dynamodb-streams"),
        (
            &["--table", "payments", "--stream", arn][..],
            "stream",
            "a stream of table orders, not of table payments",
        ),
        (
            &["--stream", "orders"][..],
            "stream",
            "is not a DynamoDB stream ARN",
        ),
        (
            &[
                "--stream",
                "arn:aws:kinesis:eu-west-1:123456789012:stream/orders",
            ][..],
            "stream",
            "is not a DynamoDB stream ARN",
        ),
        (
            &["--streams", "a,b"][..],
            "streams",
            "is not a DynamoDB stream ARN",
        ),
        (
            &["--table", "x"][..],
            "table",
            "not a valid DynamoDB table name",
        ),
        (
            &["--table", "orders", "--retrieval", "fan-out"][..],
            "retrieval",
            "no enhanced fan-out",
        ),
        (
            &["--table", "orders", "--backend", "memory"][..],
            "backend",
            "needs backend aws",
        ),
    ] {
        let e = resolve_err(&[app, args].concat(), None);
        assert_eq!(e.key, key, "{args:?}: {e}");
        assert!(e.to_string().contains(why), "{args:?}: {e}");
    }
    let e = resolve_err(
        &[
            "--application-name",
            "app",
            "--source",
            "kafka",
            "--stream",
            "s",
        ],
        None,
    );
    assert_eq!(e.key, "source");
    let e = resolve_err(
        &[
            "--application-name",
            "app",
            "--stream",
            "s",
            "--table",
            "orders",
        ],
        None,
    );
    assert_eq!(e.key, "table");
    assert!(
        e.to_string()
            .contains("only used with source dynamodb-streams"),
        "{e}"
    );
}

#[test]
fn restart_grace_is_off_by_default_and_a_duration_or_off() {
    let s = resolve_ok(REQUIRED, None);
    assert_eq!(s.worker.restart_grace, None);
    assert_eq!(s.effective["restart_grace"].0, "off");
    let s = resolve_ok(&[REQUIRED, &["--restart-grace", "60s"]].concat(), None);
    assert_eq!(s.worker.restart_grace, Some(Duration::from_secs(60)));
    let file = toml_file("stream = \"s\"\napplication-name = \"app\"\nrestart-grace = \"2m\"\n");
    let s = resolve_ok(&[], Some(&file));
    assert_eq!(s.worker.restart_grace, Some(Duration::from_secs(120)));
    let e = resolve_err(&[REQUIRED, &["--restart-grace", "0s"]].concat(), None);
    assert_eq!(e.key, "restart_grace", "{e}");
}

#[test]
fn stalled_after_is_a_duration_or_off() {
    let s = resolve_ok(REQUIRED, None);
    assert_eq!(
        s.worker.stalled_after,
        WorkerConfig::default().stalled_after
    );
    assert_eq!(s.effective["stalled_after"].0, "10m");
    let s = resolve_ok(&[REQUIRED, &["--stalled-after", "30s"]].concat(), None);
    assert_eq!(s.worker.stalled_after, Some(Duration::from_secs(30)));
    let file = toml_file("stream = \"s\"\napplication-name = \"app\"\nstalled-after = \"off\"\n");
    assert_eq!(resolve_ok(&[], Some(&file)).worker.stalled_after, None);
    let s = resolve_ok(&["--stalled-after", "Off"], Some(&file));
    assert_eq!(s.worker.stalled_after, None);
    for bad in ["0s", "soon"] {
        let e = resolve_err(&[REQUIRED, &["--stalled-after", bad]].concat(), None);
        assert_eq!(e.key, "stalled_after", "{e}");
        assert!(e.to_string().contains("off"), "{e}");
    }
}

#[test]
fn a_failure_can_be_injected_to_try_the_alerts() {
    use crate::fault::Fault;
    assert_eq!(resolve_ok(REQUIRED, None).fault, Fault::None);
    let args = [REQUIRED, &["--inject-failure", "process-records"]].concat();
    assert_eq!(resolve_ok(&args, None).fault, Fault::ProcessRecords);
    let args = [REQUIRED, &["--inject-failure", "initialize"]].concat();
    assert_eq!(resolve_ok(&args, None).fault, Fault::Initialize);
    let e = resolve_err(
        &[REQUIRED, &["--inject-failure", "sometimes"]].concat(),
        None,
    );
    assert_eq!(e.key, "inject_failure", "{e}");
}

#[test]
fn a_failure_policy_that_dead_letters_needs_a_sink_it_can_read() {
    let s = resolve_ok(REQUIRED, None);
    assert_eq!(s.worker.failure, kcl_core::failure::FailurePolicy::block());
    assert_eq!(s.dead_letters, None);
    let e = resolve_err(&[REQUIRED, &["--on-failure", "dead-letter"]].concat(), None);
    assert_eq!(e.key, "dead_letters", "{e}");
    let e = resolve_err(
        &[
            REQUIRED,
            &["--on-failure", "dead-letter", "--dead-letters", "queue"],
        ]
        .concat(),
        None,
    );
    assert_eq!(e.key, "dead_letters", "{e}");
    let e = resolve_err(&[REQUIRED, &["--failure-attempts", "0"]].concat(), None);
    assert_eq!(e.key, "failure_attempts", "{e}");
    let e = resolve_err(&[REQUIRED, &["--on-failure", "retry"]].concat(), None);
    assert_eq!(e.key, "on_failure", "{e}");
    let args = ["--on-failure", "DEAD_LETTER", "--failure-attempts", "5"];
    let s = resolve_ok(
        &[
            REQUIRED,
            &args,
            &["--dead-letters", "sqs:https://q.example/1/dl"],
        ]
        .concat(),
        None,
    );
    assert_eq!(s.worker.failure.attempts, 5);
    assert_eq!(s.worker.failure.outage_after, Some(10), "the default");
    let never = resolve_ok(&[REQUIRED, &["--failure-outage-after", "0"]].concat(), None);
    assert_eq!(never.worker.failure.outage_after, None, "0: never");
    assert_eq!(
        s.worker.failure.exhausted,
        kcl_core::failure::Exhausted::DeadLetter
    );
    assert_eq!(
        s.dead_letters.as_deref(),
        Some("sqs:https://q.example/1/dl")
    );
    let dead = ["--on-failure", "dead-letter"];
    let memory = ["--backend", "memory", "--dead-letters", "s3://bucket/p"];
    let e = resolve_err(&[REQUIRED, &dead, &memory].concat(), None);
    assert!(e.to_string().contains("file only"), "{e}");
    let e = resolve_err(
        &[REQUIRED, &["--dead-letters", "file:/tmp/x.jsonl"]].concat(),
        None,
    );
    assert!(e.to_string().contains("not dead-letter"), "{e}");
    let nowhere = ["--dead-letters", "file:/no-such-folder-kcl/x.jsonl"];
    let e = resolve_err(&[REQUIRED, &dead, &nowhere].concat(), None);
    assert!(e.to_string().contains("folder does not exist"), "{e}");
    let here = ["--backend", "memory", "--dead-letters", "file:dl.jsonl"];
    assert!(
        resolve_ok(&[REQUIRED, &dead, &here].concat(), None)
            .dead_letters
            .is_some()
    );
}

#[test]
fn balancing_by_load_or_count_with_a_capacity() {
    let s = resolve_ok(REQUIRED, None);
    assert_eq!(s.worker.balancing, kcl_core::Balancing::default());
    assert_eq!(s.worker.balancing.by, kcl_core::BalanceBy::Count);
    let args = ["--balance-by", "load", "--capacity", "2.5"];
    let s = resolve_ok(&[REQUIRED, &args].concat(), None);
    assert_eq!(s.worker.balancing.by, kcl_core::BalanceBy::Load);
    assert!((s.worker.balancing.capacity - 2.5).abs() < 1e-9);
    let file = toml_file("balance-by = \"LOAD\"\ncapacity = 4\n");
    let s = resolve_ok(REQUIRED, Some(&file));
    assert_eq!(s.worker.balancing.by, kcl_core::BalanceBy::Load);
    assert!((s.worker.balancing.capacity - 4.0).abs() < 1e-9);
    assert_eq!(s.effective["capacity"].0, "4");
    let s = resolve_ok(
        &[REQUIRED, &["--balance-by", "count"]].concat(),
        Some(&file),
    );
    assert_eq!(
        s.worker.balancing.by,
        kcl_core::BalanceBy::Count,
        "the flag wins"
    );
    let e = resolve_err(&[REQUIRED, &["--balance-by", "cpu"]].concat(), None);
    assert_eq!(e.key, "balance_by", "{e}");
    for bad in ["0", "1001", "NaN", "two"] {
        let e = resolve_err(&[REQUIRED, &["--capacity", bad]].concat(), None);
        assert_eq!(e.key, "capacity", "{bad}: {e}");
    }
    let e = resolve_err(REQUIRED, Some(&toml_file("capacity = -1\n")));
    assert_eq!(e.key, "capacity", "{e}");
    assert!(e.to_string().contains("kcl.toml"), "{e}");
}

#[test]
fn autoscaling_settings_reach_the_worker_and_the_scaler_turns_publishing_on() {
    let s = resolve_ok(REQUIRED, None);
    assert_eq!(s.worker.autoscaling, kcl_core::Autoscaling::default());
    assert_eq!(s.scaler, None);
    assert_eq!(s.effective["publish_interval"].0, "off");
    let args = [
        "--catch-up",
        "2m",
        "--utilization",
        "0.5",
        "--min-workers",
        "2",
        "--max-workers",
        "12",
        "--scale-up-window",
        "30s",
        "--scale-down-window",
        "10m",
        "--scaler-port",
        "9091",
        "--listen",
        "0.0.0.0:9090",
    ];
    let s = resolve_ok(&[REQUIRED, &args].concat(), None);
    let want = kcl_core::Autoscaling::default()
        .catch_up(Duration::from_secs(120))
        .utilization(0.5)
        .workers(2, 12)
        .windows(Duration::from_secs(30), Duration::from_secs(600))
        .publish_interval(Duration::from_secs(15));
    assert_eq!(
        s.worker.autoscaling, want,
        "publishing defaults to 15s with a scaler"
    );
    assert_eq!(s.scaler, Some(SocketAddr::from(([0, 0, 0, 0], 9091))));
    assert_eq!(s.effective["publish_interval"].0, "15s");
    let off = [
        REQUIRED,
        &["--scaler-port", "9091", "--publish-interval", "off"],
    ]
    .concat();
    assert_eq!(
        resolve_ok(&off, None).worker.autoscaling.publish_interval,
        None
    );
    let file = toml_file("publish-interval = \"1m\"\nmax-workers = \"unlimited\"\n");
    let s = resolve_ok(REQUIRED, Some(&file));
    let a = &s.worker.autoscaling;
    assert_eq!(
        (a.publish_interval, a.max_workers),
        (Some(Duration::from_secs(60)), None)
    );
    assert_eq!(
        resolve_ok(REQUIRED, Some(&file)).scaler,
        None,
        "no scaler: no port"
    );
}

#[test]
fn bad_autoscaling_settings_name_their_key() {
    for (args, key) in [
        (&["--catch-up", "0s"][..], "catch_up"),
        (&["--utilization", "1.5"], "utilization"),
        (&["--utilization", "most"], "utilization"),
        (&["--min-workers", "0"], "min_workers"),
        (&["--min-workers", "3", "--max-workers", "2"], "max_workers"),
        (&["--max-workers", "lots"], "max_workers"),
        (&["--publish-interval", "0s"], "publish_interval"),
        (&["--scaler-port", "70000"], "scaler_port"),
        (&["--scaler-port", "8080"], "scaler_port"),
    ] {
        let e = resolve_err(&[REQUIRED, args].concat(), None);
        assert_eq!(e.key, key, "{args:?}: {e}");
    }
    let e = resolve_err(REQUIRED, Some(&toml_file("min-workers = 0\n")));
    assert!(
        e.to_string()
            .starts_with("invalid setting `min-workers` (from kcl.toml)"),
        "{e}"
    );
}

#[test]
fn print_config_shows_the_endpoints_of_the_source_the_lease_table_and_the_sink() {
    let args = [
        REQUIRED,
        &[
            "--on-failure",
            "dead-letter",
            "--dead-letters",
            "sqs:https://q.example/1/dl",
        ],
    ]
    .concat();
    let s = resolve_ok(&args, None);
    let env = |name: &str| match name {
        "AWS_ENDPOINT_URL_KINESIS" => Some("http://localhost:4568".to_owned()),
        "AWS_ENDPOINT_URL" => Some("http://user:s3cret@localhost:4566/?token=x".to_owned()),
        "AWS_SECRET_ACCESS_KEY" => Some("never-printed".to_owned()),
        _ => None,
    };
    let text = s.to_toml_with(&env);
    assert!(
        text.contains("# kinesis (the stream): http://localhost:4568  # AWS_ENDPOINT_URL_KINESIS"),
        "{text}"
    );
    assert!(
        text.contains("# dynamodb (the lease table): http://localhost:4566/  # AWS_ENDPOINT_URL\n"),
        "{text}"
    );
    assert!(
        text.contains("# sqs (the dead-letter sink): http://localhost:4566/  # AWS_ENDPOINT_URL\n"),
        "{text}"
    );
    assert!(!text.contains("s3cret") && !text.contains("token") && !text.contains("never"));
    // Still a config file.
    assert!(text.parse::<toml::Table>().is_ok(), "{text}");
    // Nothing set: AWS's endpoint, and where else it could come from.
    let text = s.to_toml_with(&|_| None);
    assert!(
        text.contains(
            "# dynamodb (the lease table): AWS's, for the region  # neither \
             AWS_ENDPOINT_URL_DYNAMODB nor AWS_ENDPOINT_URL is set"
        ),
        "{text}"
    );
    let streams = [
        "--source",
        "dynamodb-streams",
        "--table",
        "orders",
        "--application-name",
        "app",
    ];
    let text = resolve_ok(&streams, None).to_toml_with(&|name: &str| {
        (name == "AWS_ENDPOINT_URL_DYNAMODB_STREAMS").then(|| "http://streams:8000".to_owned())
    });
    assert!(
        text.contains("# dynamodbstreams (the table's stream): http://streams:8000"),
        "{text}"
    );
}

/// A dead-letter sink's URL with user information and a signature: `--print-config` shows
/// neither.
#[test]
fn print_config_hides_a_sinks_credentials() {
    let sink = "sqs:http://user:SQSPASS@localhost:5000/q?sig=SQSQ";
    let args = ["--on-failure", "dead-letter", "--dead-letters", sink];
    let s = resolve_ok(&[REQUIRED, &args].concat(), None);
    let shown = &s.effective["dead_letters"].0;
    assert!(
        !shown.contains("SQSPASS") && !shown.contains("SQSQ"),
        "{shown}"
    );
    assert_eq!(shown, "sqs:http://localhost:5000/q");
}

#[path = "store_tests.rs"]
mod store;
