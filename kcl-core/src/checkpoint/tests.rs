use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::*;
use crate::lease::tenure::{Taken, Timing};
use crate::lease::{Lease, LeaseStore, TableFeatures};
use crate::memory::MemoryLeaseStore;
use crate::types::{SequenceNumber, WorkerId};

fn pos(n: u64) -> ExtendedSequenceNumber {
    ExtendedSequenceNumber::new(
        SequenceNumber::parse(n.to_string()).unwrap_or_else(|| unreachable!()),
    )
}

fn key() -> ShardId {
    ShardId::new("shardId-000000000000")
}

async fn row(store: &MemoryLeaseStore) -> Lease {
    store
        .get(&key())
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| unreachable!("row exists"))
}

/// A fresh table with one lease, taken by `worker`; returns its tenure.
async fn taken(store: &MemoryLeaseStore, worker: &str) -> Arc<Tenure> {
    let _ = store.ensure_table(TableFeatures::NONE).await;
    let _ = store
        .create(&Lease::new(key(), Checkpoint::TrimHorizon))
        .await;
    retake(store, worker).await
}

async fn retake(store: &MemoryLeaseStore, worker: &str) -> Arc<Tenure> {
    let observed = row(store).await;
    let w = WorkerId::new(worker);
    let lease = store
        .take(&observed, &w)
        .await
        .unwrap_or_else(|e| unreachable!("{e}"));
    let taken = Taken {
        lease,
        worker: w,
        store: Arc::new(store.client(worker)),
        started: Instant::now(),
    };
    let timing = Timing {
        failover_time: Duration::from_secs(10),
        call_timeout: Duration::from_secs(10),
    };
    Arc::new(Tenure::new(taken, timing))
}

#[tokio::test(start_paused = true)]
async fn refuses_positions_not_delivered_or_behind() {
    let store = MemoryLeaseStore::new();
    let mut cp = Checkpointer::new(taken(&store, "a").await);
    assert!(matches!(
        cp.checkpoint_at(pos(5)).await,
        Err(CheckpointError::NotDelivered { .. })
    ));
    assert!(
        cp.checkpoint().await.is_ok(),
        "nothing delivered: nothing to write"
    );
    cp.set_last_delivered(pos(10));
    assert!(matches!(
        cp.checkpoint_at(pos(11)).await,
        Err(CheckpointError::NotDelivered { .. })
    ));
    cp.checkpoint_at(pos(7))
        .await
        .unwrap_or_else(|e| unreachable!("{e}"));
    assert!(matches!(
        cp.checkpoint_at(pos(6)).await,
        Err(CheckpointError::Backwards { .. })
    ));
    cp.checkpoint_at(pos(7))
        .await
        .unwrap_or_else(|e| unreachable!("repeating is fine: {e}"));
    cp.checkpoint()
        .await
        .unwrap_or_else(|e| unreachable!("{e}"));
    assert_eq!(row(&store).await.checkpoint, Checkpoint::Sequence(pos(10)));
}

#[tokio::test(start_paused = true)]
async fn two_phase_writes_pending_then_commits() {
    let store = MemoryLeaseStore::new();
    let mut cp = Checkpointer::new(taken(&store, "a").await);
    assert!(matches!(
        cp.prepare_checkpoint(None).await,
        Err(CheckpointError::NothingDelivered { .. })
    ));
    cp.set_last_delivered(pos(3));
    let prepared = cp
        .prepare_checkpoint(None)
        .await
        .unwrap_or_else(|e| unreachable!("{e}"));
    let r = row(&store).await;
    assert_eq!(
        (r.checkpoint, r.pending_checkpoint),
        (Checkpoint::TrimHorizon, Some(Checkpoint::Sequence(pos(3))))
    );
    cp.commit(prepared)
        .await
        .unwrap_or_else(|e| unreachable!("{e}"));
    let r = row(&store).await;
    assert_eq!(
        (r.checkpoint, r.pending_checkpoint),
        (Checkpoint::Sequence(pos(3)), None)
    );
}

#[tokio::test(start_paused = true)]
async fn fails_with_lease_lost_once_taken_even_by_a_later_tenure_of_the_same_worker() {
    let store = MemoryLeaseStore::new();
    let first = taken(&store, "a").await;
    let mut old = Checkpointer::new(first.clone());
    old.set_last_delivered(pos(1));
    old.checkpoint()
        .await
        .unwrap_or_else(|e| unreachable!("{e}"));

    // Another worker takes the lease (as after expiry): the old owner is fenced off.
    let _b = retake(&store, "b").await;
    old.set_last_delivered(pos(2));
    assert!(matches!(
        old.checkpoint().await,
        Err(CheckpointError::LeaseLost { .. })
    ));
    assert!(first.is_lost());

    // The first worker takes it back: only the new tenure's processor may checkpoint.
    let second = retake(&store, "a").await;
    old.set_last_delivered(pos(3));
    assert!(matches!(
        old.checkpoint().await,
        Err(CheckpointError::LeaseLost { .. })
    ));
    let mut new = Checkpointer::new(second);
    new.set_last_delivered(pos(3));
    new.checkpoint()
        .await
        .unwrap_or_else(|e| unreachable!("{e}"));
    assert_eq!(row(&store).await.checkpoint, Checkpoint::Sequence(pos(3)));
}

