//! A poison record under amazon_kclpy (unchanged): its processor raises, kclpy reports the
//! exception on stderr and answers the batch anyway; the daemon fails the batch all the same
//! (`childErrorsFailBatch`), so the failure policy bisects it, retries the record and
//! dead-letters it, and the shard goes on.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use kcl_aws::dead_letter::from_json;
use kcl_core::failure::DeadLetter;
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

/// 50 records on one shard, one of them `poison`, processed by `poison.py` under a daemon
/// that dead-letters after 2 tries (`extra`: more properties), until the shard's checkpoint
/// is at its last record; with `one_more`, one more record is put once the child has
/// reported the poison record's exception ([`after_the_poison`]).
async fn run(ctx: &Context, extra: &str, one_more: bool) -> anyhow::Result<Run> {
    let clients = clients()?;
    ctx.create_stream(1).await?;
    let data: Vec<String> = (0..RECORDS)
        .map(|i| match i {
            POISON => "poison".to_owned(),
            _ => format!("record-{i}"),
        })
        .collect();
    let records: Vec<(String, String)> = data
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("pk-{i}"), d.clone()))
        .collect();
    ctx.put(&records).await?;

    let letters: PathBuf = ctx.path("dead-letters.jsonl");
    let out = ctx.path("processed.txt");
    let child = repo_root().join("kcl-multilang/tests/children/poison.py");
    let executable = format!("{} {}", clients.python, child.display());
    let extra = format!(
        "failureExhausted = dead-letter\n\
         failureAttempts = 2\n\
         failureBackoffMillis = 100\n\
         failureMaxBackoffMillis = 200\n\
         deadLetterSink = file:{}\n\
         {extra}",
        letters.display()
    );
    let properties = properties(ctx, &executable, "python", "w-1", &extra)?;
    let out_env = out.to_string_lossy().into_owned();
    let mut data = data;
    let daemon = Daemon::start(ctx, &properties, "w-1", &[("KCL_OUT", &out_env)])?;
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

    let processed = std::fs::read_to_string(&out)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let letters = match std::fs::read_to_string(&letters) {
        Ok(text) => text
            .lines()
            .map(|line| from_json(line.as_bytes()).with_context(|| format!("letter {line}")))
            .collect::<anyhow::Result<_>>()?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    Ok(Run {
        daemon,
        data,
        processed,
        letters,
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
        } = run(&ctx, "", false).await?;
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
        } = run(&ctx, "childErrorsFailBatch = false\n", true).await?;
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
