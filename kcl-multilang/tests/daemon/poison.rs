//! A poison record under amazon_kclpy (unchanged): its processor raises, kclpy reports the
//! exception on stderr and answers the batch anyway; the daemon fails the batch all the same
//! (`childErrorsFailBatch`), so the failure policy bisects it, retries the record and
//! dead-letters it, and the shard goes on, in the same child (it still answers). A stop while
//! the record waits for its next try is a clean stop, whether the child raised or crashed.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context as _;
use kcl_aws::dead_letter::from_json;
use kcl_core::failure::DeadLetter;
use kcl_core::{Checkpoint, LeaseStore as _};
use kcl_integration_tests::http::{http_get, serving_addr};
use kcl_integration_tests::{Context, repo_root, wait_until, with_timeout};

use super::clients::clients;
use super::{Daemon, checkpointed, last_by_shard, properties};

const RECORDS: usize = 50;
const POISON: usize = 25;

/// What a run left behind.
struct Run {
    daemon: Daemon,
    /// The records' data, in the order put.
    data: Vec<String>,
    /// The data of the records the child processed (each once or more).
    processed: BTreeSet<String>,
    /// The dead letters in `deadLetterSink`'s file.
    letters: Vec<DeadLetter>,
}

/// Tries and waits that keep a run short: 2 tries, 100 ms apart.
const FAST: &str = "failureAttempts = 2\n\
                    failureBackoffMillis = 100\n\
                    failureMaxBackoffMillis = 200\n";

/// `records` records on a stream of one shard, `poison` at the indices given, the others
/// `record-<i>` (partition key `pk-<i>`): their data, in the order put.
async fn stream(ctx: &Context, records: usize, poison: &[usize]) -> anyhow::Result<Vec<String>> {
    ctx.create_stream(1).await?;
    let data: Vec<String> = (0..records)
        .map(|i| match i {
            i if poison.contains(&i) => "poison".to_owned(),
            _ => format!("record-{i}"),
        })
        .collect();
    let keyed: Vec<(String, String)> = data
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("pk-{i}"), d.clone()))
        .collect();
    ctx.put(&keyed).await?;
    Ok(data)
}

