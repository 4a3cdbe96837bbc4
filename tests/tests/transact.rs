//! Exactly-once outputs on DynamoDB (issue 51) against moto, through real workers: a
//! processor's writes commit with its checkpoint in one `TransactWriteItems`
//! (`kcl_aws::DynamoDbLeaseStore` as `kcl_core::outputs::Transact`), fenced by the lease row.
//!
//! Every write here is non-idempotent (`ADD #n :one`), so "applied once" is `n == 1`. What
//! moto cannot produce (a `TransactionConflict`, an answer lost after the transaction
//! applied, a renewal cancelled by a conflict) is injected by an SDK interceptor on the
//! worker's client (`inject`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

#[path = "transact/harness.rs"]
mod harness;
#[path = "transact/inject.rs"]
mod inject;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use kcl_core::lease::usage::Operation;
use kcl_core::outputs::Transact;
use kcl_core::{
    Checkpoint, CheckpointUpdate, ErrorKind, LeaseStore, LeaseStoreExtras, ShardId, WorkerId,
};
use kcl_integration_tests::wait_until;

use harness::{Keys, Note, Outcome, Setup, WORKER, add, create, fence_of, n, records, start, test};
use inject::{Answer, Fault};

/// 1. Writes and checkpoint land together; the counter is left alone, so the holder's next
/// renewal, conditional on the counter it holds, still succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_commit_with_the_checkpoint_and_leave_the_counter() -> anyhow::Result<()> {
    test("transact-together", 90, async |ctx| {
        // A long failover: the first renewal comes 10 s or more after the take.
        let setup = Setup {
            shards: 1,
            records: records("r", 5),
            failover: Duration::from_secs(60),
            commit_after: vec![5],
            keys: Keys::Told,
            permits: 0,
        };
        let mut run = start(&ctx, setup, |t, data, fence| {
            vec![add(t, &format!("rec-{data}"), fence)]
        })
        .await?;
        let Note::Started { shard, fence } = run.note().await? else {
            anyhow::bail!("not started")
        };
        let before = run.row(&shard).await?;
        assert_eq!(
            (before.owner.clone(), before.fence.map(|f| f.0)),
            (Some(WorkerId::new(WORKER)), Some(fence))
        );
        assert_eq!(before.checkpoint, Checkpoint::TrimHorizon);
        run.gate.add_permits(1);
        let (_, delivered, outcome) = run.committed().await?;
        assert_eq!(outcome, Outcome::Applied);
        assert_eq!(delivered.len(), 5);

        let after = run.row(&shard).await?;
        assert_eq!(
            after.counter, before.counter,
            "the commit moved the counter"
        );
        assert_eq!(after.owner, before.owner);
        assert_eq!(after.fence, before.fence);
        assert_eq!(after.owner_switches_since_checkpoint, 0);
        let last = run
            .ctx
            .read_shard(shard.as_str())
            .await?
            .last()
            .cloned()
            .unwrap();
        assert_eq!(
            after.checkpoint.as_str(),
            last.0,
            "the checkpoint is the last record's"
        );
        let outputs = run.outputs().await?;
        assert_eq!(outputs.len(), 5);
        for (id, item) in &outputs {
            assert_eq!((n(item), fence_of(item)), (1, fence), "{id}");
        }
        let attempts = run.faults.attempts();
        assert_eq!(attempts.len(), 1, "{attempts:?}");
        assert_eq!(attempts[0].actions, 6);
        assert!(
            !attempts[0].lease_update.contains("leaseCounter"),
            "{}",
            attempts[0].lease_update
        );
        assert_eq!(attempts[0].token.len(), 32);
        assert_eq!(
            run.store
                .usage()
                .unwrap()
                .of(Operation::CommitOutputs)
                .requests,
            1
        );

        // A plain checkpoint from the row as it was before the commit matches its owner and
        // counter, not its checkpoint: refused, or it would move the row back behind the
        // commit's outputs.
        let stale = run
            .ctx
            .store()
            .checkpoint(&before, &CheckpointUpdate::new(Checkpoint::TrimHorizon))
            .await;
        assert_eq!(stale.err().map(|e| e.kind()), Some(ErrorKind::Conflict));
        assert_eq!(run.row(&shard).await?.checkpoint, after.checkpoint);

        // The holder's renewal, from the counter it held before the commit.
        let renewed = run.ctx.store().renew(&before).await?;
        assert_eq!(renewed.counter, before.counter + 1);
        run.stop().await
    })
    .await
}

