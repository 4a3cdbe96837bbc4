//! The README's example as a user runs it: five processes of `examples/aws_consumer.rs`
//! (a plain `DynamoDbLeaseStore::new`, every default: `Coordination::Leader`, per-lease
//! renewals, 10 s failover) on one 8-shard stream. Every process stays up, the leases balance,
//! every record is printed; SIGKILL of the leader and then of a follower loses nothing while
//! a producer writes; SIGTERM of the rest hands every row back. Logs go to stderr without
//! colour codes; stdout carries only the records.
//!
//! Our own test worker wires the store as the binary does, so only this test catches what
//! the README's code alone would do (it once made every worker but the leader and the
//! standby exit at its first query of a missing owner index).

#![allow(clippy::print_stderr)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use kcl_core::{LeaseStore as _, ShardId};
use kcl_integration_tests::{Context, Producer, wait_until, with_timeout};

use common::example::{self, Example, pid_of, printed_payloads};

const SHARDS: usize = 8;
const WORKERS: usize = 5;
const LEADER_ROW: &str = "kcl-coordination/worker-leader";
const STANDBY_ROW: &str = "kcl-coordination/worker-standby";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_readme_examples_balance_survive_kills_and_hand_everything_back() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new("readme-fleet").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(300), Box::pin(run(ctx))).await
}

/// The fleet: running processes by pid, and those killed (what they printed counts).
struct Fleet {
    ctx: Context,
    examples: BTreeMap<u32, Example>,
    killed: Vec<Example>,
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(i32::try_from(SHARDS)?).await?;
    let first: Vec<(String, String)> = (0..80)
        .map(|i| (format!("key-{i}"), format!("first-{i}")))
        .collect();
    ctx.put(&first).await?;
    let mut expected: BTreeSet<String> = first.into_iter().map(|(_, data)| data).collect();
    let binary = example::binary("aws_consumer")?;
    let mut fleet = Fleet {
        ctx: ctx.clone(),
        examples: BTreeMap::new(),
        killed: Vec::new(),
    };
    for i in 0..WORKERS {
        let example = Example::spawn(
            &ctx,
            &binary,
            &format!("example-{i}"),
            &[&ctx.stream, &ctx.table],
        )?;
        fleet.examples.insert(example.pid(), example);
    }
    fleet
        .until_settled("five workers share the 8 leases, 1 or 2 each", &expected)
        .await?;

    let producer = Producer::start(&ctx, "live-", 4, Duration::from_millis(250));
    let leader = fleet.row_holder(LEADER_ROW).await?;
    eprintln!("SIGKILL of the leader, pid {leader}");
    fleet.kill(leader)?;
    fleet
        .until_settled("four workers share the 8 leases, 2 each", &expected)
        .await?;
    let (leader, standby) = fleet.roles().await?;
    let follower = *fleet
        .examples
        .keys()
        .find(|pid| **pid != leader && **pid != standby)
        .context("no follower among four workers")?;
    eprintln!("SIGKILL of a follower, pid {follower} (leader {leader}, standby {standby})");
    fleet.kill(follower)?;
    fleet
        .until_settled("three workers share the 8 leases, 2 or 3 each", &expected)
        .await?;
    expected.extend(producer.stop().await?);
    fleet
        .until_settled(
            "every record written during the kills is printed",
            &expected,
        )
        .await?;

    for example in fleet.examples.values() {
        example.signal("TERM")?;
    }
    for (pid, example) in &mut fleet.examples {
        let status = example.wait_exit(Duration::from_secs(30)).await?;
        ensure!(
            status.success(),
            "pid {pid} exits cleanly on SIGTERM ({status}):\n{}",
            example.output()
        );
    }
    for example in fleet.examples.values().chain(&fleet.killed) {
        example.logs_apart()?;
    }
    let held: Vec<_> = ctx
        .store()
        .list()
        .await?
        .into_iter()
        .filter_map(|lease| Some((lease.key, lease.owner?)))
        .collect();
    eprintln!("after SIGTERM of all: rows still owned: {held:?}");
    ensure!(
        held.is_empty(),
        "every lease and role row is released on SIGTERM, still owned: {held:?}"
    );
    Ok(())
}

