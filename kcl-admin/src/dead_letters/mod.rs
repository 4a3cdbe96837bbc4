//! `kcl-admin dead-letters`: the records a fleet's failure policy gave up on, where its sink put
//! them (an SQS queue, S3, a Kinesis stream or a file; see [`kcl_aws::dead_letter`]): `list`
//! them, `show` one whole, `redrive` some back into their stream.
//!
//! A letter is named by its id, `shard/sequence/subsequence`. Reading an SQS queue receives
//! its messages (hiding each from other readers for the visibility timeout) and makes them
//! visible again at the end, but those a redrive deleted.

mod holder;
mod record;
mod redrive;
mod show;

use std::time::Duration;

use chrono::{DateTime, Utc};
use kcl_aws::dead_letter::{LetterStore, Listing, Location, Stored};

/// Arguments of `kcl-admin dead-letters`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// The letters, one a line (or as JSON), oldest shard position first.
    List(ListArgs),
    /// One letter, whole: its record (the payload as text if it is UTF-8, else base64), where
    /// it came from and how it failed.
    Show(show::Args),
    /// Puts letters back into their stream (each with its partition key and explicit hash
    /// key), writes what went where to a record file, then deletes each from the sink.
    Redrive(redrive::Args),
}

/// Where the letters are.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct FromArgs {
    /// Where the sink put the letters: `sqs:QUEUE-URL`, `s3://BUCKET/PREFIX`,
    /// `kinesis:STREAM` (name or ARN) or `file:PATH`.
    #[arg(long = "from", env = "KCL_DEAD_LETTERS", value_name = "LOCATION")]
    location: Location,
}

impl FromArgs {
    /// The letters there; an SQS queue's messages stay hidden from other readers for
    /// `visibility` once received.
    /// A file that is not there is an error, not an empty list (a typo would read as "no
    /// dead letters").
    fn open(
        &self,
        sdk: &aws_config::SdkConfig,
        visibility: Duration,
    ) -> anyhow::Result<LetterStore> {
        if let kcl_aws::dead_letter::Location::File(path) = &self.location {
            anyhow::ensure!(path.is_file(), "{}: no such file", path.display());
        }
        Ok(LetterStore::open(sdk, self.location.clone()).with_visibility_timeout(visibility))
    }
}

/// Which letters: all of those given must match.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct Filters {
    /// Letters of this shard (its id).
    #[arg(long)]
    shard: Option<String>,
    /// Letters of this partition key.
    #[arg(long)]
    key: Option<String>,
    /// Letters whose first or last error contains this text.
    #[arg(long)]
    error: Option<String>,
    /// Letters dead-lettered longer ago than this (`2h`, `3days`).
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
    /// Letters dead-lettered within this (`30m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    newer_than: Option<Duration>,
}

impl Filters {
    /// Whether any filter is given.
    fn any(&self) -> bool {
        self.shard.is_some()
            || self.key.is_some()
            || self.error.is_some()
            || self.older_than.is_some()
            || self.newer_than.is_some()
    }

    /// Whether `stored` passes every filter given, at `now`.
    fn matches(&self, stored: &Stored, now: DateTime<Utc>) -> bool {
        let letter = &stored.letter;
        let age = now.signed_duration_since(letter.dead_lettered);
        let longer = |d: &Duration| chrono::Duration::from_std(*d).is_ok_and(|d| age > d);
        self.shard
            .as_ref()
            .is_none_or(|s| letter.shard.as_str() == s)
            && self
                .key
                .as_ref()
                .is_none_or(|k| &letter.record.partition_key == k)
            && self.error.as_ref().is_none_or(|e| {
                letter.first_error.contains(e.as_str()) || letter.last_error.contains(e.as_str())
            })
            && self.older_than.as_ref().is_none_or(longer)
            && self.newer_than.as_ref().is_none_or(|d| !longer(d))
    }
}

/// Arguments of `kcl-admin dead-letters list`.
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    from: FromArgs,
    #[command(flatten)]
    filters: Filters,
    /// JSON instead of a table: `{"letters": [{"id", "place", "letter"}], "unreadable": [...], "in_flight": n}`,
    /// each letter in kcl-aws's dead-letter format.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(sdk: &aws_config::SdkConfig, args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::List(args) => list(sdk, args).await,
        Command::Show(args) => show::run(sdk, args).await,
        Command::Redrive(args) => redrive::run(sdk, args).await,
    }
}

/// How long a listing hides an SQS queue's messages at most: released at its end.
const LISTING_VISIBILITY: Duration = Duration::from_secs(30);

async fn list(sdk: &aws_config::SdkConfig, args: ListArgs) -> anyhow::Result<()> {
    let store = args.from.open(sdk, LISTING_VISIBILITY)?;
    let listing = store.list().await?;
    release(&store, &listing, &Default::default()).await;
    warn_unreadable(&listing);
    warn_in_flight(&listing);
    let now = Utc::now();
    let letters: Vec<&Stored> = listing
        .letters
        .iter()
        .filter(|s| args.filters.matches(s, now))
        .collect();
    if args.json {
        let doc = serde_json::json!({
            "letters": letters.iter().map(|s| show::json(s)).collect::<Vec<_>>(),
            "unreadable": listing.unreadable.iter().map(|u| serde_json::json!({
                "place": u.place,
                "error": u.error,
            })).collect::<Vec<_>>(),
            "in_flight": listing.in_flight,
        });
        report(&serde_json::to_string_pretty(&doc)?);
    } else {
        report(&show::table(&letters, now));
    }
    Ok(())
}

/// Makes an SQS queue's messages visible again (but those of `except`); a failure is only
/// said: they come back by themselves when their visibility timeout ends.
async fn release(
    store: &LetterStore,
    listing: &Listing,
    except: &std::collections::HashSet<kcl_aws::dead_letter::LetterId>,
) {
    if let Err(e) = store.release(listing, except).await {
        warn(&format!(
            "messages stay hidden until their visibility timeout ends: {e}"
        ));
    }
}

fn warn_unreadable(listing: &Listing) {
    for u in &listing.unreadable {
        warn(&format!(
            "{}: unreadable, left as it is: {}",
            u.place, u.error
        ));
    }
}

/// Says how many messages another reader holds: neither listed nor redriven by this run.
fn warn_in_flight(listing: &Listing) {
    if listing.in_flight > 0 {
        warn(&format!(
            "about {} more message(s) are in flight, received by another reader (a listing or \
             a redrive elsewhere, a worker replaying a parked key): not read by this run; \
             they show again once that reader deletes or releases them, or its visibility \
             timeout ends",
            listing.in_flight
        ));
    }
}

#[allow(clippy::print_stdout)]
fn report(text: &str) {
    println!("{text}");
}

#[allow(clippy::print_stderr)]
fn warn(text: &str) {
    eprintln!("kcl-admin: {text}");
}