/// 2. A zombie: after another worker took the lease, or this worker's id took it again (a
/// new tenure, a new fence), the old tenure's commit is `LeaseLost` and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_commit_is_lease_lost_and_writes_nothing() -> anyhow::Result<()> {
    test("transact-zombie", 90, async |ctx| {
        let setup = Setup {
            shards: 2,
            records: records("z", 40),
            failover: Duration::from_secs(30),
            commit_after: vec![1],
            keys: Keys::Told,
            permits: 0,
        };
        let mut run = start(&ctx, setup, |t, data, fence| {
            vec![add(t, &format!("rec-{data}"), fence)]
        })
        .await?;
        let mut fences = BTreeMap::new();
        while fences.len() < 2 {
            if let Note::Started { shard, fence } = run.note().await? {
                fences.insert(shard, fence);
            }
        }
        let shards: Vec<ShardId> = fences.keys().cloned().collect();
        let plain = run.ctx.store();
        let thief = plain
            .take(&run.row(&shards[0]).await?, &WorkerId::new("thief"))
            .await?;
        let again = plain
            .take(&run.row(&shards[1]).await?, &WorkerId::new(WORKER))
            .await?;
        assert_eq!(again.owner, Some(WorkerId::new(WORKER)));
        assert!(
            again.fence.unwrap().0 > fences[&shards[1]]
                && thief.fence.unwrap().0 > fences[&shards[0]]
        );
        // One commit at a time: moto's transactions are not isolated from each other (a
        // cancelled one restores a copy of the tables taken when it began, which may hold
        // the writes of another one then in progress).
        let mut zombies = BTreeMap::new();
        for _ in 0..2 {
            run.gate.add_permits(1);
            loop {
                if let Note::Committed {
                    shard,
                    fence,
                    outcome,
                    ..
                } = run.note().await?
                    && fences[&shard] == fence
                    && !zombies.contains_key(&shard)
                {
                    zombies.insert(shard, outcome);
                    break;
                }
            }
        }
        assert!(
            zombies.values().all(|o| *o == Outcome::LeaseLost),
            "{zombies:?}"
        );
        // Both transactions reached the table and were refused by the lease row.
        let attempts = run.faults.attempts();
        for (shard, fence) in &fences {
            let refused = attempts
                .iter()
                .find(|a| a.ids.last() == Some(&shard.to_string()) && a.fence == fence.to_string())
                .unwrap();
            let Answer::Cancelled(codes) = &refused.answer else {
                panic!("{shard}: {refused:?}")
            };
            assert_eq!(
                codes.last().map(String::as_str),
                Some("ConditionalCheckFailed"),
                "{shard}: {codes:?}"
            );
            assert!(
                codes[..codes.len() - 1].iter().all(|c| c == "None"),
                "{codes:?}"
            );
        }
        let old: Vec<u64> = fences.values().copied().collect();
        let outputs = run.outputs().await?;
        let landed: Vec<_> = outputs
            .iter()
            .filter(|(_, item)| old.contains(&fence_of(item)))
            .collect();
        assert!(
            landed.is_empty(),
            "a zombie's writes landed: {landed:?}\n{:#?}",
            run.faults.attempts()
        );
        assert_eq!(
            run.row(&shards[0]).await?.checkpoint,
            Checkpoint::TrimHorizon
        );
        run.stop().await
    })
    .await
}

