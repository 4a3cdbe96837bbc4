//! Children that fail, and properties files that are wrong, through the binary.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;

use kcl_integration_tests::{Context, repo_root, unique, wait_until, with_timeout};

use super::{Daemon, checkpointed, journal, last_by_shard, properties, put};

fn python() -> String {
    std::env::var("KCL_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// `journaled.py` under a daemon, failing on the shards `fail` names (`<shard>=<how>,…`).
fn start(ctx: &Context, fail: &str, args: &[&str]) -> anyhow::Result<Daemon> {
    let child = repo_root().join("kcl-multilang/tests/children/journaled.py");
    let executable = format!("{} {}", python(), child.display());
    let properties = properties(ctx, &executable, "python", "w-1", "timeoutInSeconds = 2\n")?;
    let fail_dir = ctx.path("failed");
    std::fs::create_dir_all(&fail_dir)?;
    let journal = ctx.path("journal.jsonl");
    let env = [
        ("KCL_OUT", journal.to_string_lossy().into_owned()),
        ("KCL_FAIL", fail.to_owned()),
        ("KCL_FAIL_DIR", fail_dir.to_string_lossy().into_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Daemon::start_with(ctx, &properties, "w-1", &env, args)
}

fn shard(n: usize) -> String {
    format!("shardId-{n:012}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_crashes_hangs_or_answers_wrong_costs_only_its_shard_a_restart()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("ml-failures").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), async {
        ctx.create_stream(4).await?;
        put(&ctx, 0, 100).await?;
        let last = last_by_shard(&ctx).await?;
        assert_eq!(last.len(), 4, "records on every shard");
        let fail = format!("{}=crash,{}=hang,{}=wrong", shard(0), shard(1), shard(2));
        let mut daemon = start(&ctx, &fail, &[])?;
        wait_until(
            "every shard checkpointed at its last record",
            Duration::from_secs(60),
            Duration::from_millis(500),
            async || checkpointed(&ctx, &last).await,
        )
        .await
        .map_err(|e| e.context(daemon.log()))?;
        let log = daemon.log();
        for (why, shard) in [
            (
                "the child ended while processing `processRecords`",
                shard(0),
            ),
            ("did not answer `processRecords` within 2s", shard(1)),
            ("the child answered `wrong`", shard(2)),
        ] {
            let line = log
                .lines()
                .find(|l| l.contains(why))
                .with_context(|| format!("no `{why}` in the log: {log}"))?;
            assert!(line.contains(&shard), "{why}: not on {shard}: {line}");
        }
        assert_eq!(log.matches("\"child failed\"").count(), 3, "{log}");

        // The daemon is still up, and stops as usual.
        daemon.signal("-TERM")?;
        let status = daemon.wait(Duration::from_secs(40)).await?;
        assert!(status.success(), "{status}: {}", daemon.log());

        // Every record delivered; each failed shard's batch again, in a second child.
        let entries = journal(&ctx.path("journal.jsonl"))?;
        let mut written = BTreeSet::new();
        for shard in last.keys() {
            for (sequence, _) in ctx.read_shard(shard).await? {
                written.insert(sequence);
            }
        }
        let delivered: BTreeSet<String> = entries
            .iter()
            .filter_map(|e| e.sequence_number.clone())
            .collect();
        assert_eq!(delivered, written, "every record reached a child");
        for n in 0..4 {
            let children: BTreeSet<u32> = entries
                .iter()
                .filter(|e| e.call == "initialize" && e.shard_id.as_deref() == Some(&shard(n)))
                .map(|e| e.pid)
                .collect();
            let want = if n < 3 { 2 } else { 1 };
            assert_eq!(children.len(), want, "children of {}", shard(n));
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_exit_on_child_failure_a_crash_exits_the_daemon_as_in_java() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("ml-exit").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(90), async {
        ctx.create_stream(1).await?;
        put(&ctx, 0, 10).await?;
        let mut daemon = start(
            &ctx,
            &format!("{}=crash", shard(0)),
            &["--exit-on-child-failure"],
        )?;
        let status = daemon.wait(Duration::from_secs(60)).await?;
        let log = daemon.log();
        assert_eq!(status.code(), Some(1), "{log}");
        assert!(log.contains("--exit-on-child-failure"), "{log}");
        Ok(())
    })
    .await
}

/// The binary on a properties file: its exit status and stderr.
fn run(text: &str) -> (Option<i32>, String) {
    let dir = std::env::temp_dir().join(unique("ml-bad-input"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("app.properties");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kcl-multilang"))
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_bad_properties_file_exits_2_naming_the_key() {
    let minimal = "executableName = python3 app.py\nstreamName = s\napplicationName = a\n";
    let cases = [
        (
            "streamName = s\napplicationName = a\n".to_owned(),
            "executableName",
        ),
        (
            format!("{minimal}failoverTimeMillis = 10s\n"),
            "failoverTimeMillis",
        ),
        (
            format!("{minimal}AwsCredentialsProvider = DefaultAWSCredentialsProviderChain2\n"),
            "AwsCredentialsProvider",
        ),
        (format!("{minimal}maxRecords = 20000\n"), "maxRecords"),
        (format!("{minimal}retrievalMode = PUSH\n"), "retrievalMode"),
        (
            format!("{minimal}fanoutConfig.consumerArn = reader\n"),
            "fanoutConfig.consumerArn",
        ),
    ];
    for (text, key) in cases {
        let (code, stderr) = run(&text);
        assert_eq!(code, Some(2), "{text}: {stderr}");
        assert!(stderr.contains(&format!("`{key}`")), "{text}: {stderr}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kcl-multilang"))
        .arg("/nonexistent/app.properties")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/app.properties"));
}
