//! Every shard is processed or reported: rows kcl cannot read, shards without a lease,
//! leases no worker has room for, and reads retrying cannot fix each end up in
//! `Status::problems` while every other shard is processed. In-memory backends, paused time.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Behaviour, Running, config, fill, held, start, undelivered, wait_until, world};
use kcl_core::memory::MemoryStream;
use kcl_core::{LeaseStore, ProblemKind, ShardId, TableFeatures};

/// The keys of `kind`'s problems in `w`'s status, sorted.
fn reported(w: &Running, kind: ProblemKind) -> Vec<String> {
    let status = w.status.borrow();
    let keys = status.problems.iter().filter(|p| p.kind == kind);
    keys.map(|p| p.key.clone()).collect()
}

fn ids(shards: &[ShardId]) -> Vec<String> {
    shards.iter().map(ToString::to_string).collect()
}

#[tokio::test(start_paused = true)]
async fn rows_kcl_cannot_read_are_reported_left_alone_and_the_other_shards_processed() {
    let (stream, store, seen) = world(4);
    store.ensure_table(TableFeatures::NONE).await.unwrap();
    let shards = stream.open_shards();
    let bad = vec![shards[1].clone(), shards[3].clone()];
    store.insert_unreadable(
        bad[0].clone(),
        "attribute leaseCounter: expected N, found S",
    );
    store.insert_unreadable(bad[1].clone(), "attribute checkpoint missing");
    let written = fill(&stream, 200);
    let w = start("a", config(), &stream, &store, &seen, &Behaviour::default());
    let good: Vec<_> = written
        .iter()
        .zip(0..)
        .filter(|&(_, i)| {
            let shard = stream.shard_for(&format!("key-{}", i % 37)).unwrap();
            !bad.contains(&shard)
        })
        .map(|(s, _)| s.clone())
        .collect();
    let all = wait_until(Duration::from_secs(30), || {
        undelivered(&seen, &good) == 0
            && reported(&w, ProblemKind::Unleased) == ids(&bad)
            && reported(&w, ProblemKind::UnreadableRow) == ids(&bad)
    })
    .await;
    let status = w.status.borrow().clone();
    assert!(all.is_some(), "{status:?}");
    assert_eq!(held(&w), 2);
    let summary = status.problem.unwrap_or_default();
    assert!(summary.contains("4 shard or row problems"), "{summary}");
    assert!(
        bad.iter().all(|k| store.has_unreadable(k)),
        "rows left as they were"
    );
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_fleet_capped_below_the_shard_count_reports_the_shards_nobody_can_take() {
    capped_fleet_reports_unowned(kcl_core::Coordination::Leader).await;
}

#[tokio::test(start_paused = true)]
async fn a_fleet_coordinating_for_itself_capped_below_the_shard_count_reports_them_too() {
    capped_fleet_reports_unowned(kcl_core::Coordination::EveryWorker).await;
}

/// Two workers capped at 2 leases on 6 shards: 2 shards reported unowned, steadily, by the
/// leader (or, with every worker coordinating, by each full worker); a third worker takes them
/// and the report goes.
async fn capped_fleet_reports_unowned(mode: kcl_core::Coordination) {
    let (stream, store, seen) = world(6);
    let capped = || config().max_leases(2).coordination(mode);
    let a = start("a", capped(), &stream, &store, &seen, &Behaviour::default());
    let b = start("b", capped(), &stream, &store, &seen, &Behaviour::default());
    let unowned = |w: &Running| reported(w, ProblemKind::Unowned).len();
    // Under a leader, the leader reports them; coordinating for itself, each full worker.
    let reports = if mode == kcl_core::Coordination::Leader {
        2
    } else {
        4
    };
    let found = wait_until(Duration::from_secs(60), || {
        held(&a) == 2 && held(&b) == 2 && unowned(&a) + unowned(&b) == reports
    })
    .await;
    assert!(
        found.is_some(),
        "a {:?}, b {:?}",
        a.status.borrow(),
        b.status.borrow()
    );
    let bound = config().failover_time * 4;
    assert!(found.is_some_and(|t| t < bound), "after {found:?}");
    // Steady: neither reported twice, nor lost while nothing changes.
    sleep_cycles(20).await;
    let steady = (unowned(&a) + unowned(&b), held(&a), held(&b));
    assert_eq!(steady, (reports, 2, 2));
    // A third worker takes them, and the report goes.
    let c = start("c", capped(), &stream, &store, &seen, &Behaviour::default());
    let solved = wait_until(Duration::from_secs(120), || {
        held(&c) == 2 && unowned(&a) + unowned(&b) + unowned(&c) == 0
    })
    .await;
    assert!(solved.is_some(), "c {:?}", c.status.borrow());
    for w in [a, b, c] {
        w.shutdown.shutdown();
        w.task.await.unwrap().unwrap();
    }
}

async fn sleep_cycles(n: u32) {
    tokio::time::sleep(config().taker_interval * n).await;
}

#[tokio::test(start_paused = true)]
async fn a_read_retrying_cannot_fix_is_reported_and_the_other_shards_go_on() {
    let (stream, store, seen) = world(2);
    let shard = stream.open_shards().remove(0);
    let factory = {
        let seen = seen.clone();
        move |s: &ShardId| common::Recorder {
            worker: "a".into(),
            shard: s.clone(),
            seen: seen.clone(),
            behaviour: Behaviour::default(),
        }
    };
    let source = Denied {
        inner: stream.clone(),
        shard: shard.clone(),
    };
    let worker = kcl_core::Worker::new("a", config(), source, store.clone(), factory).unwrap();
    let w = Running {
        shutdown: worker.shutdown_handle(),
        status: worker.status(),
        task: tokio::spawn(worker.run()),
    };
    let written = fill(&stream, 100);
    let readable: Vec<_> = stream
        .records(&stream.open_shards()[1])
        .into_iter()
        .map(|r| r.sequence_number)
        .collect();
    assert!(readable.len() < written.len() && !readable.is_empty());
    let reported_and_read = wait_until(Duration::from_secs(60), || {
        undelivered(&seen, &readable) == 0
            && reported(&w, ProblemKind::ReadFailing) == ids(std::slice::from_ref(&shard))
    })
    .await;
    let status = w.status.borrow().clone();
    assert!(reported_and_read.is_some(), "{status:?}");
    let problem = &status.problems[0];
    assert!(problem.detail.contains("AccessDenied"), "{problem}");
    assert_eq!(
        status.held.len(),
        2,
        "the failing shard stays held: {status:?}"
    );
    assert!(!w.task.is_finished(), "the worker goes on");
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
    assert!(
        store.leases().iter().all(|l| l.owner.is_none()),
        "leases handed back: {:?}",
        store.leases()
    );
}

/// A stream whose reads of one shard fail in a way retrying cannot fix (access denied).
struct Denied {
    inner: MemoryStream,
    shard: kcl_core::ShardId,
}

impl kcl_core::ShardSource for Denied {
    async fn list_shards(&self) -> Result<Vec<kcl_core::Shard>, kcl_core::BackendError> {
        self.inner.list_shards().await
    }
    async fn shard_iterator(
        &self,
        shard: &kcl_core::ShardId,
        position: &kcl_core::StartingPosition,
    ) -> Result<kcl_core::ShardIterator, kcl_core::BackendError> {
        self.inner.shard_iterator(shard, position).await
    }
    async fn get_records(
        &self,
        iterator: &kcl_core::ShardIterator,
        limit: u32,
    ) -> Result<kcl_core::RecordBatch, kcl_core::BackendError> {
        if iterator.0.starts_with(self.shard.as_str()) {
            return Err(kcl_core::BackendError::new(
                kcl_core::ErrorKind::Fatal,
                "get_records",
                "AccessDeniedException: not authorized to read this stream's key",
            ));
        }
        self.inner.get_records(iterator, limit).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_processor_that_leaves_records_unchecked_is_reported_stalled() {
    let (stream, store, seen) = world(2);
    let quiet = Behaviour::default(); // checkpoints only when asked to stop
    let diligent = Behaviour {
        every_batch: true,
        ..Behaviour::default()
    };
    let stalled_after = Duration::from_secs(30);
    let config = || config().stalled_after(stalled_after);
    let a = start("a", config(), &stream, &store, &seen, &quiet);
    let b = start("b", config(), &stream, &store, &seen.clone(), &diligent);
    let spread = wait_until(Duration::from_secs(20), || held(&a) == 1 && held(&b) == 1).await;
    assert!(spread.is_some());
    let a_shard = a.status.borrow().held[0].to_string();
    fill(&stream, 100);
    tokio::time::sleep(stalled_after / 2).await;
    assert!(
        reported(&a, ProblemKind::Stalled).is_empty(),
        "not before stalled_after"
    );
    let found = wait_until(stalled_after, || {
        reported(&a, ProblemKind::Stalled) == [a_shard.clone()]
    })
    .await;
    assert!(found.is_some(), "{:?}", a.status.borrow());
    assert!(
        reported(&b, ProblemKind::Stalled).is_empty(),
        "{:?}",
        b.status.borrow()
    );
    for w in [a, b] {
        w.shutdown.shutdown();
        w.task.await.unwrap().unwrap();
    }
}

/// The whole fleet cut off from the table for two failover times: every worker loses its
/// leases and roles and fails to read the table (`store_reachable` false: `/readyz` fails).
/// Once the table is back, a worker that ends up a plain follower holding leases reads the
/// table only by asking which leases name it: those reads say the table is reachable again
/// (it stayed unreachable, and the worker unready, for as long as it held leases).
#[tokio::test(start_paused = true)]
async fn after_an_outage_every_worker_says_the_table_is_reachable_again() {
    let (stream, store, seen) = world(6);
    let b = Behaviour::default();
    let ids = ["a", "b", "c"];
    let workers: Vec<Running> = (ids.iter())
        .map(|id| start(id, config(), &stream, &store, &seen, &b))
        .collect();
    let settled = wait_until(Duration::from_secs(60), || {
        workers.iter().all(|w| held(w) == 2)
    })
    .await;
    assert!(settled.is_some(), "the fleet did not settle");
    for id in ids {
        store.faults().partition(id);
    }
    let cut = wait_until(Duration::from_secs(60), || {
        (workers.iter()).all(|w| held(w) == 0 && !w.status.borrow().store_reachable)
    })
    .await;
    assert!(cut.is_some(), "the outage was not seen");
    for id in ids {
        store.faults().heal(id);
    }
    let back = wait_until(Duration::from_secs(120), || {
        (workers.iter()).map(held).sum::<usize>() == 6 && workers.iter().all(|w| held(w) > 0)
    })
    .await;
    assert!(back.is_some(), "the fleet did not take its leases back");
    tokio::time::sleep(config().failover_time * 2).await;
    for (id, w) in ids.iter().zip(&workers) {
        let status = w.status.borrow().clone();
        assert!(status.store_reachable, "{id} still unreachable: {status:?}");
    }
    for w in workers {
        w.shutdown.shutdown();
        let _ = w.task.await;
    }
}
