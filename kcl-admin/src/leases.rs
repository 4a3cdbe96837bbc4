//! `kcl-admin leases`: the table an operator would otherwise piece together from the DynamoDB
//! console and `aws kinesis list-shards`.
//!
//! A lease row holds no time, only a counter its owner bumps every few seconds: whether an
//! owner is alive is seen by reading twice (`--observe`), as a worker judges expiry. Under
//! heartbeats (`Liveness::Heartbeat`) the owner bumps its heartbeat row instead of its
//! leases: for a lease whose owner has a heartbeat row, MOVING is that row's counter
//! (`yes (heartbeat)`). How far
//! behind a shard is comes from the stream itself: one `GetRecords` of one record from the
//! checkpoint gives `MillisBehindLatest`, and the arrival time of the next record to process.
//!
//! In a multi-stream table a lease's key is `account:stream:creationEpoch:shardId`: it is
//! shown by that key (what `reset --shard` takes), on the line of the shard the stream named
//! lists if it is that stream's. A stream the table's leases are not of is refused
//! ([`crate::belongs`]). Below the table, the drain rows `release` left ([`crate::drains`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kcl_core::lease::UnreadableRow;
use kcl_core::multi_stream::StreamId;
use kcl_core::singleton::{heartbeat_key, is_coordination_key};
use kcl_core::{Checkpoint, Lease, LeaseStore, Shard, ShardId, ShardSource, StartingPosition};
use serde_json::json;

use crate::lease_store::Store;

/// Arguments of `kcl-admin leases`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The application: the lease table's name (with `--lease-store postgres://…`, whose
    /// rows of kcl_leases).
    #[arg(long, env = "KCL_APPLICATION_NAME")]
    application_name: String,
    /// Where the leases are.
    #[command(flatten)]
    leases: crate::lease_store::StoreArgs,
    /// The stream: adds shards without a lease, whether each is open, and how far behind.
    #[command(flatten)]
    stream: crate::source::StreamArgs,
    /// How long to watch the counters to tell a lease whose owner renews it from one that
    /// stands still (0s: do not watch).
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    observe: Duration,
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// One line: a shard, its lease, and where it stands.
#[derive(Debug, Default)]
struct Line {
    shard: String,
    /// In a multi-stream table: the lease key's stream and shard.
    stream_id: Option<(StreamId, ShardId)>,
    /// A lease of another stream than the one named (a multi-stream table).
    other_stream: bool,
    lease: Option<Lease>,
    /// Whether the counter moved while watched; `None` if not watched. Under heartbeats
    /// (the owner has a heartbeat row) the heartbeat row's counter: such a worker renews its
    /// heartbeat, not its leases.
    moving: Option<bool>,
    /// Whether `moving` is the owner's heartbeat's.
    by_heartbeat: bool,
    /// `Some(closed)` if the stream lists the shard; `None` if not asked or not listed.
    closed: Option<bool>,
    parents: Vec<ShardId>,
    behind: Option<Behind>,
}

/// How far a checkpoint is behind its shard.
#[derive(Debug)]
struct Behind {
    millis: Option<u64>,
    /// When the next record to process arrived in the stream, if there is one.
    next_arrival: Option<DateTime<Utc>>,
}

pub(crate) async fn run(sdk: &aws_config::SdkConfig, args: Args) -> anyhow::Result<()> {
    // A mistake in the stream flags, before any call.
    args.stream.spec()?;
    match args.leases.open(sdk, &args.application_name).await? {
        Store::DynamoDb(store) => run_on(sdk, &args, &store).await,
        Store::Postgres(store) => run_on(sdk, &args, &store).await,
    }
}

async fn run_on(
    sdk: &aws_config::SdkConfig,
    args: &Args,
    store: &impl LeaseStore,
) -> anyhow::Result<()> {
    let leases = store.list().await?;
    if leases.is_empty() {
        let place = args.leases.describe(&args.application_name);
        warn(&format!(
            "kcl-admin: no lease rows in {place}: no worker of it has started yet, or \
             --application-name (or --lease-store) is not the fleet's"
        ));
    }
    let unreadable = store.unreadable();
    // The stream named, checked against the table before anything is shown of it.
    let source = match args.stream.open(sdk).await? {
        Some(source) => {
            let shards = source.list_shards().await?;
            let application = &args.application_name;
            crate::belongs::check(sdk, application, &args.stream, &source, &shards, &leases)
                .await?;
            Some((source, shards))
        }
        None => None,
    };
    let moving = watch(store, &leases, args.observe).await?;
    let drains = crate::drains::rows(&leases, &moving);
    let mut lines = lease_lines(leases, &moving, &args.stream);
    if let Some((source, shards)) = &source {
        for shard in shards {
            let key = lease_key_of(&lines, &args.stream, &shard.id);
            let line = lines.entry(key).or_insert_with(|| Line {
                shard: shard.id.to_string(),
                ..Line::default()
            });
            line.closed = Some(shard.closed);
            line.parents.clone_from(&shard.parent_shard_ids);
            line.behind = behind(source, shard, line.lease.as_ref()).await;
        }
    }
    let lines: Vec<Line> = lines.into_values().collect();
    let out = if args.json {
        json_out(&lines, &unreadable, &drains, args.stream.given())
    } else {
        let mut out = table(&lines, &unreadable, args.stream.given());
        out.push_str(&crate::drains::text(&drains));
        if lines.iter().any(|l| l.moving == Some(false)) {
            out.push_str(&still_note(args.observe));
        }
        out
    };
    print(&out);
    Ok(())
}