/// 3. A write refused by its own condition refuses the commit, named by its record;
/// nothing of it applies, the checkpoint included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_by_its_condition_refuses_the_whole_commit() -> anyhow::Result<()> {
    test("transact-refused", 90, async |ctx| {
        let setup = Setup {
            shards: 1,
            records: records("r", 5),
            failover: Duration::from_secs(30),
            commit_after: vec![5],
            keys: Keys::Told,
            permits: 0,
        };
        // Record r0 writes twice, so r2's write is write 3 (the lease row is the last action).
        let mut run = start(&ctx, setup, |t, data, fence| {
            let mut writes = vec![create(t, &format!("rec-{data}"), fence)];
            if data == "r0" {
                writes.push(add(t, "extra-r0", fence));
            }
            writes
        })
        .await?;
        let taken = ctx
            .dynamodb
            .put_item()
            .table_name(&run.out)
            .item("id", AttributeValue::S("rec-r2".into()));
        taken.send().await?;
        run.gate.add_permits(1);
        let (_, _, outcome) = run.committed().await?;
        assert_eq!(outcome, Outcome::Refused("r2".into()));
        let attempts = run.faults.attempts();
        assert_eq!(attempts.len(), 1, "refused, not retried: {attempts:?}");
        let Answer::Cancelled(codes) = &attempts[0].answer else {
            panic!("{attempts:?}")
        };
        assert_eq!(
            codes.iter().position(|c| c == "ConditionalCheckFailed"),
            Some(3),
            "{codes:?}"
        );
        let outputs = run.outputs().await?;
        assert_eq!(
            outputs.keys().collect::<Vec<_>>(),
            vec!["rec-r2"],
            "only the item there before"
        );
        let shard = ShardId::new("shardId-000000000000");
        assert_eq!(run.row(&shard).await?.checkpoint, Checkpoint::TrimHorizon);
        run.stop().await
    })
    .await
}

/// 3b. An item over 400 KB: DynamoDB (moto too) refuses the whole request with a
/// `ValidationException`, naming no write. The part is committed again one record at a time:
/// the record before it commits, the one over the limit is named, nothing after it applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_over_400_kb_is_found_and_named_by_its_record() -> anyhow::Result<()> {
    test("transact-invalid", 90, async |ctx| {
        let setup = Setup {
            shards: 1,
            records: records("v", 3),
            failover: Duration::from_secs(30),
            commit_after: vec![3],
            keys: Keys::Told,
            permits: 1,
        };
        let mut run = start(&ctx, setup, |t, data, fence| {
            let mut write = add(t, &format!("rec-{data}"), fence);
            if data == "v1" {
                let put = aws_sdk_dynamodb::types::Put::builder()
                    .table_name(t)
                    .item("id", AttributeValue::S("rec-v1".into()))
                    .item("body", AttributeValue::S("x".repeat(410 * 1024)))
                    .build()
                    .unwrap();
                write = aws_sdk_dynamodb::types::TransactWriteItem::builder()
                    .put(put)
                    .build();
            }
            vec![write]
        })
        .await?;
        let (_, _, outcome) = run.committed().await?;
        assert_eq!(outcome, Outcome::Invalid("v1".into()));
        let attempts = run.faults.attempts();
        let shapes: Vec<(usize, &Answer)> =
            attempts.iter().map(|a| (a.actions, &a.answer)).collect();
        let invalid = Answer::Failed("ValidationException".into());
        assert_eq!(
            shapes,
            vec![(4, &invalid), (2, &Answer::Applied), (2, &invalid)],
            "the part whole, then v0 alone, then v1 alone; never retried"
        );
        let outputs = run.outputs().await?;
        assert_eq!(outputs.keys().collect::<Vec<_>>(), vec!["rec-v0"]);
        assert_eq!(n(&outputs["rec-v0"]), 1);
        let shard = ShardId::new("shardId-000000000000");
        assert_eq!(
            run.row(&shard).await?.checkpoint.to_string(),
            attempts[1].checkpoint
        );
        run.stop().await
    })
    .await
}

