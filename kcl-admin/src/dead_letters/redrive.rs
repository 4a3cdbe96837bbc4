//! `kcl-admin dead-letters redrive`: letters back where their records run again.
//!
//! - A letter that parks a key (`Parallel::park_keys`) is replayed by the worker holding its
//!   shard, before any later record of the key ([`super::holder`]): the redrive asks
//!   and waits. A key parked nowhere goes back through the stream; one some of whose letters
//!   no holder can replay is refused, unless `--through-stream` (then the key is unparked and
//!   its letters go back through the stream).
//! - The others go back into their stream, one `PutRecord` each with the record's payload,
//!   partition key and explicit hash key, in id order (a shard's letters in sequence order);
//!   each written to the record file, then deleted from the sink.
//!
//! A letter kept more than once (put twice by its sink) is redriven once, and every copy
//! deleted. A failure stops the redrive: what the record file holds went, the rest did not.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{SecondsFormat, Utc};
use kcl_aws::StreamRef;
use kcl_aws::dead_letter::{LetterId, LetterStore, Listing, Redriven, Redriver, Stored};

use super::holder::{self, Key, Route};
use super::record::RecordFile;
use super::{Filters, FromArgs, release, report, warn, warn_in_flight, warn_unreadable};

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
    /// The lease table whose parked keys the letters name (`Parallel::park_keys`); by
    /// default each letter's own application.
    #[arg(long)]
    application_name: Option<String>,
    /// How long to wait for the workers holding the shards that park a key to replay its
    /// letters and unpark it; the requests stand after that.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// Keys some of whose letters no worker can replay (their shard ended, or split into
    /// children that all park the key): unpark them and put their letters back into the
    /// stream instead of refusing (a record of the key arriving meanwhile may run first).
    #[arg(long)]
    through_stream: bool,
    /// With --through-stream, after unparking keys, how long to wait before the puts: the
    /// workers holding the shards see an unparked key at their next renewal; a record put
    /// before that is parked again.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    unpark_wait: Duration,
}

/// One letter to redrive: every copy of it, and the stream it goes to if it goes into one.
struct Chosen<'a> {
    copies: Vec<&'a Stored>,
    stream: Option<StreamRef>,
}

impl Chosen<'_> {
    fn first(&self) -> &Stored {
        self.copies[0]
    }
}

/// The letters chosen, and how each parked key goes back.
struct Planned<'a> {
    chosen: Vec<Chosen<'a>>,
    keys: Vec<(Key, Route)>,
    /// `--application-name`.
    application: Option<String>,
}

impl Planned<'_> {
    /// Whether `c` goes into the stream (its holders replay it otherwise).
    fn to_stream(&self, c: &Chosen<'_>) -> bool {
        let letter = &c.first().letter;
        let Some(key) = &letter.parked_key else {
            return true;
        };
        let table = self
            .application
            .as_deref()
            .or(letter.application.as_deref());
        !self.keys.iter().any(|(k, route)| {
            k.key == *key
                && Some(k.table.as_str()) == table
                && matches!(route, Route::Holders { .. })
        })
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
    warn_in_flight(&listing);
    let planned = match plan(sdk, &args, &listing).await {
        Ok(planned) => planned,
        Err(e) => {
            release(&store, &listing, &HashSet::new()).await;
            return Err(e);
        }
    };
    if args.dry_run || planned.chosen.is_empty() {
        release(&store, &listing, &HashSet::new()).await;
        dry_run(&planned, args.dry_run);
        return Ok(());
    }
    let (to_stream, to_holders): (Vec<&Chosen<'_>>, Vec<&Chosen<'_>>) =
        planned.chosen.iter().partition(|c| planned.to_stream(c));
    // The holders read their letters themselves: every message but those going into the
    // stream is made visible again now.
    let keep: HashSet<LetterId> = to_stream.iter().map(|c| c.first().id.clone()).collect();
    if let Err(e) = store.release(&listing, &keep).await {
        if !to_holders.is_empty() {
            release(&store, &listing, &HashSet::new()).await;
            return Err(anyhow::Error::new(e).context(
                "the letters could not be made visible again for the workers to read: nothing \
                 was redriven",
            ));
        }
        warn(&format!(
            "messages stay hidden until their visibility timeout ends: {e}"
        ));
    }
    let mut record = RecordFile::new(args.record.clone());
    holder::say_nowhere(&planned.keys);
    if !to_stream.is_empty() {
        through_stream(sdk, &args, &store, &planned, &to_stream, &mut record).await?;
    }
    let (asked, lost) = holder::request(&planned.keys, &mut record).await?;
    let letters: usize = to_holders.len();
    let keys = asked.len();
    holder::wait(asked, args.wait).await?;
    anyhow::ensure!(lost.is_empty(), "{}", lost.join("\n"));
    if keys > 0 {
        report(&format!(
            "{keys} parked key(s) replayed by their holders ({letters} letter(s)); record in {}",
            record.path().display()
        ));
    }
    Ok(())
}