impl Fleet {
    /// Waits until every running process is still up, every shard lease is held by one of
    /// them, each holds ⌊8/W⌋ or ⌈8/W⌉, and every payload of `expected` was printed.
    async fn until_settled(
        &mut self,
        what: &str,
        expected: &BTreeSet<String>,
    ) -> anyhow::Result<()> {
        let mut last = String::new();
        let settled = wait_until(what, Duration::from_secs(90), Duration::from_millis(250), async || {
            for (pid, example) in &mut self.examples {
                example.ensure_running(&format!("pid {pid}"))?;
            }
            let printed: BTreeSet<String> = self
                .examples
                .values()
                .chain(&self.killed)
                .flat_map(|e| printed_payloads(&e.stdout()))
                .collect();
            let missing = expected.difference(&printed).count();
            // The table may not exist yet.
            let owners = self.ctx.owners().await.unwrap_or_default();
            let mut held: BTreeMap<u32, usize> = self.examples.keys().map(|p| (*p, 0)).collect();
            let mut foreign = 0;
            for owner in owners.values() {
                match owner.as_deref().and_then(pid_of).and_then(|p| held.get_mut(&p)) {
                    Some(count) => *count += 1,
                    None => foreign += 1,
                }
            }
            let (low, high) = (SHARDS / held.len(), SHARDS.div_ceil(held.len()));
            last = format!("{missing} payloads not printed, {foreign} leases not held by a running process, held by pid: {held:?}");
            Ok(missing == 0
                && owners.len() == SHARDS
                && foreign == 0
                && held.values().all(|n| (low..=high).contains(n)))
        })
        .await;
        settled
            .map(drop)
            .with_context(|| format!("last seen: {last}\n{}", self.outputs()))
    }

    /// The pid of the process holding a role row.
    async fn row_holder(&self, row: &str) -> anyhow::Result<u32> {
        let lease = self.ctx.store().get(&ShardId::new(row)).await?;
        let owner = lease
            .and_then(|l| l.owner)
            .context("the row has no owner")?;
        let pid = pid_of(owner.as_str()).context("not a default worker id")?;
        if !self.examples.contains_key(&pid) {
            bail!("{row} is held by {owner}, not a running process");
        }
        Ok(pid)
    }

    /// The leader's and the standby's pids, once running processes hold both rows (the leader
    /// hands the standby row to a follower when the standby moves up, and the follower takes
    /// it at its next index query: within a cycle and half a failover time).
    async fn roles(&self) -> anyhow::Result<(u32, u32)> {
        let mut roles = None;
        wait_until(
            "a running leader and standby",
            Duration::from_secs(60),
            Duration::from_millis(250),
            async || {
                let leader = self.row_holder(LEADER_ROW).await;
                let standby = self.row_holder(STANDBY_ROW).await;
                roles = leader.ok().zip(standby.ok());
                Ok(roles.is_some())
            },
        )
        .await?;
        roles.context("no roles")
    }

    /// SIGKILL of one process, which leaves the fleet.
    fn kill(&mut self, pid: u32) -> anyhow::Result<()> {
        let example = self.examples.remove(&pid).context("no such process")?;
        example.signal("KILL")?;
        self.killed.push(example);
        Ok(())
    }

    fn outputs(&self) -> String {
        let tails = self.examples.iter().map(|(pid, e)| {
            let output = e.output();
            let lines: Vec<&str> = output.lines().collect();
            format!(
                "--- pid {pid}\n{}",
                lines[lines.len().saturating_sub(15)..].join("\n")
            )
        });
        tails.collect::<Vec<_>>().join("\n")
    }
}
