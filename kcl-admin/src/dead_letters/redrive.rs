//! `kcl-admin dead-letters redrive`: letters back into their stream, one `PutRecord` each
//! with the record's payload, partition key and explicit hash key, in id order (a shard's
//! letters in sequence order); each written to the record file, then deleted from the sink.
//!
//! A letter kept more than once (put twice by its sink) is redriven once, and every copy
//! deleted. A failure stops the redrive: what the record file holds went, the rest did not.

use std::collections::{BTreeMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use chrono::{SecondsFormat, Utc};
use kcl_aws::StreamRef;
use kcl_aws::dead_letter::{LetterId, LetterStore, Listing, Redriven, Redriver, Stored};

use super::{Filters, FromArgs, release, report, warn_unreadable};

/// Arguments of `kcl-admin dead-letters redrive`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    from: FromArgs,
    #[command(flatten)]
    filters: Filters,
    /// A letter to redrive (repeat for several): `shard/sequence/subsequence`. With filters,
    /// only those of these that match.
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<LetterId>,
    /// Every letter (when neither an id nor a filter is given).
    #[arg(long)]
    all: bool,
    /// The stream to put them into (a name or an ARN); by default each letter's own stream.
    #[arg(long)]
    to_stream: Option<String>,
    /// Only print what would be redriven.
    #[arg(long)]
    dry_run: bool,
    /// The record of what was redriven, JSON lines (appended to if it exists): each letter's
    /// id, stream, new shard and sequence number, and when. Default
    /// `redriven-<UTC timestamp>.jsonl` here.
    #[arg(long)]
    record: Option<PathBuf>,
    /// SQS: how long the letters stay hidden from other readers while this runs; the
    /// redrive must be done by then.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    visibility_timeout: Duration,
    /// The lease table whose parked keys the letters unpark (`Parallel::park_keys`); by
    /// default each letter's own application.
    #[arg(long)]
    application_name: Option<String>,
    /// After unparking keys, how long to wait before the puts: the workers holding the
    /// shards see an unparked key at their next renewal (a third of the failover time by
    /// default); a record put before that is parked again.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    unpark_wait: Duration,
}

/// One letter to redrive: every copy of it, and where it goes.
struct Chosen<'a> {
    copies: Vec<&'a Stored>,
    stream: StreamRef,
}

impl Chosen<'_> {
    fn first(&self) -> &Stored {
        self.copies[0]
    }
}

pub(crate) async fn run(sdk: &aws_config::SdkConfig, args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.all || !args.ids.is_empty() || args.filters.any(),
        "say which letters: --id, a filter (--shard, --key, --error, --older-than, \
         --newer-than), or --all"
    );
    let store = args.from.open(sdk, args.visibility_timeout)?;
    let listing = store.list().await?;
    warn_unreadable(&listing);
    let chosen = match choose(&args, &listing) {
        Ok(chosen) => chosen,
        Err(e) => {
            release(&store, &listing, &HashSet::new()).await;
            return Err(e);
        }
    };
    if args.dry_run {
        release(&store, &listing, &HashSet::new()).await;
        for c in &chosen {
            report(&format!("would redrive {}", describe(c)));
        }
        for (table, key) in parked_keys(&args, &chosen) {
            report(&format!(
                "would unpark key {key} in the lease table {table}"
            ));
        }
        report(&format!(
            "{} letter(s) would be redriven (dry run)",
            chosen.len()
        ));
        return Ok(());
    }
    if chosen.is_empty() {
        release(&store, &listing, &HashSet::new()).await;
        report("no letter to redrive");
        return Ok(());
    }
    if let Err(e) = unpark(sdk, &args, &chosen).await {
        release(&store, &listing, &HashSet::new()).await;
        return Err(e);
    }
    let mut done = HashSet::new();
    let result = redrive(sdk, &args, &store, &chosen, &mut done).await;
    release(&store, &listing, &done).await;
    let path = result?;
    report(&format!(
        "redrove {} letter(s); record in {}",
        done.len(),
        path.display()
    ));
    if !store.removes() && !done.is_empty() {
        report(
            "they stay in the Kinesis stream (records cannot be deleted): the record file says which went",
        );
    }
    Ok(())
}

/// The letters chosen, one per id, in id order, each with its target stream.
fn choose<'a>(args: &Args, listing: &'a Listing) -> anyhow::Result<Vec<Chosen<'a>>> {
    let now = Utc::now();
    let ids: HashSet<&LetterId> = args.ids.iter().collect();
    let mut by_id: BTreeMap<&LetterId, Vec<&Stored>> = BTreeMap::new();
    for stored in &listing.letters {
        by_id.entry(&stored.id).or_default().push(stored);
    }
    if let Some(missing) = ids.iter().find(|id| !by_id.contains_key(**id)) {
        anyhow::bail!("no letter {missing} at the location given");
    }
    let to = args.to_stream.clone().map(StreamRef::from);
    let mut chosen = Vec::new();
    let mut without_stream = Vec::new();
    for (id, copies) in by_id {
        let first = copies[0];
        if (!ids.is_empty() && !ids.contains(id)) || !args.filters.matches(first, now) {
            continue;
        }
        let stream = to
            .clone()
            .or_else(|| first.letter.stream.clone().map(StreamRef::from));
        match stream {
            Some(stream) => chosen.push(Chosen { copies, stream }),
            None => without_stream.push(id.to_string()),
        }
    }
    anyhow::ensure!(
        without_stream.is_empty(),
        "these letters name no stream (their worker's DeadLetters has none): pass --to-stream: {}",
        without_stream.join(", ")
    );
    whole_keys(&chosen, listing)?;
    Ok(chosen)
}

