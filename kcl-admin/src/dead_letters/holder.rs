//! `kcl-admin dead-letters redrive` of a parked key through its holders
//! ([`kcl_core::admin::plan_redrive`]): instead of unparking the key and putting its letters
//! back into the stream (where live records of the key arriving meanwhile would run before
//! them), the redrive writes a request into each open lease row that parks the key; the
//! worker holding that shard reads the key's letters back from the sink, runs them in order
//! before any later record of the key, removes each from the sink, and unparks the key. This
//! waits until every row asked no longer parks the key.
//!
//! A key parked nowhere in its table (no row parks it, or no table) goes back through the
//! stream as a letter that parks nothing. A key some of whose letters no holder can replay
//! (their shard and every shard after it ended, or it split into children that all park the
//! key) is refused, unless `--through-stream` sends that key back the old way.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{SecondsFormat, Utc};
use kcl_aws::DynamoDbLeaseStore;
use kcl_aws::dead_letter::{LetterId, Stored};
use kcl_core::admin::{RedrivePlan, plan_redrive, redrive_done, request_redrive};
use kcl_core::{ErrorKind, Lease, LeaseStore as _, ShardId};

use super::record::RecordFile;
use super::{report, warn};

/// How often the rows asked are read while waiting.
const POLL: Duration = Duration::from_secs(1);
/// How often the wait says what it waits for.
const SAY_EVERY: Duration = Duration::from_secs(15);

/// A parked key of the chosen letters, in one lease table.
pub(super) struct Key {
    /// The lease table.
    pub(super) table: String,
    /// The parked key (16 hex digits).
    pub(super) key: String,
    /// Its letters' partition key.
    partition_key: String,
    /// Its letters (one id per letter, copies aside), in id order.
    letters: Vec<LetterId>,
    /// How many of them each shard wrote.
    by_shard: BTreeMap<ShardId, usize>,
}

impl Key {
    fn name(&self) -> String {
        format!(
            "key {} (partition key {}, table {})",
            self.key, self.partition_key, self.table
        )
    }
}

/// How a parked key's letters go back.
pub(super) enum Route {
    /// Replayed by the holders of the rows that park the key.
    Holders {
        plan: RedrivePlan,
        rows: Vec<Lease>,
        store: Box<DynamoDbLeaseStore>,
    },
    /// No row parks the key: into the stream, as letters that park nothing.
    Nowhere,
    /// Some letters no holder can replay, and `--through-stream`: the key is unparked, then
    /// its letters go into the stream.
    ThroughStream { orphans: Vec<(ShardId, String)> },
}

/// The parked keys of `letters` (the chosen letters, one copy each), each in the lease table
/// `application` or else its letters' own application.
pub(super) fn keys(application: Option<&str>, letters: &[&Stored]) -> anyhow::Result<Vec<Key>> {
    let mut keys: BTreeMap<(String, String), Key> = BTreeMap::new();
    let mut unnamed = Vec::new();
    for stored in letters {
        let letter = &stored.letter;
        let Some(key) = &letter.parked_key else {
            continue;
        };
        let Some(table) = application.or(letter.application.as_deref()) else {
            unnamed.push(stored.id.to_string());
            continue;
        };
        let entry = keys
            .entry((table.to_owned(), key.clone()))
            .or_insert_with(|| Key {
                table: table.to_owned(),
                key: key.clone(),
                partition_key: letter.record.partition_key.clone(),
                letters: Vec::new(),
                by_shard: BTreeMap::new(),
            });
        if !entry.letters.contains(&stored.id) {
            entry.letters.push(stored.id.clone());
            *entry.by_shard.entry(letter.shard.clone()).or_default() += 1;
        }
    }
    anyhow::ensure!(
        unnamed.is_empty(),
        "these letters park a key but name no application: pass --application-name (the lease \
         table): {}",
        unnamed.join(", ")
    );
    Ok(keys.into_values().collect())
}