#[tokio::test(start_paused = true)]
async fn renewals_and_checkpoints_never_fail_each_other() {
    let store = MemoryLeaseStore::new();
    store.faults().set_max_latency(Duration::from_millis(30));
    let tenure = taken(&store, "a").await;
    let renewer = {
        let tenure = tenure.clone();
        tokio::spawn(async move {
            for _ in 0..200 {
                tenure.renew().await.map_err(|e| format!("{e:?}"))?;
            }
            Ok::<(), String>(())
        })
    };
    let mut cp = Checkpointer::new(tenure.clone());
    for n in 1..=200 {
        cp.set_last_delivered(pos(n));
        cp.checkpoint()
            .await
            .unwrap_or_else(|e| unreachable!("checkpoint {n}: {e}"));
    }
    assert_eq!(renewer.await.ok(), Some(Ok(())));
    let r = row(&store).await;
    assert_eq!(r.checkpoint, Checkpoint::Sequence(pos(200)));
    assert_eq!(
        r.counter,
        1 + 200 + 200,
        "one take, then every write applied once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_that_applied_but_reported_failure_does_not_lose_the_lease() {
    let store = MemoryLeaseStore::new();
    let tenure = taken(&store, "a").await;
    let mut cp = Checkpointer::new(tenure.clone());
    cp.set_last_delivered(pos(4));
    store.faults().set_ambiguous_rate(1.0);
    assert!(matches!(
        cp.checkpoint().await,
        Err(CheckpointError::Store { .. })
    ));
    store.faults().set_ambiguous_rate(0.0);
    assert_eq!(
        row(&store).await.checkpoint,
        Checkpoint::Sequence(pos(4)),
        "it did apply"
    );
    cp.set_last_delivered(pos(5));
    cp.checkpoint()
        .await
        .unwrap_or_else(|e| unreachable!("reconciled, not lost: {e}"));
    assert!(!tenure.is_lost());
    assert_eq!(row(&store).await.checkpoint, Checkpoint::Sequence(pos(5)));
}

#[tokio::test(start_paused = true)]
async fn a_lease_written_back_to_us_by_someone_else_is_not_taken_for_our_own_write() {
    // Our write timed out without applying; meanwhile another worker took the lease and a
    // leader assigned it back to us. The row names us, further along than our write could
    // have moved it: our old tenure must end, not carry on.
    let store = MemoryLeaseStore::new();
    let tenure = taken(&store, "a").await;
    let mut cp = Checkpointer::new(tenure.clone());
    cp.set_last_delivered(pos(4));
    store.faults().set_error_rate(1.0);
    assert!(cp.checkpoint().await.is_err(), "uncertain");
    store.faults().set_error_rate(0.0);
    let taken_by_b = store
        .take(&row(&store).await, &WorkerId::new("b"))
        .await
        .unwrap_or_else(|e| unreachable!("{e}"));
    store
        .take(&taken_by_b, &WorkerId::new("a"))
        .await
        .unwrap_or_else(|e| unreachable!("{e}"));
    cp.set_last_delivered(pos(5));
    assert!(matches!(
        cp.checkpoint().await,
        Err(CheckpointError::LeaseLost { .. })
    ));
    assert!(tenure.is_lost());
}

#[tokio::test(start_paused = true)]
async fn shard_end_is_written_with_children_and_is_final() {
    let store = MemoryLeaseStore::new();
    let mut cp = Checkpointer::new(taken(&store, "a").await);
    cp.set_last_delivered(pos(9));
    cp.set_shard_end(vec![ShardId::new("child")]);
    cp.checkpoint()
        .await
        .unwrap_or_else(|e| unreachable!("{e}"));
    let r = row(&store).await;
    assert_eq!(
        (r.checkpoint, r.child_shard_ids),
        (Checkpoint::ShardEnd, vec![ShardId::new("child")])
    );
    assert!(matches!(
        cp.checkpoint_at(pos(9)).await,
        Err(CheckpointError::Backwards { .. })
    ));
}

#[derive(Debug, Clone)]
enum Op {
    Deliver(u64),
    At(u64),
    Last,
    TwoPhase,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..5).prop_map(Op::Deliver),
        (1u64..60).prop_map(Op::At),
        Just(Op::Last),
        Just(Op::TwoPhase),
    ]
}

