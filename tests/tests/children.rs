//! Children start at once under a leader, with worker processes on the emulators: a follower
//! (neither the leader nor the standby: it never reads the table nor syncs shards) reads a
//! split parent to its end; the leader sees the parent's `SHARD_END` in its next read of the
//! table (through the stream) and syncs then, not at its next periodic sync (60 s here). The
//! children's leases exist within a leader cycle or two of the parent's end, and their first
//! records are processed a few seconds later (the worker they are assigned to adopts them at
//! its next index query, every half failover time).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use kcl_aws::KinesisShardSource;
use kcl_core::{LeaseStore as _, ShardId, ShardSource};
use kcl_integration_tests::{Context, WorkerProcess, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const TAKER: Duration = Duration::from_secs(1);
const FAILOVER: Duration = Duration::from_secs(3);
const IDS: [&str; 4] = ["worker-a", "worker-b", "worker-c", "worker-d"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_shard_end_starts_the_children_within_a_leader_cycle() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("children").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), Box::pin(run(ctx))).await
}

/// The owner of a coordination row.
async fn holder(ctx: &Context, row: &str) -> anyhow::Result<Option<String>> {
    let row = ctx.store().get(&ShardId::new(row)).await?;
    Ok(row.and_then(|l| l.owner).map(|o| o.as_str().to_owned()))
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(4).await?;
    let args = [
        "--taker-ms",
        "1000",
        "--failover-ms",
        "3000",
        "--shard-sync-ms",
        "60000",
    ];
    let workers: Vec<WorkerProcess> = IDS
        .iter()
        .map(|id| WorkerProcess::spawn_in("leader", WORKER, &ctx, id, &args))
        .collect::<anyhow::Result<_>>()?;
    let mut roles = (None, None);
    wait_until(
        "four workers holding a lease each, a leader and a standby",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            // (The table may not exist yet.)
            let owners = ctx.owners().await.unwrap_or_default();
            let mut by: BTreeMap<Option<String>, usize> = BTreeMap::new();
            for owner in owners.values() {
                *by.entry(owner.clone()).or_default() += 1;
            }
            roles = (
                holder(&ctx, "kcl-coordination/worker-leader")
                    .await
                    .unwrap_or_default(),
                holder(&ctx, "kcl-coordination/worker-standby")
                    .await
                    .unwrap_or_default(),
            );
            Ok(by.len() == 4
                && by.values().all(|n| *n == 1)
                && roles.0.is_some()
                && roles.1.is_some())
        },
    )
    .await?;
    let (leader, standby) = (roles.0.unwrap(), roles.1.unwrap());
    let owners = ctx.owners().await?;
    let (parent, follower) = owners
        .iter()
        .find_map(|(shard, owner)| {
            let owner = owner.as_ref()?;
            (*owner != leader && *owner != standby).then(|| (shard.clone(), owner.clone()))
        })
        .context("no follower holds a shard")?;
    let follower = workers.iter().find(|w| w.id == follower).unwrap();

    // Split the follower's shard in the middle of its hash keys.
    let source = KinesisShardSource::from_client(ctx.kinesis.clone(), ctx.stream.clone());
    let shards = source.list_shards().await?;
    let range = shards
        .iter()
        .find(|s| s.id.as_str() == parent)
        .unwrap()
        .hash_key_range;
    let middle = range.start + (range.end - range.start) / 2 + 1;
    ctx.kinesis
        .split_shard()
        .stream_name(&ctx.stream)
        .shard_to_split(&parent)
        .new_starting_hash_key(middle.to_string())
        .send()
        .await?;
    ctx.wait_stream_active().await?;
    let children: Vec<String> = source
        .list_shards()
        .await?
        .into_iter()
        .filter(|s| s.parent_shard_ids.iter().any(|p| p.as_str() == parent))
        .map(|s| s.id.as_str().to_owned())
        .collect();
    anyhow::ensure!(children.len() == 2, "children of {parent}: {children:?}");

    // When the follower read the parent to its end, on its own clock (this machine's).
    let mut ended = None;
    wait_until(
        "the follower at the parent's end",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            ended = follower
                .events()?
                .iter()
                .find(|e| e.event == "shard_end" && e.shard.as_deref() == Some(parent.as_str()))
                .map(|e| e.ms);
            Ok(ended.is_some())
        },
    )
    .await?;
    let ended = ended.unwrap();
    let mut leased = None;
    wait_until(
        "the children's leases",
        Duration::from_secs(90),
        Duration::from_millis(100),
        async || {
            let owners = ctx.owners().await?;
            if children.iter().all(|c| owners.contains_key(c)) {
                leased = Some(now_ms());
            }
            Ok(leased.is_some())
        },
    )
    .await?;
    let leased = leased.unwrap();
    // A record for each child, and when it is processed.
    let mut keys = BTreeMap::new();
    for i in 0..200 {
        let key = format!("pk-{i}");
        let (shard, _) = ctx.put_one(&key, &format!("child-{i}")).await?;
        if children.contains(&shard) {
            keys.entry(shard).or_insert(key);
        }
        if keys.len() == 2 {
            break;
        }
    }
    let put = now_ms();
    let mut processed = None;
    wait_until(
        "a record of each child processed",
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || {
            let mut last = 0;
            for child in &children {
                let mut first = None;
                for w in &workers {
                    first = first.or(w
                        .events()?
                        .iter()
                        .find(|e| e.event == "record" && e.shard.as_deref() == Some(child.as_str()))
                        .map(|e| e.ms));
                }
                let Some(at) = first else {
                    return Ok(false);
                };
                last = last.max(at);
            }
            processed = Some(last);
            Ok(true)
        },
    )
    .await?;
    let processed = processed.unwrap();
    let after = |ms: i64| Duration::from_millis(u64::try_from(ms - ended).unwrap_or(0));
    eprintln!(
        "leader {leader}, standby {standby}, follower {} ended {parent}: children's leases {:?} after its end (polled every 100 ms), a record of each processed {:?} after (put {:?} after)",
        follower.id,
        after(leased),
        after(processed),
        after(put)
    );
    // The leader's next read (a taker interval, plus the stream's delay), then its sync.
    let bound = TAKER * 3 + Duration::from_secs(1);
    assert!(
        after(leased) <= bound,
        "children's leases {:?} after the parent's end, bound {bound:?} (periodic sync every 60 s)",
        after(leased)
    );
    // Then an assignment and the new owner's next index query (the records were put once
    // the leases existed).
    let bound = after(put).max(bound) + FAILOVER / 2 + TAKER * 2;
    assert!(
        after(processed) <= bound,
        "children processed {:?} after the parent's end, bound {bound:?}",
        after(processed)
    );
    for w in &workers {
        w.terminate()?;
    }
    for mut w in workers {
        w.wait_exit(Duration::from_secs(20)).await?;
    }
    Ok(())
}