/// The letters chosen, and the route of each parked key among them.
async fn plan<'a>(
    sdk: &aws_config::SdkConfig,
    args: &Args,
    listing: &'a Listing,
) -> anyhow::Result<Planned<'a>> {
    let chosen = choose(args, listing)?;
    let firsts: Vec<&Stored> = chosen.iter().map(Chosen::first).collect();
    let keys = holder::keys(args.application_name.as_deref(), &firsts)?;
    let readable = !matches!(
        args.from.location,
        kcl_aws::dead_letter::Location::Kinesis(_)
    );
    let keys = holder::route(sdk, keys, readable, args.through_stream).await?;
    let planned = Planned {
        chosen,
        keys,
        application: args.application_name.clone(),
    };
    let without_stream: Vec<String> = planned
        .chosen
        .iter()
        .filter(|c| c.stream.is_none() && planned.to_stream(c))
        .map(|c| c.first().id.to_string())
        .collect();
    anyhow::ensure!(
        without_stream.is_empty(),
        "these letters name no stream (their worker's DeadLetters has none): pass --to-stream: {}",
        without_stream.join(", ")
    );
    Ok(planned)
}

/// Says what a redrive would do (`--dry-run`), or that there is nothing to do.
fn dry_run(planned: &Planned<'_>, dry_run: bool) {
    if !dry_run {
        report("no letter to redrive");
        return;
    }
    let to_stream = planned.chosen.iter().filter(|c| planned.to_stream(c));
    let mut count = 0;
    for c in to_stream {
        report(&format!("would redrive {}", describe(c)));
        count += 1;
    }
    holder::dry_run(&planned.keys);
    report(&format!(
        "{count} letter(s) would be redriven into the stream, {} through their holders (dry run)",
        planned.chosen.len() - count
    ));
}

/// Puts the letters going into the stream back (unparking the `--through-stream` keys
/// first), records and deletes each; then makes those not redriven visible again.
async fn through_stream(
    sdk: &aws_config::SdkConfig,
    args: &Args,
    store: &LetterStore,
    planned: &Planned<'_>,
    to_stream: &[&Chosen<'_>],
    record: &mut RecordFile,
) -> anyhow::Result<()> {
    // Only these are held now: released at the end, but those redriven.
    let held = Listing {
        letters: to_stream
            .iter()
            .flat_map(|c| c.copies.iter().map(|s| (*s).clone()))
            .collect(),
        ..Listing::default()
    };
    if let Err(e) = unpark(sdk, args, &planned.keys).await {
        release(store, &held, &HashSet::new()).await;
        return Err(e);
    }
    let mut done = HashSet::new();
    let result = redrive(sdk, store, to_stream, record, &mut done).await;
    release(store, &held, &done).await;
    result?;
    report(&format!(
        "redrove {} letter(s); record in {}",
        done.len(),
        record.path().display()
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
    for (id, copies) in by_id {
        let first = copies[0];
        if (!ids.is_empty() && !ids.contains(id)) || !args.filters.matches(first, now) {
            continue;
        }
        let stream = to
            .clone()
            .or_else(|| first.letter.stream.clone().map(StreamRef::from));
        chosen.push(Chosen { copies, stream });
    }
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

/// Unparks the keys going back through the stream (`--through-stream`), so that their
/// records run when put back; then waits for the holders to see it.
async fn unpark(
    sdk: &aws_config::SdkConfig,
    args: &Args,
    keys: &[(Key, Route)],
) -> anyhow::Result<()> {
    let through: BTreeSet<(&str, &str)> = keys
        .iter()
        .filter(|(_, route)| matches!(route, Route::ThroughStream { .. }))
        .map(|(k, _)| (k.table.as_str(), k.key.as_str()))
        .collect();
    let mut changed = 0;
    for (table, key) in through {
        let store = crate::store(sdk, table);
        let rows = kcl_core::admin::unpark(&store, key)
            .await
            .with_context(|| format!("unparking key {key} in the lease table {table} failed"))?;
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

/// The stream `c` goes to (checked when planned).
fn stream<'c>(c: &'c Chosen<'_>) -> anyhow::Result<&'c StreamRef> {
    c.stream
        .as_ref()
        .with_context(|| format!("{} names no stream: pass --to-stream", c.first().id))
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
        c.stream
            .as_ref()
            .map_or_else(|| "(no stream)".to_owned(), ToString::to_string),
        record.partition_key,
        record.data.len()
    )
}

/// Puts each chosen letter back, records it, deletes it; the ids done go in `done`.
async fn redrive(
    sdk: &aws_config::SdkConfig,
    store: &LetterStore,
    chosen: &[&Chosen<'_>],
    record: &mut RecordFile,
    done: &mut HashSet<LetterId>,
) -> anyhow::Result<()> {
    // Opened before the first put, so that every put is recorded.
    record.open()?;
    let redriver = Redriver::new(sdk);
    for c in chosen {
        let id = &c.first().id;
        let redriven = redriver
            .put(&c.first().letter, stream(c)?)
            .await
            .with_context(|| format!("redriving {id} failed: it and the letters after it stay"))?;
        record.append(&line(c, &redriven))?;
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
                record.path().display(),
                store.location()
            )
        })?;
    }
    Ok(())
}

/// The record file's line for `c`.
fn line(c: &Chosen<'_>, redriven: &Redriven) -> serde_json::Value {
    serde_json::json!({
        "id": c.first().id.to_string(),
        "from": c.first().place(),
        "stream": match &c.stream { Some(StreamRef::Name(s) | StreamRef::Arn(s)) => s.as_str(), None => "" },
        "partition_key": c.first().letter.record.partition_key,
        "shard": redriven.shard,
        "sequence_number": redriven.sequence_number,
        "redriven_at": Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
    })
}