/// `poison.py` under a daemon that dead-letters to a file (`extra`: more properties; `env`:
/// the child's; `args`: the daemon's).
fn start(
    ctx: &Context,
    extra: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> anyhow::Result<Daemon> {
    let clients = clients()?;
    let child = repo_root().join("kcl-multilang/tests/children/poison.py");
    let executable = format!("{} {}", clients.python, child.display());
    let extra = format!(
        "failureExhausted = dead-letter\n\
         deadLetterSink = file:{}\n\
         {extra}",
        ctx.path("dead-letters.jsonl").display()
    );
    let properties = properties(ctx, &executable, "python", "w-1", &extra)?;
    let out = ctx.path("processed.txt").to_string_lossy().into_owned();
    let mut env = env.to_vec();
    env.push(("KCL_OUT", &out));
    Daemon::start_with(ctx, &properties, "w-1", &env, args)
}

/// The dead letters in the run's sink.
fn letters(ctx: &Context) -> anyhow::Result<Vec<DeadLetter>> {
    match std::fs::read_to_string(ctx.path("dead-letters.jsonl")) {
        Ok(text) => text
            .lines()
            .map(|line| from_json(line.as_bytes()).with_context(|| format!("letter {line}")))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// `records` records on one shard, `poison` among them, processed by `poison.py` under a
/// daemon that dead-letters (`extra`: more properties), until the shard's checkpoint is at
/// its last record; with `one_more`, one more record is put once the child has reported the
/// poison record's exception ([`after_the_poison`]).
async fn run(
    ctx: &Context,
    (records, poison): (usize, &[usize]),
    extra: &str,
    one_more: bool,
) -> anyhow::Result<Run> {
    let mut data = stream(ctx, records, poison).await?;
    let daemon = start(ctx, extra, &[], &[])?;
    if one_more {
        data.push(after_the_poison(ctx, &daemon).await?);
    }
    let last = last_by_shard(ctx).await?;
    let took = wait_until(
        "the shard checkpointed at its last record",
        Duration::from_secs(120),
        Duration::from_millis(500),
        async || checkpointed(ctx, &last).await,
    )
    .await
    .map_err(|e| e.context(daemon.log()))?;
    eprintln!("checkpointed at the last record after {took:?}");

    let processed = std::fs::read_to_string(ctx.path("processed.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    Ok(Run {
        daemon,
        data,
        processed,
        letters: letters(ctx)?,
    })
}

/// Stops the daemon with SIGTERM: exit 0.
async fn stop(mut daemon: Daemon) -> anyhow::Result<()> {
    daemon.signal("-TERM")?;
    let status = daemon.wait(Duration::from_secs(40)).await?;
    assert!(status.success(), "{status}: {}", daemon.log());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_kclpy_raises_on_is_dead_lettered_and_the_shard_goes_on() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("ml-poison").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), async {
        let Run {
            daemon,
            data,
            processed,
            letters,
        } = run(&ctx, (RECORDS, &[POISON]), FAST, false).await?;
        let log = daemon.log();

        // The poison record, with its payload, dead-lettered once, after its 2 tries.
        assert_eq!(letters.len(), 1, "{letters:#?}\n{log}");
        let letter = &letters[0];
        assert_eq!(letter.record.data.as_ref(), b"poison");
        assert_eq!(letter.record.partition_key, format!("pk-{POISON}"));
        assert_eq!(letter.attempts, 2);
        assert_eq!(letter.application.as_deref(), Some(ctx.table.as_str()));
        assert_eq!(letter.stream.as_deref(), Some(ctx.stream.as_str()));
        assert!(
            letter.last_error.contains("ValueError: poison record at"),
            "{letter:#?}"
        );

        // Every other record processed by the child, the poison record never.
        let others: BTreeSet<String> = data.iter().filter(|d| *d != "poison").cloned().collect();
        assert_eq!(processed, others, "{log}");

        // The child's own report in the log, and the daemon's reading of it.
        assert!(
            log.contains("Caught exception from action dispatch: poison record at"),
            "{log}"
        );
        assert!(
            log.contains("raised `ValueError: poison record at"),
            "{log}"
        );
        assert!(log.contains("the batch failed"), "{log}");
        stop(daemon).await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_child_errors_fail_batch_false_the_batch_counts_as_processed_as_in_java()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("ml-poison-java").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), async {
        let Run {
            daemon,
            data,
            processed,
            letters,
        } = run(
            &ctx,
            (RECORDS, &[POISON]),
            &format!("{FAST}childErrorsFailBatch = false\n"),
            true,
        )
        .await?;
        let log = daemon.log();
        // The exception is logged, and nothing more: no letter, no failed batch, the poison
        // batch counted as processed (its processor raised before it checkpointed: the next
        // batch's checkpoint passes it, and any record after the poison in its batch, which
        // the processor never saw: the Java daemon's behaviour).
        assert!(letters.is_empty(), "{letters:#?}");
        assert!(
            log.contains("Caught exception from action dispatch: poison record at"),
            "{log}"
        );
        assert!(!log.contains("the batch failed"), "{log}");
        assert!(!processed.contains("poison"));
        let lost = data
            .iter()
            .filter(|d| *d != "poison" && !processed.contains(*d))
            .count();
        eprintln!("records never processed (behind the poison record in its batch): {lost}");
        assert!(
            processed.contains(&format!("record-{}", POISON - 1)),
            "{log}"
        );
        stop(daemon).await
    })
    .await
}

/// Once the child has reported the poison record's exception, one more record: the
/// checkpoint of its batch passes the poison batch (which was not checkpointed).
async fn after_the_poison(ctx: &Context, daemon: &Daemon) -> anyhow::Result<String> {
    wait_until(
        "the poison batch processed",
        Duration::from_secs(90),
        Duration::from_millis(200),
        async || {
            Ok(daemon
                .log()
                .contains("Caught exception from action dispatch"))
        },
    )
    .await
    .map_err(|e| e.context(daemon.log()))?;
    let after = "after-the-poison".to_owned();
    ctx.put(&[("pk-after".to_owned(), after.clone())]).await?;
    Ok(after)
}

/// A counter the daemon serves on `/metrics`, summed over its labels; `None` if not served.
fn metric(daemon: &Daemon, name: &str) -> anyhow::Result<Option<f64>> {
    let log = daemon.log();
    let mut lines = log.lines().map(str::to_owned);
    let addr = serving_addr(|| lines.next());
    let (code, body) = http_get(addr, "/metrics").context("GET /metrics")?;
    anyhow::ensure!(code == 200, "GET /metrics: {code} {body}");
    Ok(body
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with([' ', '{']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b))
}

/// Ten poison records among 100: each is dead-lettered after its tries, and the child whose
/// processor raised on it, still answering, is kept for every part of every bisect: one child
/// for the whole run (today's cost was a child per failed part: about 70).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_poison_records_cost_no_child_restart() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("ml-poison-ten").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(240), async {
        let poison: Vec<usize> = (0..10).map(|i| 10 * i + 5).collect();
        let Run {
            daemon,
            data,
            processed,
            letters,
        } = run(&ctx, (100, &poison), FAST, false).await?;
        let log = daemon.log();

        // Every poison record dead-lettered once, with its payload, after its 2 tries; no
        // other record.
        let keys: Vec<String> = letters
            .iter()
            .map(|l| l.record.partition_key.clone())
            .collect();
        let want: Vec<String> = poison.iter().map(|i| format!("pk-{i}")).collect();
        assert_eq!(keys, want, "{letters:#?}");
        for letter in &letters {
            assert_eq!(letter.record.data.as_ref(), b"poison");
            assert_eq!(letter.attempts, 2, "{letter:#?}");
        }
        let good: BTreeSet<String> = data.iter().filter(|d| *d != "poison").cloned().collect();
        assert_eq!(processed, good, "{log}");

        // One child throughout, and the daemon says so.
        let started = log.matches("\"child started\"").count();
        let restarts = metric(&daemon, "kcl_multilang_child_restarts_total")?;
        eprintln!("children started: {started}; restarts counted: {restarts:?}");
        assert_eq!(started, 1, "{log}");
        assert_eq!(restarts, Some(0.0), "{log}");
        stop(daemon).await
    })
    .await
}