/// 4. More writes than a transaction holds commit in parts through the checkpointer: whole
/// records, two writes of one item in different parts, each part checkpointing its last
/// record, the last part the last record; every write applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stretch_larger_than_a_transaction_commits_in_parts() -> anyhow::Result<()> {
    test("transact-parts", 120, async |ctx| {
        let setup = Setup {
            shards: 1,
            records: records("r", 250),
            failover: Duration::from_secs(30),
            commit_after: vec![250],
            keys: Keys::Told,
            permits: 10,
        };
        let mut run = start(&ctx, setup, |t, data, fence| {
            let mut writes = vec![add(t, &format!("rec-{data}"), fence)];
            match data {
                "r100" => writes.extend([add(t, "x-a", fence), add(t, "x-b", fence)]),
                "r20" | "r21" => writes.push(add(t, "pair", fence)),
                _ => {}
            }
            writes
        })
        .await?;
        let (_, delivered, outcome) = run.committed().await?;
        assert_eq!((outcome, delivered.len()), (Outcome::Applied, 250));

        let outputs = run.outputs().await?;
        assert_eq!(outputs.len(), 253);
        for (id, item) in &outputs {
            let expected = if id == "pair" { 2 } else { 1 };
            assert_eq!(n(item), expected, "{id}");
        }
        let attempts = run.faults.attempts();
        assert!(
            attempts
                .iter()
                .all(|a| a.answer == Answer::Applied && a.actions <= 100),
            "{attempts:?}"
        );
        assert_eq!(attempts.iter().map(|a| a.actions - 1).sum::<usize>(), 254);
        // Greedy, whole records: r0-r20 (the second write of `pair` starts a part), then
        // 99 writes (r21-r116, r100's three among them), 99, and the rest.
        let sizes: Vec<usize> = attempts.iter().map(|a| a.actions - 1).collect();
        assert_eq!(sizes, vec![22, 99, 99, 34]);
        let with = |id: &str| attempts.iter().position(|a| a.ids.iter().any(|i| i == id));
        assert_ne!(with("rec-r20"), with("rec-r21"));
        assert_eq!(with("x-a"), with("rec-r100"));
        assert_eq!(with("x-b"), with("rec-r100"));
        let stream = run.ctx.read_shard("shardId-000000000000").await?;
        let sequence = |data: &str| {
            stream
                .iter()
                .find(|(_, d)| d == data)
                .map(|(s, _)| s.clone())
                .unwrap()
        };
        let checkpoints: Vec<String> = attempts.iter().map(|a| a.checkpoint.clone()).collect();
        let expected: Vec<String> = ["r20", "r116", "r215", "r249"]
            .iter()
            .map(|d| sequence(d))
            .collect();
        assert_eq!(
            checkpoints, expected,
            "each part checkpoints its last record"
        );
        let shard = ShardId::new("shardId-000000000000");
        assert_eq!(run.row(&shard).await?.checkpoint.as_str(), sequence("r249"));
        run.stop().await
    })
    .await
}

