//! Poison records under chaos: two daemons, a processor that raises on one record in 50, and
//! records put for about 45 s while one daemon is SIGKILLed and replaced, the leader frozen
//! (SIGSTOP) past the failover time until its shard has moved, and the other stopped
//! (SIGTERM) and replaced.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kcl_core::LeaseStore as _;
use kcl_integration_tests::{Context, wait_until, with_timeout};

use super::super::{checkpointed, last_by_shard};
use super::{FAILOVER, Fleet, Place, RESTARTS_METRIC, addr, balanced, data, metric, placed};

/// Records put, one in [`POISON_EVERY`] poison.
const RECORDS: usize = 400;
const POISON_EVERY: usize = 50;
/// Put `BATCH` records every `BATCH_EVERY`: 44 s of records.
const BATCH: usize = 10;
const BATCH_EVERY: Duration = Duration::from_millis(1100);

/// Record `i`'s data: `poison-<i>` for one in [`POISON_EVERY`], else `record-<i>`.
fn payload(i: usize) -> String {
    if i % POISON_EVERY == POISON_EVERY / 2 {
        format!("poison-{i}")
    } else {
        format!("record-{i}")
    }
}

/// Puts every record, [`BATCH`] every [`BATCH_EVERY`], partition key `pk-<i>`.
fn feed(ctx: Context) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        for from in (0..RECORDS).step_by(BATCH) {
            let records: Vec<(String, String)> = (from..(from + BATCH).min(RECORDS))
                .map(|i| (format!("pk-{i}"), payload(i)))
                .collect();
            ctx.put(&records).await?;
            tokio::time::sleep(BATCH_EVERY).await;
        }
        Ok(())
    })
}

/// Once the two daemons share the shards: w-1 SIGKILLed and w-3 started in its place; once
/// those two share the shards and the standby is one of them, the leader frozen (SIGSTOP)
/// until the other holds both shards, and at least past the failover time; then the other
/// stopped with SIGTERM and w-4 started in its place. Returns how long the frozen daemon's
/// shard took to move.
async fn disturb(fleet: &mut Fleet) -> anyhow::Result<Duration> {
    settled(fleet).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    fleet.kill("w-1").await?;
    fleet.start("w-3")?;
    let (leader, other) = settled(fleet).await?;
    let frozen = Instant::now();
    // Past the failover time, and until the other daemon holds both shards.
    let mut seen = None;
    let moved = fleet
        .freeze(&leader, Duration::from_secs(40), async || {
            if seen.is_none() {
                let owners = fleet.ctx.owners().await?;
                let moved = owners
                    .values()
                    .all(|o| o.as_deref() == Some(other.as_str()));
                seen = moved.then(|| frozen.elapsed());
            }
            Ok(seen.filter(|_| frozen.elapsed() > FAILOVER + Duration::from_secs(2)))
        })
        .await
        .with_context(|| format!("{leader}'s shard not moved to {other}: {}", fleet.tails()))?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    fleet.stop(&other).await?;
    fleet.start("w-4")?;
    Ok(moved)
}

/// Waits until each of the two daemons running holds a shard, one leads and the other is
/// the standby: (leader, standby).
async fn settled(fleet: &Fleet) -> anyhow::Result<(String, String)> {
    let mut roles = None;
    wait_until(
        "each daemon holding a shard, one leading, the other its standby",
        Duration::from_secs(40),
        Duration::from_millis(250),
        async || {
            let live: BTreeSet<&str> = fleet.live.iter().map(|(n, _)| n.as_str()).collect();
            roles = match role_holders(&fleet.ctx).await? {
                (Some(l), Some(s))
                    if l != s && live.contains(l.as_str()) && live.contains(s.as_str()) =>
                {
                    Some((l, s))
                }
                _ => None,
            };
            Ok(roles.is_some() && balanced(&fleet.ctx, 2).await?)
        },
    )
    .await
    .with_context(|| fleet.tails())?;
    roles.context("no roles")
}

/// Who holds the leader and the standby rows.
async fn role_holders(ctx: &Context) -> anyhow::Result<(Option<String>, Option<String>)> {
    let Ok(rows) = ctx.store().list().await else {
        return Ok((None, None));
    };
    let holder = |role: &str| {
        rows.iter()
            .find(|r| r.key.as_str() == format!("kcl-coordination/worker-{role}"))
            .and_then(|r| r.owner.as_ref().map(|o| o.as_str().to_owned()))
    };
    Ok((holder("leader"), holder("standby")))
}

/// What is missing yet: good records never processed, poison records never dead-lettered,
/// shards not checkpointed at their last record (empty once all is done).
async fn missing(
    fleet: &Fleet,
    stream: &BTreeMap<String, Place>,
    last: &BTreeMap<String, String>,
) -> anyhow::Result<String> {
    let processed = fleet.processed()?;
    let lettered: BTreeSet<String> = fleet.letters()?.iter().map(data).collect();
    let unprocessed = stream
        .keys()
        .filter(|d| d.starts_with("record-") && !processed.contains_key(*d))
        .count();
    let unlettered: Vec<&String> = stream
        .keys()
        .filter(|d| d.starts_with("poison-") && !lettered.contains(*d))
        .collect();
    let at_end = checkpointed(&fleet.ctx, last).await?;
    if unprocessed == 0 && unlettered.is_empty() && at_end {
        return Ok(String::new());
    }
    Ok(format!(
        "{unprocessed} good records unprocessed, poison records not dead-lettered: \
         {unlettered:?}, checkpointed at the end: {at_end}"
    ))
}

