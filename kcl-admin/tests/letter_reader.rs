//! kcl-aws's `SinkReader` (what a worker reads a parked key's letters back with, for a redrive
//! through the holder) against moto's SQS (standard and FIFO) and S3, and on a file:
//! `parked(key)` returns every letter of the key, copies included, and leaves every other
//! message visible to other readers at once; `remove` deletes the letter (every copy, and the
//! S3 object of a pointer), also once the replay took longer than the visibility timeout.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::time::Duration;

use kcl_aws::dead_letter::{
    FileSink, LetterId, LetterStore, Location, S3Sink, SinkReader, SqsSink, to_json,
};
use kcl_core::failure::{DeadLetter, DeadLetterSink as _, Kept, LetterReader as _};
use kcl_integration_tests::letters::{bucket, keys, letter, queue};
use kcl_integration_tests::{Context, with_timeout};

const KEY: &str = "00000000000000aa";
const OTHER: &str = "00000000000000bb";
const SHARD: &str = "shardId-000000000001";

/// Three letters of `KEY` (the second large: an S3 object behind a pointer, with an
/// overflow), two of `OTHER`, one that parks nothing.
fn letters(stream: &str) -> Vec<DeadLetter> {
    let mut all: Vec<DeadLetter> = (1..=3)
        .map(|n| letter(stream, SHARD, n * 10, KEY, vec![b'k'; 100 * n as usize]))
        .collect();
    all[1].record.data = vec![b'x'; 4000].into();
    all.extend((1..=2).map(|n| letter(stream, SHARD, n * 10 + 1, OTHER, b"other".to_vec())));
    let mut plain = letter(stream, SHARD, 99, "user-9", b"plain".to_vec());
    plain.parked_key = None;
    all.push(plain);
    all
}

/// The ids of `letters`, sorted.
fn ids<'a>(letters: impl IntoIterator<Item = &'a DeadLetter>) -> Vec<String> {
    let set: BTreeSet<String> = letters
        .into_iter()
        .map(|l| LetterId::of(l).to_string())
        .collect();
    set.into_iter().collect()
}