/// A parked key is redriven whole or not at all: unparked with some of its letters left in
/// the sink, its later records would run before them (`Parallel::park_keys` keeps a key's
/// order only if the record that parked it and those parked behind go back together).
fn whole_keys(chosen: &[Chosen<'_>], listing: &Listing) -> anyhow::Result<()> {
    let taken: HashSet<&LetterId> = chosen.iter().map(|c| &c.first().id).collect();
    let keys: HashSet<&str> = chosen
        .iter()
        .filter_map(|c| c.first().letter.parked_key.as_deref())
        .collect();
    let mut left: Vec<String> = listing
        .letters
        .iter()
        .filter(|s| {
            s.letter
                .parked_key
                .as_deref()
                .is_some_and(|k| keys.contains(k))
                && !taken.contains(&s.id)
        })
        .map(|s| s.id.to_string())
        .collect();
    left.sort();
    left.dedup();
    anyhow::ensure!(
        left.is_empty(),
        "these letters park a key (Parallel::park_keys) whose other letters were not chosen: \
         a partial redrive would run the key's later records before them. Add them (--id each, \
         or --key with the partition key, without other filters): {}",
        left.join(", ")
    );
    Ok(())
}

/// The parked keys the chosen letters name, with the lease table of each.
fn parked_keys(args: &Args, chosen: &[Chosen<'_>]) -> std::collections::BTreeSet<(String, String)> {
    chosen
        .iter()
        .filter_map(|c| {
            let letter = &c.first().letter;
            let key = letter.parked_key.clone()?;
            let table = args
                .application_name
                .clone()
                .or_else(|| letter.application.clone())?;
            Some((table, key))
        })
        .collect()
}

/// Unparks the keys the chosen letters parked, so that their records run when put back;
/// then waits for the holders to see it.
async fn unpark(
    sdk: &aws_config::SdkConfig,
    args: &Args,
    chosen: &[Chosen<'_>],
) -> anyhow::Result<()> {
    let unnamed = chosen.iter().any(|c| {
        let letter = &c.first().letter;
        letter.parked_key.is_some()
            && args.application_name.is_none()
            && letter.application.is_none()
    });
    anyhow::ensure!(
        !unnamed,
        "some letters parked a key but name no application: pass --application-name (the lease table)"
    );
    let mut changed = 0;
    for (table, key) in parked_keys(args, chosen) {
        let store = crate::store(sdk, &table);
        let rows = match kcl_core::admin::unpark(&store, &key).await {
            Ok(rows) => rows,
            // No table, no worker that parks the key.
            Err(e) if e.kind() == kcl_core::ErrorKind::NotFound => {
                report(&format!(
                    "the lease table {table} does not exist: key {key} is parked nowhere"
                ));
                Vec::new()
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "unparking key {key} in the lease table {table} failed"
                )));
            }
        };
        for row in &rows {
            report(&format!("unparked key {key} in {table}: {row}"));
        }
        changed += rows.len();
    }
    if changed > 0 {
        report(&format!(
            "waiting {} for the workers to see it",
            humantime::format_duration(args.unpark_wait)
        ));
        tokio::time::sleep(args.unpark_wait).await;
    }
    Ok(())
}

fn describe(c: &Chosen<'_>) -> String {
    let record = &c.first().letter.record;
    let hash = record
        .explicit_hash_key
        .as_ref()
        .map(|h| format!(", explicit hash key {h}"))
        .unwrap_or_default();
    format!(
        "{} to {} (partition key {}{hash}, {} bytes)",
        c.first().id,
        c.stream,
        record.partition_key,
        record.data.len()
    )
}

/// Puts each chosen letter back, records it, deletes it; the ids done go in `done`.
async fn redrive(
    sdk: &aws_config::SdkConfig,
    args: &Args,
    store: &LetterStore,
    chosen: &[Chosen<'_>],
    done: &mut HashSet<LetterId>,
) -> anyhow::Result<PathBuf> {
    let path = args.record.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "redriven-{}.jsonl",
            Utc::now().format("%Y%m%dT%H%M%SZ")
        ))
    });
    // Opened before the first put, so that every put is recorded.
    let mut record = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("cannot open the record file {}", path.display()))?;
    let redriver = Redriver::new(sdk);
    for c in chosen {
        let id = &c.first().id;
        let redriven = redriver
            .put(&c.first().letter, &c.stream)
            .await
            .with_context(|| format!("redriving {id} failed: it and the letters after it stay"))?;
        write_record(&mut record, &path, c, &redriven)?;
        done.insert(id.clone());
        report(&format!(
            "redrove {} -> {} {}",
            describe(c),
            redriven.shard,
            redriven.sequence_number
        ));
        store.remove(&c.copies).await.with_context(|| {
            format!(
                "{id} was redriven (see {}) but could not be deleted from {}: delete it, or a \
                 second redrive puts it again",
                path.display(),
                store.location()
            )
        })?;
    }
    Ok(path)
}

/// Appends one line for `c` to the record file, synced before the letter is deleted.
fn write_record(
    file: &mut File,
    path: &Path,
    c: &Chosen<'_>,
    redriven: &Redriven,
) -> anyhow::Result<()> {
    let line = serde_json::json!({
        "id": c.first().id.to_string(),
        "from": c.first().place(),
        "stream": match &c.stream { StreamRef::Name(s) | StreamRef::Arn(s) => s },
        "partition_key": c.first().letter.record.partition_key,
        "shard": redriven.shard,
        "sequence_number": redriven.sequence_number,
        "redriven_at": Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
    });
    writeln!(file, "{line}")
        .and_then(|()| file.sync_data())
        .with_context(|| format!("cannot write the record file {}", path.display()))
}