/// 50 records, the 26th poison, under a daemon whose retries wait a minute; SIGTERM once the
/// poison record waits for its second try. The child either raised (and is kept: the daemon
/// runs with `--exit-on-child-failure`, which a child that raised does not trip) or crashed
/// (`crash`: then a new child, initialized as the first was, is asked to shut down). Either
/// way a clean stop: exit status 0, no failed `shutdownRequested`, the checkpoint at the
/// record before the poison one, the lease handed back, nothing dead-lettered.
async fn stop_between_tries(ctx: &Context, crash: bool) -> anyhow::Result<()> {
    let data = stream(ctx, RECORDS, &[POISON]).await?;
    let extra = "failureAttempts = 3\n\
                 failureBackoffMillis = 60000\n\
                 failureMaxBackoffMillis = 60000\n";
    let (env, args): (&[(&str, &str)], &[&str]) = if crash {
        (&[("KCL_POISON", "exit")], &[])
    } else {
        (&[], &["--exit-on-child-failure"])
    };
    let mut daemon = start(ctx, extra, env, args)?;
    wait_until(
        "the poison record waiting for its second try",
        Duration::from_secs(90),
        Duration::from_millis(200),
        async || Ok(daemon.log().contains("a record failed; trying it again")),
    )
    .await
    .map_err(|e| e.context(daemon.log()))?;
    daemon.signal("-TERM")?;
    let status = daemon.wait(Duration::from_secs(40)).await?;
    let log = daemon.log();
    assert!(status.success(), "{status}: {log}");
    for wrong in [
        "never started",
        "shutdown_requested failed",
        "--exit-on-child-failure: the daemon exits",
    ] {
        assert!(!log.contains(wrong), "`{wrong}` in the log: {log}");
    }
    if crash {
        // A new child heard it; each crashed child counted once as exited non-zero.
        assert!(log.contains("to hear shutdownRequested"), "{log}");
        let failed = log.matches("\"child failed\"").count();
        assert!(failed > 1, "{log}");
        let summary = format!("{failed} children exited non-zero");
        assert!(log.contains(&summary), "no `{summary}`: {log}");
    }

    // The checkpoint where the child left it, right before the poison record; the lease back.
    let before = &data[POISON - 1];
    let shard = shard_of(ctx).await?;
    let sequence = ctx
        .read_shard(&shard)
        .await?
        .into_iter()
        .find_map(|(sequence, d)| (&d == before).then_some(sequence))
        .with_context(|| format!("no {before} in the stream"))?;
    let leases = ctx.store().list().await?;
    let lease = leases
        .iter()
        .find(|l| l.key.as_str() == shard)
        .context("no lease")?;
    assert!(
        matches!(&lease.checkpoint, Checkpoint::Sequence(s) if s.sequence.as_str() == sequence),
        "the checkpoint is {}, not at {before} ({sequence}): {log}",
        lease.checkpoint
    );
    assert!(lease.owner.is_none(), "{lease:?}");
    assert!(letters(ctx)?.is_empty());
    Ok(())
}

/// The stream's one shard.
async fn shard_of(ctx: &Context) -> anyhow::Result<String> {
    let owners = ctx.owners().await?;
    owners.into_keys().next().context("no lease")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_a_raised_record_waits_for_its_retry_is_a_clean_stop() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("ml-poison-stop").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), stop_between_tries(&ctx, false)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_a_crashing_record_waits_for_its_retry_is_a_clean_stop() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new("ml-poison-crash-stop").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), stop_between_tries(&ctx, true)).await
}