/// What another reader sees at `location` now (its messages released at once).
async fn visible(ctx: &Context, location: &Location) -> anyhow::Result<Vec<DeadLetter>> {
    let sdk = ctx.sdk_at(&ctx.endpoints.sqs).await;
    let store =
        LetterStore::open(&sdk, location.clone()).with_visibility_timeout(Duration::from_secs(5));
    let listing = store.list().await?;
    store.release(&listing, &Default::default()).await?;
    Ok(listing.letters.into_iter().map(|s| s.letter).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_holds_a_keys_letters_and_leaves_the_others_visible() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("letter-reader").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(240), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    for fifo in [false, true] {
        on_sqs(&ctx, fifo).await?;
    }
    on_s3(&ctx).await?;
    on_a_file(&ctx).await
}

async fn on_sqs(ctx: &Context, fifo: bool) -> anyhow::Result<()> {
    eprintln!("--- SQS, fifo: {fifo}");
    let url = queue(ctx, fifo).await?;
    let bucket = bucket(ctx).await?;
    let sdk = ctx.sdk_at(&ctx.endpoints.sqs).await;
    let sink = SqsSink::new(&sdk, &url)
        .with_message_limit(2048)
        .with_overflow(S3Sink::new(&sdk, &bucket, "large/"));
    let all = letters(&ctx.stream);
    for l in &all {
        sink.put(l).await?;
    }
    // A copy of the first (a standard queue keeps both; a FIFO one's deduplication one), and
    // a message that is no letter.
    sink.put(&all[0]).await?;
    let sqs = ctx.sqs_client().await;
    let mut junk = sqs
        .send_message()
        .queue_url(&url)
        .message_body("not a letter");
    if fifo {
        junk = junk
            .message_group_id("junk")
            .message_deduplication_id("junk");
    }
    junk.send().await?;
    let location = Location::Sqs {
        queue_url: url.clone(),
    };
    let reader = location.reader(&sdk).unwrap();

    let kept = reader.parked(KEY).await?;
    assert_eq!(
        ids(kept.iter().map(|k| &k.letter)),
        ids(&all[..3]),
        "every letter of the key"
    );
    assert_eq!(kept.len(), if fifo { 3 } else { 4 }, "every copy");
    assert!(
        kept.iter()
            .all(|k| k.letter.parked_key.as_deref() == Some(KEY))
    );
    // The others are visible at once; the key's are held.
    let seen = visible(ctx, &location).await?;
    assert_eq!(
        ids(&seen),
        ids(&all[3..]),
        "the others visible, the key's held"
    );

    // Removing the first removes both its copies (removing a copy again is no error); the
    // large one's object goes with it.
    let first = kept.iter().find(|k| k.letter == all[0]).unwrap();
    reader.remove(first).await?;
    let large = kept.iter().find(|k| k.letter == all[1]).unwrap();
    assert_eq!(keys(ctx, &bucket, "large/").await?.len(), 1);
    reader.remove(large).await?;
    assert_eq!(
        keys(ctx, &bucket, "large/").await?,
        Vec::<String>::new(),
        "the pointer's object"
    );
    // Read again (the reader lets go of what it held for the key first): the last letter, once.
    let again = reader.parked(KEY).await?;
    assert_eq!(again.len(), 1, "no copy of the first left");
    assert_eq!(again[0].letter, all[2]);
    for copy in kept.iter().filter(|k| k.letter == all[0]) {
        reader.remove(copy).await?;
    }

    // A replay slower than the visibility timeout: the receipts are stale, the letters found
    // again and deleted (the other key's, as the first reader still holds the key's last).
    let slow = SinkReader::sqs(&sdk, &url).with_visibility_timeout(Duration::from_secs(2));
    let kept: Vec<Kept> = slow.parked(OTHER).await?;
    assert_eq!(ids(kept.iter().map(|k| &k.letter)), ids(&all[3..5]));
    tokio::time::sleep(Duration::from_secs(3)).await;
    for k in &kept {
        slow.remove(k).await?;
    }
    let seen = visible(ctx, &location).await?;
    assert_eq!(
        ids(&seen),
        ids(&all[5..]),
        "the other key's letters deleted"
    );
    let last = kept_of(&reader.parked(KEY).await?, &all[2]);
    reader.remove(&last).await?;
    assert!(reader.parked(KEY).await?.is_empty());
    // Nothing left hidden by the readers.
    assert_eq!(ids(&visible(ctx, &location).await?), ids(&all[5..]));
    Ok(())
}

fn kept_of(kept: &[Kept], letter: &DeadLetter) -> Kept {
    kept.iter().find(|k| k.letter == *letter).unwrap().clone()
}

async fn on_s3(ctx: &Context) -> anyhow::Result<()> {
    eprintln!("--- S3");
    let bucket = bucket(ctx).await?;
    let sdk = ctx.sdk_at(&ctx.endpoints.s3).await;
    let sink = S3Sink::new(&sdk, &bucket, "app/");
    let all = letters(&ctx.stream);
    for l in &all {
        sink.put(l).await?;
    }
    let location = Location::S3 {
        bucket: bucket.clone(),
        prefix: "app/".into(),
    };
    let reader = location.reader(&sdk).unwrap();
    let kept = reader.parked(KEY).await?;
    assert_eq!(ids(kept.iter().map(|k| &k.letter)), ids(&all[..3]));
    for k in &kept {
        reader.remove(k).await?;
        reader.remove(k).await?;
    }
    assert_eq!(
        keys(ctx, &bucket, "app/").await?.len(),
        3,
        "the others kept"
    );
    assert!(reader.parked(KEY).await?.is_empty());
    Ok(())
}

async fn on_a_file(ctx: &Context) -> anyhow::Result<()> {
    eprintln!("--- a file");
    let path = ctx.path("letters.jsonl");
    let sink = FileSink::new(&path);
    let all = letters(&ctx.stream);
    for l in all.iter().chain([&all[0]]) {
        sink.put(l).await?;
    }
    let location = Location::File(path.clone());
    let sdk = ctx.sdk_at(&ctx.endpoints.sqs).await;
    let reader = location.reader(&sdk).unwrap();
    let kept = reader.parked(KEY).await?;
    assert_eq!(kept.len(), 4, "every copy");
    assert_eq!(ids(kept.iter().map(|k| &k.letter)), ids(&all[..3]));
    reader.remove(&kept[0]).await?;
    let left = std::fs::read_to_string(&path)?;
    let first = to_json(&kept[0].letter);
    assert!(!left.contains(&first), "every copy of the letter removed");
    assert_eq!(left.lines().count(), all.len() - 1);
    for k in &kept {
        reader.remove(k).await?;
    }
    let left = std::fs::read_to_string(&path)?;
    assert_eq!(left.lines().count(), all.len() - 3, "the others kept");
    assert!(
        Location::Kinesis("s".to_owned().into())
            .reader(&sdk)
            .is_none(),
        "no reader on Kinesis"
    );
    Ok(())
}