/// A line for each shard lease of `leases` (kcl's own rows left out), by key.
fn lease_lines(
    leases: Vec<Lease>,
    moving: &BTreeMap<ShardId, bool>,
    stream: &crate::source::StreamArgs,
) -> BTreeMap<String, Line> {
    // The heartbeat rows (`Liveness::Heartbeat`), each named by its owner.
    let heartbeats: BTreeMap<ShardId, ()> = leases
        .iter()
        .filter(|l| l.owner.as_ref().is_some_and(|o| heartbeat_key(o) == l.key))
        .map(|l| (l.key.clone(), ()))
        .collect();
    let named = stream.given();
    leases
        .into_iter()
        .filter(|l| !is_coordination_key(&l.key))
        .map(|l| {
            let key = l.key.to_string();
            let heartbeat = l
                .owner
                .as_ref()
                .map(heartbeat_key)
                .filter(|k| heartbeats.contains_key(k));
            let by_heartbeat = heartbeat.is_some();
            let moving = moving.get(heartbeat.as_ref().unwrap_or(&l.key)).copied();
            let stream_id = StreamId::split_key(&l.key);
            let line = Line {
                shard: key.clone(),
                // A lease of another stream of a multi-stream table: not asked about.
                other_stream: stream_id
                    .as_ref()
                    .is_some_and(|(id, _)| named && !stream.names(&id.name)),
                stream_id,
                moving,
                by_heartbeat,
                parents: l.parent_shard_ids.clone(),
                lease: Some(l),
                ..Line::default()
            };
            (key, line)
        })
        .collect()
}

/// The line of `shard` of the stream named: its lease's key, the shard id in a single-stream
/// table, `account:stream:creationEpoch:shardId` in a multi-stream one (the newest stream of
/// that name if it was recreated).
fn lease_key_of(
    lines: &BTreeMap<String, Line>,
    stream: &crate::source::StreamArgs,
    shard: &ShardId,
) -> String {
    if lines.contains_key(shard.as_str()) {
        return shard.to_string();
    }
    lines
        .iter()
        .filter_map(|(key, line)| Some((key, line.stream_id.as_ref()?)))
        .filter(|(_, (id, s))| s == shard && stream.names(&id.name))
        .max_by_key(|(_, (id, _))| id.creation_epoch)
        .map_or_else(|| shard.to_string(), |(key, _)| key.clone())
}

#[allow(clippy::print_stdout)]
fn print(text: &str) {
    print!("{text}");
}

#[allow(clippy::print_stderr)]
fn warn(line: &str) {
    eprintln!("{line}");
}

/// Reads the table again after `observe`: which counters moved.
async fn watch(
    store: &impl LeaseStore,
    first: &[Lease],
    observe: Duration,
) -> anyhow::Result<BTreeMap<ShardId, bool>> {
    if observe.is_zero() {
        return Ok(BTreeMap::new());
    }
    tokio::time::sleep(observe).await;
    let then: BTreeMap<&ShardId, u64> = first.iter().map(|l| (&l.key, l.counter)).collect();
    let now = store.list().await?;
    Ok(now
        .into_iter()
        .filter_map(|l| {
            let before = then.get(&l.key)?;
            Some((l.key.clone(), l.counter != *before))
        })
        .collect())
}

/// How far behind the stream `lease`'s checkpoint is: one record read from it.
async fn behind(source: &impl ShardSource, shard: &Shard, lease: Option<&Lease>) -> Option<Behind> {
    let lease = lease?;
    let position = match &lease.checkpoint {
        Checkpoint::TrimHorizon => StartingPosition::TrimHorizon,
        Checkpoint::Latest => match lease.start_timestamp {
            Some(at) => StartingPosition::AtTimestamp(at),
            None => StartingPosition::Latest,
        },
        Checkpoint::AtTimestamp => StartingPosition::AtTimestamp(lease.start_timestamp?),
        Checkpoint::Sequence(s) => StartingPosition::AfterSequence(s.sequence.clone()),
        Checkpoint::ShardEnd => return None,
    };
    let iterator = source.shard_iterator(&shard.id, &position).await.ok()?;
    let batch = source.get_records(&iterator, 1).await.ok()?;
    Some(Behind {
        millis: batch.millis_behind_latest,
        next_arrival: batch.records.first().map(|r| r.approximate_arrival),
    })
}