/// How each key goes back, from its table's rows; refuses keys some of whose letters no
/// holder can replay (all of them if holders cannot read the sink: `readable` false),
/// unless `through_stream`.
pub(super) async fn route(
    sdk: &aws_config::SdkConfig,
    keys: Vec<Key>,
    readable: bool,
    through_stream: bool,
) -> anyhow::Result<Vec<(Key, Route)>> {
    let mut rows_of: BTreeMap<String, Vec<Lease>> = BTreeMap::new();
    let mut routed = Vec::new();
    let mut refused = Vec::new();
    for key in keys {
        let store = crate::store(sdk, &key.table);
        if !rows_of.contains_key(&key.table) {
            let rows = match store.list().await {
                Ok(rows) => rows,
                // No table: no worker parks the key.
                Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
                Err(e) => {
                    return Err(anyhow::Error::new(e)
                        .context(format!("reading the lease table {} failed", key.table)));
                }
            };
            rows_of.insert(key.table.clone(), rows);
        }
        let rows = &rows_of[&key.table];
        let mut plan = plan_redrive(rows, &key.key, &key.by_shard);
        if !readable {
            let why = "the letters are in a Kinesis stream, whose records a worker cannot \
                       remove once replayed";
            plan.orphans = key
                .by_shard
                .keys()
                .map(|s| (s.clone(), why.to_owned()))
                .collect();
        }
        let route = if plan.requests.is_empty() && plan.ended.is_empty() {
            Route::Nowhere
        } else if plan.orphans.is_empty() {
            let rows = rows.clone();
            Route::Holders {
                plan,
                rows,
                store: Box::new(store),
            }
        } else if through_stream {
            Route::ThroughStream {
                orphans: plan.orphans,
            }
        } else {
            for (shard, why) in &plan.orphans {
                refused.push(format!("{}, letters of {shard}: {why}", key.name()));
            }
            continue;
        };
        routed.push((key, route));
    }
    anyhow::ensure!(
        refused.is_empty(),
        "no worker can replay these parked keys' letters before the key's later records:\n  \
         {}\npass --through-stream to unpark those keys and put their letters back into the \
         stream instead (a record of the key that arrives meanwhile may then run before them; \
         see docs/dead-letters.md)",
        refused.join("\n  ")
    );
    Ok(routed)
}

/// Who holds `shard`, as `rows` say.
fn holder(rows: &[Lease], shard: &ShardId) -> String {
    match rows
        .iter()
        .find(|r| r.key == *shard)
        .and_then(|r| r.owner.as_ref())
    {
        Some(owner) => format!("worker {owner}"),
        None => "no worker now: its next holder".to_owned(),
    }
}

/// The letters a request asks for: `{key}/redrive/{letters}/{shards}`.
fn count(request: &str) -> usize {
    request
        .split('/')
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Says which keys are parked nowhere (their letters go back into the stream).
pub(super) fn say_nowhere(routed: &[(Key, Route)]) {
    for (key, _) in routed.iter().filter(|(_, r)| matches!(r, Route::Nowhere)) {
        report(&format!(
            "{} is parked nowhere: its letters go back into the stream",
            key.name()
        ));
    }
}

/// What each route would do.
pub(super) fn dry_run(routed: &[(Key, Route)]) {
    for (key, route) in routed {
        match route {
            Route::Holders { plan, rows, .. } => {
                for (shard, _, request) in &plan.requests {
                    report(&format!(
                        "would ask the holder of {shard} ({}) to replay {} letter(s) of {}",
                        holder(rows, shard),
                        count(request),
                        key.name()
                    ));
                }
                for shard in &plan.ended {
                    report(&format!(
                        "would then unpark key {} in the ended shard {shard}",
                        key.key
                    ));
                }
            }
            Route::Nowhere => report(&format!(
                "{} is parked nowhere: its letters would go back into the stream",
                key.name()
            )),
            Route::ThroughStream { orphans } => {
                let shards: Vec<&str> = orphans.iter().map(|(s, _)| s.as_str()).collect();
                report(&format!(
                    "would unpark {} and put its letters back into the stream (--through-stream; \
                     no holder can replay those of {})",
                    key.name(),
                    shards.join(", ")
                ));
            }
        }
    }
}

/// A key whose holders were asked.
pub(super) type Asked<'a> = (&'a Key, &'a RedrivePlan, &'a DynamoDbLeaseStore);

/// Writes the requests of the keys replayed by their holders, each key recorded: the keys
/// asked, and what went wrong with the others (no row parks the key any more).
pub(super) async fn request<'a>(
    routed: &'a [(Key, Route)],
    record: &mut RecordFile,
) -> anyhow::Result<(Vec<Asked<'a>>, Vec<String>)> {
    let (mut asked_keys, mut lost) = (Vec::new(), Vec::new());
    for (key, route) in routed {
        let Route::Holders { plan, rows, store } = route else {
            continue;
        };
        record.open()?;
        let asked = request_redrive(store.as_ref(), plan)
            .await
            .with_context(|| format!("asking the holders of {} failed", key.name()))?;
        for (shard, _, request) in plan.requests.iter().filter(|r| asked.contains(&r.0)) {
            report(&format!(
                "asked the holder of {shard} ({}) to replay {} letter(s) of {}",
                holder(rows, shard),
                count(request),
                key.name()
            ));
        }
        record.append(&serde_json::json!({
            "key": key.key,
            "partition_key": key.partition_key,
            "table": key.table,
            "rows": asked.iter().map(ShardId::as_str).collect::<Vec<_>>(),
            "letters": key.letters.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "requested_at": Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
        }))?;
        if asked.is_empty() {
            lost.push(format!(
                "no row parks {} any more (unparked meanwhile): its {} letter(s) stay in the \
                 sink; redrive them again (a key parked nowhere goes back through the stream)",
                key.name(),
                key.letters.len()
            ));
        } else {
            asked_keys.push((key, plan, store.as_ref()));
        }
    }
    Ok((asked_keys, lost))
}