/// 5. A transaction cancelled by a conflict is retried with the same token and applies once;
/// a renewal cancelled by a conflict keeps the lease (the next renewal succeeds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_are_retried_and_keep_the_lease() -> anyhow::Result<()> {
    test("transact-conflict", 90, async |ctx| {
        let setup = Setup {
            shards: 1,
            records: records("a", 3),
            failover: Duration::from_secs(6),
            commit_after: vec![3],
            keys: Keys::Told,
            permits: 0,
        };
        let mut run = start(&ctx, setup, |t, data, fence| {
            vec![add(t, &format!("rec-{data}"), fence)]
        })
        .await?;
        run.faults.script(&[Fault::Conflict, Fault::Conflict]);
        run.gate.add_permits(10);
        let (fence, _, outcome) = run.committed().await?;
        assert_eq!(outcome, Outcome::Applied);
        let attempts = run.faults.attempts();
        let answers: Vec<&Answer> = attempts.iter().map(|a| &a.answer).collect();
        let conflict = Answer::Cancelled(vec![
            "None".into(),
            "None".into(),
            "None".into(),
            "TransactionConflict".into(),
        ]);
        assert_eq!(answers, vec![&conflict, &conflict, &Answer::Applied]);
        assert!(
            attempts.iter().all(|a| a.token == attempts[0].token),
            "one token: {attempts:?}"
        );
        let outputs = run.outputs().await?;
        assert!(outputs.values().all(|item| n(item) == 1), "{outputs:?}");

        // Two renewals cancelled by a conflict: the lease stays, and so does the tenure.
        let shard = ShardId::new("shardId-000000000000");
        run.faults.cancel_renewals(2);
        wait_until(
            "two renewals cancelled",
            Duration::from_secs(20),
            Duration::from_millis(100),
            async || Ok(run.faults.renewals_cancelled() == 2),
        )
        .await?;
        let counter = run.row(&shard).await?.counter;
        wait_until(
            "a renewal past them",
            Duration::from_secs(10),
            Duration::from_millis(100),
            async || Ok(run.row(&shard).await?.counter > counter),
        )
        .await?;
        ctx.put(&records("b", 3)).await?;
        let (again, _, outcome) = run.committed().await?;
        assert_eq!(
            (again, outcome),
            (fence, Outcome::Applied),
            "the same tenure commits on"
        );
        assert!(run.notes.try_recv().is_err(), "no lease lost");
        let row = run.row(&shard).await?;
        assert_eq!(
            (row.owner, row.fence.map(|f| f.0)),
            (Some(WorkerId::new(WORKER)), Some(fence))
        );
        run.stop().await
    })
    .await
}

/// 6. A transaction applied whose answer was lost (a 504), after a conflict: the retry, with
/// the same token, does not apply it twice. DynamoDB answers it with success (the token);
/// moto keeps no tokens and refuses it by the checkpoint condition, and the core reads the
/// row to find it applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_applied_but_unanswered_applies_once() -> anyhow::Result<()> {
    test("transact-lost-answer", 90, async |ctx| {
        let setup = Setup {
            shards: 1,
            records: records("a", 3),
            failover: Duration::from_secs(30),
            commit_after: vec![3],
            keys: Keys::Told,
            permits: 0,
        };
        let mut run = start(&ctx, setup, |t, data, fence| {
            vec![add(t, &format!("rec-{data}"), fence)]
        })
        .await?;
        run.faults.script(&[Fault::Conflict, Fault::LoseAnswer]);
        run.gate.add_permits(1);
        let (_, _, outcome) = run.committed().await?;
        assert_eq!(outcome, Outcome::Applied);
        let attempts = run.faults.attempts();
        assert_eq!(attempts.len(), 3, "{attempts:?}");
        assert!(
            attempts.iter().all(|a| a.token == attempts[0].token),
            "one token: {attempts:?}"
        );
        let faults: Vec<Option<Fault>> = attempts.iter().map(|a| a.fault).collect();
        assert_eq!(
            faults,
            vec![Some(Fault::Conflict), Some(Fault::LoseAnswer), None]
        );
        assert!(
            matches!(&attempts[1].answer, Answer::Failed(_)),
            "{attempts:?}"
        );
        match &attempts[2].answer {
            Answer::Applied => {}
            Answer::Cancelled(codes) => assert_eq!(
                codes.last().map(String::as_str),
                Some("ConditionalCheckFailed")
            ),
            other => panic!("{other:?}"),
        }
        let outputs = run.outputs().await?;
        assert_eq!(outputs.len(), 3);
        assert!(
            outputs.values().all(|item| n(item) == 1),
            "applied twice: {outputs:?}"
        );
        let stream = run.ctx.read_shard("shardId-000000000000").await?;
        let row = run.row(&ShardId::new("shardId-000000000000")).await?;
        assert_eq!(row.checkpoint.as_str(), stream.last().unwrap().0);
        run.stop().await
    })
    .await
}