proptest! {
    /// Against a model: a checkpoint is accepted exactly when it is delivered and not behind,
    /// and the stored checkpoint only ever moves forward.
    #[test]
    fn checkpoints_follow_the_rules(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build()?;
        rt.block_on(async {
            let store = MemoryLeaseStore::new();
            let mut cp = Checkpointer::new(taken(&store, "a").await);
            let (mut delivered, mut stored) = (0u64, 0u64);
            for op in ops {
                match op {
                    Op::Deliver(n) => {
                        delivered += n;
                        cp.set_last_delivered(pos(delivered));
                    }
                    Op::At(p) => {
                        let ok = cp.checkpoint_at(pos(p)).await.is_ok();
                        prop_assert_eq!(ok, p <= delivered && delivered > 0 && p >= stored);
                        if ok { stored = p; }
                    }
                    Op::Last => {
                        prop_assert!(cp.checkpoint().await.is_ok());
                        if delivered > 0 { stored = delivered; }
                    }
                    Op::TwoPhase => {
                        let prepared = cp.prepare_checkpoint(None).await;
                        prop_assert_eq!(prepared.is_ok(), delivered > 0);
                        if let Ok(p) = prepared {
                            prop_assert!(cp.commit(p).await.is_ok());
                            stored = delivered;
                        }
                    }
                }
                let expected = if stored == 0 { Checkpoint::TrimHorizon } else { Checkpoint::Sequence(pos(stored)) };
                prop_assert_eq!(row(&store).await.checkpoint, expected);
            }
            Ok(())
        })?;
    }
}

#[tokio::test(start_paused = true)]
async fn a_restart_after_an_unanswered_shard_end_sees_the_shard_ended() {
    // The processor's `SHARD_END` applied but its answer was lost, and the processor
    // restarts: what it reads must be the row as the store has it, or it would read the
    // parent again after its children started (the simulation's lineage check, seed 183).
    // The mutation check runs this test with the mutation it catches (`Mutation::unit_test`).
    crate::mutation::set_from_env();
    let store = MemoryLeaseStore::new();
    let tenure = taken(&store, "a").await;
    let mut cp = Checkpointer::new(tenure.clone());
    cp.set_last_delivered(pos(9));
    cp.set_shard_end(vec![ShardId::new("child")]);
    store.faults().set_ambiguous_rate(1.0);
    assert!(cp.checkpoint().await.is_err(), "reported failed");
    store.faults().set_ambiguous_rate(0.0);
    assert_eq!(
        row(&store).await.checkpoint,
        Checkpoint::ShardEnd,
        "it did apply"
    );
    tenure
        .settle()
        .await
        .unwrap_or_else(|e| unreachable!("settled, not lost: {e:?}"));
    assert_eq!(tenure.snapshot().await.checkpoint, Checkpoint::ShardEnd);
    assert!(!tenure.is_lost());
}

#[tokio::test(start_paused = true)]
async fn settling_a_write_that_never_applied_fences_it_off() {
    let store = MemoryLeaseStore::new();
    let tenure = taken(&store, "a").await;
    let before = row(&store).await;
    let mut cp = Checkpointer::new(tenure.clone());
    cp.set_last_delivered(pos(4));
    store.faults().set_error_rate(1.0);
    assert!(cp.checkpoint().await.is_err(), "uncertain");
    store.faults().set_error_rate(0.0);
    tenure
        .settle()
        .await
        .unwrap_or_else(|e| unreachable!("{e:?}"));
    let settled = row(&store).await;
    assert_eq!(
        settled.counter,
        before.counter + 1,
        "a renewal from the counter held"
    );
    assert_eq!(settled.checkpoint, Checkpoint::TrimHorizon);
    // The lost write, landing late, is conditional on the old counter: refused.
    let update = CheckpointUpdate::new(Checkpoint::Sequence(pos(4)));
    assert!(store.checkpoint(&before, &update).await.is_err());
}

#[test]
fn a_parked_key_is_written_only_with_a_checkpoint_that_passes_its_record() {
    crate::mutation::set_from_env();
    let entries = vec![
        crate::failure::park_entry(7, &pos(10)),
        crate::failure::park_entry(9, &pos(20)),
    ];
    // A checkpoint short of the record at 20 (records before it still in flight) carries
    // only the entry of the record at 10: a crash then leaves key 9 unparked, and its record
    // is delivered again and fails again.
    let at_15 = Checkpoint::Sequence(pos(15));
    assert_eq!(passed_by(entries.clone(), &at_15), entries[..1].to_vec());
    assert_eq!(
        passed_by(entries.clone(), &Checkpoint::Sequence(pos(20))),
        entries
    );
    assert!(passed_by(entries.clone(), &Checkpoint::Sequence(pos(9))).is_empty());
    assert_eq!(passed_by(entries.clone(), &Checkpoint::ShardEnd), entries);
    assert!(passed_by(vec!["junk".to_owned()], &Checkpoint::ShardEnd).len() == 1);
    assert!(passed_by(vec!["junk".to_owned()], &at_15).is_empty());
}