fn owner(line: &Line) -> String {
    match &line.lease {
        None => "(no lease)".to_owned(),
        Some(l) => l
            .owner
            .as_ref()
            .map_or_else(|| "(none)".to_owned(), ToString::to_string),
    }
}

/// What MOVING `no` means, and does not: a counter still for the time watched.
fn still_note(observe: Duration) -> String {
    format!(
        "\nMOVING no: the counter did not change in the {} watched. A worker renews its leases \
         every failover time / 3 (its heartbeat row, under heartbeats, every / 2): 3.3 s \
         (5 s) at the default 10 s. For a longer failover time, watch longer (--observe) \
         before taking the owner for gone.\n",
        humantime::format_duration(observe)
    )
}

fn moving_text(line: &Line) -> &'static str {
    match (line.moving, line.by_heartbeat) {
        (None, _) => "-",
        (Some(true), false) => "yes",
        (Some(false), false) => "no",
        (Some(true), true) => "yes (heartbeat)",
        (Some(false), true) => "no (heartbeat)",
    }
}

fn stream_text(line: &Line, asked: bool) -> &'static str {
    match (asked && !line.other_stream, line.closed) {
        (false, _) => "-",
        (true, Some(false)) => "open",
        (true, Some(true)) => "closed",
        (true, None) => "gone",
    }
}

fn behind_text(line: &Line) -> String {
    let Some(b) = &line.behind else {
        return "-".to_owned();
    };
    match (b.next_arrival, b.millis) {
        (Some(at), _) => {
            let waiting = (Utc::now() - at).to_std().unwrap_or_default();
            let waiting = Duration::from_secs(waiting.as_secs());
            format!("next record waits {}", humantime::format_duration(waiting))
        }
        (None, Some(0) | None) => "caught up".to_owned(),
        (None, Some(ms)) => format!("{ms} ms"),
    }
}

fn table(lines: &[Line], unreadable: &[UnreadableRow], asked: bool) -> String {
    let header = [
        "SHARD",
        "OWNER",
        "CHECKPOINT",
        "COUNTER",
        "MOVING",
        "PARENTS",
        "STREAM",
        "BEHIND",
    ];
    let rows: Vec<[String; 8]> = lines
        .iter()
        .map(|l| {
            [
                l.shard.clone(),
                owner(l),
                l.lease
                    .as_ref()
                    .map_or("-".to_owned(), |x| x.checkpoint.to_string()),
                l.lease
                    .as_ref()
                    .map_or("-".to_owned(), |x| x.counter.to_string()),
                moving_text(l).to_owned(),
                join(&l.parents),
                stream_text(l, asked).to_owned(),
                behind_text(l),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(&header.map(str::to_owned));
    for row in &rows {
        line(row);
    }
    for row in unreadable {
        let key = row.key.as_deref().unwrap_or("<no key>");
        let _ = writeln!(
            out,
            "unreadable row {key}: {} (kcl neither reads nor writes it)",
            row.reason
        );
    }
    out
}

fn join(ids: &[ShardId]) -> String {
    if ids.is_empty() {
        return "-".to_owned();
    }
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn json_out(
    lines: &[Line],
    unreadable: &[UnreadableRow],
    drains: &[crate::drains::DrainRow],
    asked: bool,
) -> String {
    let shards: Vec<_> = lines
        .iter()
        .map(|l| {
            json!({
                "shard": l.shard,
                "stream_id": l.stream_id.as_ref().map(|(id, _)| id.to_string()),
                "shard_id": l.stream_id.as_ref().map_or_else(|| l.shard.clone(), |(_, s)| s.to_string()),
                "owner": l.lease.as_ref().and_then(|x| x.owner.as_ref().map(ToString::to_string)),
                "leased": l.lease.is_some(),
                "checkpoint": l.lease.as_ref().map(|x| x.checkpoint.to_string()),
                "counter": l.lease.as_ref().map(|x| x.counter),
                "counter_moving": l.moving,
                "moving_by_heartbeat": l.by_heartbeat,
                "parents": l.parents.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "stream": asked.then(|| stream_text(l, asked)),
                "millis_behind_latest": l.behind.as_ref().and_then(|b| b.millis),
                "next_record_arrived": l.behind.as_ref().and_then(|b| b.next_arrival).map(|t| t.to_rfc3339()),
            })
        })
        .collect();
    let bad: Vec<_> = unreadable
        .iter()
        .map(|r| json!({"key": r.key, "reason": r.reason}))
        .collect();
    let doc = json!({
        "shards": shards,
        "unreadable_rows": bad,
        "drain_rows": crate::drains::json(drains),
    });
    format!("{doc:#}\n")
}