/// The write units of commits of 1, 10 and 99 writes: what moto reports (`ConsumedCapacity`)
/// and what DynamoDB's rule charges (two units per KB of each item written, the lease row's
/// included), printed for the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_units_of_commits() -> anyhow::Result<()> {
    test("transact-units", 120, async |ctx| {
        let setup = Setup { shards: 1, records: Vec::new(), failover: Duration::from_secs(30), commit_after: vec![1, 10, 99], permits: 10, keys: Keys::Told };
        let mut run = start(&ctx, setup, |t, data, fence| vec![add(t, &format!("rec-{data}"), fence)]).await?;
        let shard = ShardId::new("shardId-000000000000");
        let usage = run.store.usage().unwrap();
        let mut start = 0;
        for count in [1, 10, 99] {
            let before = usage.of(Operation::CommitOutputs);
            let batch: Vec<(String, String)> = (start..start + count).map(|i| (format!("k{i}"), format!("u{i}"))).collect();
            start += count;
            ctx.put(&batch).await?;
            let (fence, records, outcome) = run.committed().await?;
            assert_eq!((outcome, records.len()), (Outcome::Applied, count));
            let after = usage.of(Operation::CommitOutputs);
            let row = run.row(&shard).await?;
            let row_units = 2.0 * kcl_core::lease::usage::write_units(kcl_core::lease::usage::item_size(&row));
            let item_units: f64 = records
                .iter()
                .map(|d| 2.0 * kcl_core::lease::usage::write_units(run.store.measure(&add(&run.out, &format!("rec-{d}"), fence)).bytes))
                .sum();
            eprintln!(
                "transact units: {count} writes: moto reported {:.1} write units ({} request); DynamoDB's rule: {} ({} items + lease row {})",
                after.write_units - before.write_units,
                after.requests - before.requests,
                item_units + row_units,
                item_units,
                row_units
            );
            assert_eq!(after.requests - before.requests, 1);
        }
        run.stop().await
    })
    .await
}

/// Two records `Put` one item. DynamoDB refuses two actions on one item in a transaction, so
/// the store must know the table's key to name a `Put`'s item: described beforehand, or read
/// by the store itself at the first commit (DescribeTable), the two puts go into different
/// transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_of_one_item_are_split_once_the_store_knows_the_key() -> anyhow::Result<()> {
    for keys in [Keys::Described, Keys::Unknown] {
        test("transact-put-keys", 60, async |ctx| {
            let setup = Setup {
                shards: 1,
                records: records("p", 2),
                failover: Duration::from_secs(30),
                commit_after: vec![2],
                permits: 10,
                keys,
            };
            let mut run = start(&ctx, setup, |t, data, fence| {
                let put = aws_sdk_dynamodb::types::Put::builder()
                    .table_name(t)
                    .item("id", AttributeValue::S("latest".into()))
                    .item("data", AttributeValue::S(data.to_owned()))
                    .item("fence", AttributeValue::N(fence.to_string()));
                let put = put.build().unwrap();
                vec![
                    aws_sdk_dynamodb::types::TransactWriteItem::builder()
                        .put(put)
                        .build(),
                ]
            })
            .await?;
            let (_, _, outcome) = run.committed().await?;
            let attempts = run.faults.attempts();
            let outputs = run.outputs().await?;
            assert_eq!(outcome, Outcome::Applied, "{keys:?}");
            assert_eq!(
                attempts.iter().map(|a| a.actions).collect::<Vec<_>>(),
                vec![2, 2],
                "{keys:?}"
            );
            let latest = &outputs["latest"];
            assert_eq!(latest["data"].as_s().ok().map(String::as_str), Some("p1"));
            run.stop().await
        })
        .await?;
    }
    Ok(())
}