/// Letters: only poison records, each of them, with its payload, key and place.
fn check_letters(fleet: &Fleet, stream: &BTreeMap<String, Place>) -> anyhow::Result<usize> {
    let letters = fleet.letters()?;
    let good: Vec<String> = letters
        .iter()
        .map(data)
        .filter(|d| !d.starts_with("poison-"))
        .collect();
    assert!(good.is_empty(), "good records dead-lettered: {good:?}");
    for letter in &letters {
        let d = data(letter);
        let i = d.trim_start_matches("poison-");
        assert_eq!(
            letter.record.partition_key,
            format!("pk-{i}"),
            "{letter:#?}"
        );
        let (shard, sequence) = stream.get(&d).with_context(|| format!("{d} not put"))?;
        assert_eq!(letter.shard.as_str(), shard, "{letter:#?}");
        assert_eq!(letter.record.sequence_number.as_str(), sequence);
        assert_eq!(letter.stream.as_deref(), Some(fleet.ctx.stream.as_str()));
        assert!(letter.last_error.contains("ValueError: poison record at"));
    }
    let lettered: BTreeSet<String> = letters.iter().map(data).collect();
    let poison: BTreeSet<String> = stream
        .keys()
        .filter(|d| d.starts_with("poison-"))
        .cloned()
        .collect();
    assert_eq!(lettered, poison, "every poison record dead-lettered");
    Ok(letters.len())
}

/// Processed records: every good one, where the stream has it, and no poison one.
fn check_processed(fleet: &Fleet, stream: &BTreeMap<String, Place>) -> anyhow::Result<()> {
    let processed = fleet.processed()?;
    for (d, places) in &processed {
        assert!(!d.starts_with("poison-"), "{d} processed");
        let place = stream
            .get(d)
            .with_context(|| format!("{d} processed, never put"))?;
        assert_eq!(places, &BTreeSet::from([place.clone()]), "{d}");
    }
    let lost: Vec<&String> = stream
        .keys()
        .filter(|d| d.starts_with("record-") && !processed.contains_key(*d))
        .collect();
    assert!(lost.is_empty(), "good records never processed: {lost:?}");
    Ok(())
}

/// Child restarts: each daemon's counter on `/metrics` (those running) or in its summary
/// line (those stopped) as many as it logged; the total, at most one per poison record's
/// letter (the documented cost) and here none expected (a child that raised still answers).
fn check_restarts(fleet: &Fleet, counters: &BTreeMap<String, f64>) -> usize {
    let logged = fleet.restarts_logged();
    for (name, log) in fleet.logs() {
        let Some(summary) = log.lines().find(|l| l.contains("stopped: ")) else {
            continue; // killed: no summary line
        };
        let n = logged[&name];
        let said = if n == 1 {
            "child restarted"
        } else {
            "children restarted"
        };
        assert!(
            summary.contains(&format!(" {n} {said}")),
            "{name}: {summary}"
        );
    }
    for (name, counted) in counters {
        #[allow(clippy::cast_precision_loss)]
        let n = logged[name] as f64;
        assert!(
            (counted - n).abs() < 0.5,
            "{name}: {counted} counted, {n} logged"
        );
    }
    logged.values().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_under_kill_stop_and_restarts_dead_letters_every_poison_record_and_no_good_one()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("ml-fleet-chaos").await? else {
        return Ok(());
    };
    let began = Instant::now();
    with_timeout(Duration::from_secs(200), async {
        ctx.create_stream(2).await?;
        let mut fleet = Fleet::new(&ctx, 10)?;
        fleet.start("w-1")?;
        fleet.start("w-2")?;
        let feeding = feed(ctx.clone());
        let moved = disturb(&mut fleet).await?;
        eprintln!("the frozen daemon's shard moved after {moved:?}");
        feeding.await??;

        let stream = placed(&ctx).await?;
        let last = last_by_shard(&ctx).await?;
        let mut left = String::new();
        let took = wait_until(
            "every good record processed, every poison one dead-lettered",
            Duration::from_secs(90),
            Duration::from_millis(500),
            async || {
                left = missing(&fleet, &stream, &last).await?;
                Ok(left.is_empty())
            },
        )
        .await
        .with_context(|| format!("{left}\n{}", fleet.tails()))?;
        eprintln!("all done {took:?} after the last put");

        let letters = check_letters(&fleet, &stream)?;
        check_processed(&fleet, &stream)?;
        let mut counters = BTreeMap::new();
        for (name, daemon) in &fleet.live {
            let counted = metric(addr(daemon).await?, RESTARTS_METRIC)?;
            counters.insert(name.clone(), counted.context("no restart counter")?);
        }
        fleet.stop_all().await?;
        let restarts = check_restarts(&fleet, &counters);
        let poison = stream.keys().filter(|d| d.starts_with("poison-")).count();
        let started: usize = fleet
            .logs()
            .iter()
            .map(|(_, log)| log.matches("\"child started\"").count())
            .sum();
        eprintln!(
            "records: {} ({poison} poison); processed lines: {}; letters: {letters}; \
             children started: {started}; child restarts: {restarts} {:?}; wall time {:?}",
            stream.len(),
            fleet.processed_lines(),
            fleet.restarts_logged(),
            began.elapsed()
        );
        // A child that raised still answers: it takes the bisect's parts and the tries, and
        // is not restarted; nor is any by a daemon's kill, freeze or stop.
        assert_eq!(
            restarts, 0,
            "child restarts for {poison} poison records, none of which crashed its child"
        );
        Ok(())
    })
    .await
}
