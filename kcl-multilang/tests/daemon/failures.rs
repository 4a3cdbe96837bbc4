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

/// The processes of a process group, from `/proc`: `(pid, parent, state)`.
fn group(pgid: u32) -> Vec<(u32, u32, char)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp …`, comm in parentheses and possibly with spaces.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u32>().ok());
        if number(2) == Some(pgid) {
            let state = fields.first().and_then(|s| s.chars().next()).unwrap_or('?');
            found.push((pid, number(1).unwrap_or(0), state));
        }
    }
    found
}

/// What an init does with the orphans handed to it: kills what still runs of `pgid` (a
/// failing test leaves nothing behind) and reaps the group's zombies that are this
/// process's; how many it reaped.
fn reap(pgid: u32) -> usize {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    use nix::unistd::Pid;
    let group = Pid::from_raw(i32::try_from(pgid).unwrap_or(i32::MAX));
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    std::thread::sleep(Duration::from_millis(100));
    let mut reaped = 0;
    while let Ok(status) = waitpid(Pid::from_raw(-group.as_raw()), Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
        reaped += 1;
    }
    reaped
}

/// Kills and reaps, when dropped, what is left of the groups of the children a journal
/// names: a failing test leaves no process behind.
struct Groups(std::path::PathBuf);

impl Groups {
    fn pgids(&self) -> BTreeSet<u32> {
        journal(&self.0)
            .unwrap_or_default()
            .iter()
            .filter_map(|e| e.pgid)
            .collect()
    }
}

impl Drop for Groups {
    fn drop(&mut self) {
        for pgid in self.pgids() {
            reap(pgid);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lines_a_deaf_child_a_grandchild_or_no_answer_to_lease_lost_hold_no_shard()
-> anyhow::Result<()> {
    // The image runs the daemon under an init (tini) as PID 1, which the orphans of the
    // children go to and which reaps them: this test process plays that part (a subreaper),
    // so that they do not go to this machine's PID 1, which may reap nothing.
    nix::sys::prctl::set_child_subreaper(true)?;
    let Some(ctx) = Context::new("ml-children").await? else {
        return Ok(());
    };
    let limit = Duration::from_secs(2); // timeoutInSeconds in `start`
    with_timeout(Duration::from_secs(150), async {
        ctx.create_stream(6).await?;
        // 2 KiB records: a shard's first batch (about 100 of them) is far more than a pipe
        // holds (64 KiB), so that its write blocks on a child that reads nothing.
        let data = "d".repeat(2048);
        let records: Vec<(String, String)> = (0..600)
            .map(|i| (format!("pk-{i}"), format!("record-{i}-{data}")))
            .collect();
        ctx.put(&records).await?;
        let last = last_by_shard(&ctx).await?;
        assert_eq!(last.len(), 6, "records on every shard");
        let fail = format!(
            "{}=stdout-line,{}=stderr-line,{}=deaf,{}=grandchild,{}=lost-hang",
            shard(0),
            shard(1),
            shard(2),
            shard(3),
            shard(4)
        );
        let groups = Groups(ctx.path("journal.jsonl"));
        let mut daemon = start(&ctx, &fail, &[])?;
        let daemon_pid = daemon.child.id().context("the daemon's pid")?;
        wait_until(
            "every shard checkpointed at its last record",
            Duration::from_secs(60),
            Duration::from_millis(500),
            async || checkpointed(&ctx, &last).await,
        )
        .await
        .map_err(|e| e.context(daemon.log()))?;
        let log = daemon.log();
        assert!(log.contains("after the long line"), "stderr read on after 2 MiB: {log}");
        let failed: Vec<&str> = log.lines().filter(|l| l.contains("\"child failed\"")).collect();
        assert_eq!(failed.len(), 1, "only the deaf child failed: {failed:#?}");
        assert!(
            failed[0].contains(&shard(2)) && failed[0].contains("timeoutInSeconds"),
            "{}",
            failed[0]
        );

        let entries = journal(&ctx.path("journal.jsonl"))?;
        let children = |n: usize| -> Vec<&super::Entry> {
            entries
                .iter()
                .filter(|e| e.call == "initialize" && e.shard_id.as_deref() == Some(&shard(n)))
                .collect()
        };
        for n in 0..6 {
            let want = if n == 2 { 2 } else { 1 };
            assert_eq!(children(n).len(), want, "children of {}", shard(n));
        }
        // The deaf child's shard restarted within timeoutInSeconds (and the backoff).
        let deaf = entries
            .iter()
            .find(|e| e.call == "deaf")
            .context("no deaf child")?;
        let restarted = children(2)[1].t - deaf.t;
        let failed_at = serde_json::from_str::<serde_json::Value>(failed[0])?["timestamp"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .context("the failure's timestamp")?;
        let failed_after = failed_at.timestamp_micros() as f64 / 1e6 - deaf.t;
        eprintln!(
            "deaf child: stopped reading at 0 s; its hook failed at {failed_after:.2} s, its \
             shard's next child initialized at {restarted:.2} s"
        );
        assert!(restarted < limit.as_secs_f64() + 3.0, "{restarted:.2} s");
        // Its group is gone, and the daemon holds no zombie.
        let deaf_group = group(children(2)[0].pgid.context("pgid")?);
        assert!(deaf_group.is_empty(), "left of the deaf child: {deaf_group:?}");
        let zombies = |parent: u32| -> usize {
            entries
                .iter()
                .filter_map(|e| e.pgid)
                .collect::<BTreeSet<u32>>()
                .into_iter()
                .flat_map(group)
                .filter(|(_, ppid, state)| *ppid == parent && *state == 'Z')
                .count()
        };
        assert_eq!(zombies(daemon_pid), 0, "zombies the daemon did not reap");

        // SIGTERM: every child asked to checkpoint; leaseLost unanswered on one shard costs
        // at most timeoutInSeconds; the grandchild's pipes do not hold its child's end.
        let asked = std::time::Instant::now();
        daemon.signal("-TERM")?;
        let status = daemon.wait(Duration::from_secs(40)).await?;
        let took = asked.elapsed();
        eprintln!("SIGTERM to exit: {took:?}");
        assert!(status.success(), "{status}: {}", daemon.log());

        // No orphan (a process of a child's group still running) and no zombie but those
        // handed to the init (this process), which reaps them.
        let entries = journal(&ctx.path("journal.jsonl"))?;
        let pgids = groups.pgids();
        let mut orphans = Vec::new();
        let mut zombies = Vec::new();
        for &pgid in &pgids {
            for (pid, ppid, state) in group(pgid) {
                if state == 'Z' {
                    zombies.push((pid, ppid));
                } else {
                    orphans.push((pid, ppid));
                }
            }
        }
        let reaped: usize = pgids.iter().map(|&g| reap(g)).sum();
        eprintln!(
            "{} children's groups after the daemon's exit: {} orphans, {} zombies, {reaped} reaped by the init",
            pgids.len(),
            orphans.len(),
            zombies.len()
        );
        assert!(orphans.is_empty(), "orphans (pid, parent): {orphans:?}");
        let me = std::process::id();
        assert!(
            zombies.iter().all(|(_, ppid)| *ppid == me),
            "zombies not the init's: {zombies:?}"
        );
        assert!(took < limit + Duration::from_secs(6), "SIGTERM to exit: {took:?}");

        // Every record delivered.
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
        // Dead letters with nowhere to put them: refused at start, not at the first one.
        (
            format!("{minimal}failureExhausted = dead-letter\n"),
            "failureExhausted",
        ),
        (
            format!("{minimal}failureExhausted = dead-letter\ndeadLetterSink = dlq\n"),
            "deadLetterSink",
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

/// The binary on a properties file run from `cwd`, given at most 20 s: its exit status (`None`
/// if it was still running) and stderr.
fn run_in(text: &str, cwd: &std::path::Path) -> (Option<i32>, String) {
    let dir = std::env::temp_dir().join(unique("ml-exec"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("app.properties");
    std::fs::write(&path, text).unwrap();
    let stderr = dir.join("stderr");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kcl-multilang"))
        .arg(&path)
        .args(["--listen", "127.0.0.1:0"])
        .current_dir(cwd)
        // Nowhere to connect to: only the check at start can end it in time.
        .env("AWS_ENDPOINT_URL_KINESIS", "http://127.0.0.1:9")
        .env("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:9")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = std::fs::read_to_string(&stderr).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    (code, stderr)
}

#[test]
fn an_executable_that_cannot_be_run_exits_2_naming_the_key_and_the_lookup() {
    use std::os::unix::fs::PermissionsExt as _;

    // amazon_kclpy's sample names its script without a path; run from another directory.
    let app = std::env::temp_dir().join(unique("ml-app"));
    let elsewhere = std::env::temp_dir().join(unique("ml-elsewhere"));
    std::fs::create_dir_all(&app).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let script = app.join("sample_app.py");
    std::fs::write(&script, "#!/usr/bin/env python3\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plain = app.join("not_executable.py");
    std::fs::write(&plain, "print()\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let rest = "streamName = s\napplicationName = a\nregionName = us-east-1\n";
    let elsewhere_shown = elsewhere.display().to_string();
    let cases = [
        // A name without a `/`: looked up in PATH, never in the working directory.
        (
            "sample_app.py",
            app.as_path(),
            vec!["PATH", "./sample_app.py"],
        ),
        ("sample_app.py", elsewhere.as_path(), vec!["PATH"]),
        // A relative path: from the working directory.
        (
            "./sample_app.py",
            elsewhere.as_path(),
            vec!["working directory", elsewhere_shown.as_str()],
        ),
        (
            "kcl-multilang-no-such-program --flag",
            elsewhere.as_path(),
            vec!["PATH"],
        ),
        (
            plain.to_str().unwrap(),
            elsewhere.as_path(),
            vec!["not executable"],
        ),
    ];
    for (executable, cwd, words) in cases {
        let (code, stderr) = run_in(&format!("executableName = {executable}\n{rest}"), cwd);
        assert_eq!(code, Some(2), "{executable} in {}: {stderr}", cwd.display());
        assert!(
            stderr.contains("`executableName`"),
            "{executable}: {stderr}"
        );
        for word in words {
            assert!(
                stderr.contains(word),
                "{executable}: no `{word}` in: {stderr}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&app);
    let _ = std::fs::remove_dir_all(&elsewhere);
}