/// Waits up to `wait` until the holders replayed every key asked and unparked it; fails
/// naming the keys whose holder gave up (removed the request, the key still parked) or that
/// are not done in time.
pub(super) async fn wait(mut pending: Vec<Asked<'_>>, wait: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut said = start;
    let mut waiting: BTreeMap<String, Vec<ShardId>> = BTreeMap::new();
    // Keys whose rows were seen parked without a request, polls in a row.
    let mut unasked: BTreeMap<String, u32> = BTreeMap::new();
    let mut gave_up = Vec::new();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for asked in pending {
            let name = asked.0.name();
            match state(asked).await {
                Ok(State::Done) => {
                    report(&format!("done: {name} replayed and unparked"));
                    waiting.remove(&name);
                }
                Ok(State::Waiting { rows, requested }) => {
                    let polls = unasked.entry(name.clone()).or_default();
                    *polls = if requested { 0 } else { *polls + 1 };
                    if *polls >= 2 {
                        gave_up.push(format!("{name}: parked in {}", names(&rows)));
                        waiting.remove(&name);
                        continue;
                    }
                    waiting.insert(name, rows);
                    still.push(asked);
                }
                Err(e) => {
                    warn(&format!("reading the rows of {name}: {e}"));
                    still.push(asked);
                }
            }
        }
        pending = still;
        if !pending.is_empty() && start.elapsed() >= wait {
            anyhow::bail!(timed_out(&waiting, &gave_up, wait));
        }
        if !pending.is_empty() && said.elapsed() >= SAY_EVERY {
            said = Instant::now();
            for (key, rows) in &waiting {
                report(&format!(
                    "waiting for the holders of {key}: {}",
                    names(rows)
                ));
            }
        }
        if !pending.is_empty() {
            tokio::time::sleep(POLL).await;
        }
    }
    anyhow::ensure!(gave_up.is_empty(), gave_up_text(&gave_up));
    Ok(())
}

/// Where a key's redrive stands.
enum State {
    Done,
    /// `rows` still park the key; `requested` if each still carries a request.
    Waiting {
        rows: Vec<ShardId>,
        requested: bool,
    },
}

async fn state((key, plan, store): Asked<'_>) -> Result<State, kcl_core::BackendError> {
    let (done, rows) = redrive_done(store, plan).await?;
    if done {
        return Ok(State::Done);
    }
    let request = format!("{}/redrive/", key.key);
    let mut requested = true;
    for row in &rows {
        let lease = store.get(row).await?;
        let entries = lease.map(|l| l.parked_keys).unwrap_or_default();
        requested &= entries.iter().any(|e| e.starts_with(&request));
    }
    Ok(State::Waiting { rows, requested })
}

fn gave_up_text(gave_up: &[String]) -> String {
    format!(
        "the holders removed the request but did not unpark:\n  {}\neach refused it (its dead \
         letters have no reader: DeadLetters::reader; a Kinesis sink has none) or stopped the \
         replay (a letter failed again, or fewer letters were found than counted): the key stays \
         parked, and the letters not replayed stay in the sink. The worker's log says which; \
         redrive again once fixed",
        gave_up.join("\n  ")
    )
}

fn names(rows: &[ShardId]) -> String {
    let names: BTreeSet<&str> = rows.iter().map(ShardId::as_str).collect();
    names.into_iter().collect::<Vec<_>>().join(", ")
}

fn timed_out(
    waiting: &BTreeMap<String, Vec<ShardId>>,
    gave_up: &[String],
    wait: Duration,
) -> String {
    let keys: Vec<String> = waiting
        .iter()
        .map(|(key, rows)| format!("{key}: still parked in {}", names(rows)))
        .collect();
    let mut text = format!(
        "not replayed within {} (--wait):\n  {}\nthe requests stand, and each key stays parked \
         until the holder of its shard replays its letters. A worker whose dead letters have \
         no reader (DeadLetters::reader; a Kinesis sink has none) refuses the request: check \
         the worker's log",
        humantime::format_duration(wait),
        keys.join("\n  ")
    );
    if !gave_up.is_empty() {
        text = format!("{text}\n{}", gave_up_text(gave_up));
    }
    text
}
