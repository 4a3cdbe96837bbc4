//! Worker behaviour on the in-memory backends, under paused time: start-up, failover,
//! graceful handback, handoffs, processor failures and the shutdown deadline.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use kcl_core::singleton::is_coordination_key;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{
    Behaviour, Recorder, Seen, config, delivered_by, fill, held, start, wait_until, world,
};
use kcl_core::memory::MemoryLeaseStore;
use kcl_core::{LeaseStore, RecordProcessor, ShardId, Worker, WorkerConfig};
use tokio::time::{Instant, sleep};

#[tokio::test(start_paused = true)]
async fn first_record_arrives_in_the_first_cycle_on_a_fresh_table() {
    let (stream, store, seen) = world(4);
    fill(&stream, 100);
    let w = start(
        "a",
        WorkerConfig::default(),
        &stream,
        &store,
        &seen,
        &Behaviour::default(),
    );
    let first = wait_until(Duration::from_secs(30), || !seen.lock().unwrap().is_empty()).await;
    assert!(
        first.is_some_and(|t| t < Duration::from_secs(1)),
        "first record after {first:?}"
    );
    assert!(
        wait_until(Duration::from_secs(5), || seen.lock().unwrap().len() == 100)
            .await
            .is_some()
    );
    assert_eq!(held(&w), 4);
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_crashed_workers_leases_move_within_failover_plus_a_cycle() {
    let (stream, store, seen) = world(8);
    let b = Behaviour {
        every_batch: true,
        ..Behaviour::default()
    };
    let a = start("a", config(), &stream, &store, &seen, &b);
    let c = start("c", config(), &stream, &store, &seen, &b);
    assert!(
        wait_until(Duration::from_secs(10), || held(&a) == 4 && held(&c) == 4)
            .await
            .is_some()
    );
    fill(&stream, 200);
    sleep(Duration::from_secs(2)).await;
    a.task.abort(); // dropped without releasing anything
    let moved = wait_until(Duration::from_secs(30), || held(&c) == 8).await;
    let bound = config().failover_time + config().taker_interval * 2;
    assert!(
        moved.is_some_and(|t| t <= bound),
        "took {moved:?}, bound {bound:?}"
    );
    fill(&stream, 200);
    assert!(
        wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 400)
            .await
            .is_some(),
        "none lost"
    );
    c.shutdown.shutdown();
    c.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_hands_leases_back_at_once_without_repeats() {
    let (stream, store, seen) = world(6);
    let b = Behaviour::default(); // checkpoints only in shutdown_requested
    let a = start("a", config(), &stream, &store, &seen, &b);
    let c = start("c", config(), &stream, &store, &seen, &b);
    assert!(
        wait_until(Duration::from_secs(10), || held(&a) == 3 && held(&c) == 3)
            .await
            .is_some()
    );
    fill(&stream, 300);
    assert!(
        wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 300)
            .await
            .is_some()
    );
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
    let leases = store.leases();
    assert!(
        leases
            .iter()
            .all(|l| l.owner.as_ref().is_none_or(|o| o.as_str() == "c")),
        "a released all"
    );
    // Under a leader (the default) `a` may have led: `c` then takes the leader row at its
    // next poll of it (every taker interval while it stands by) and the leases in its first
    // cycle as leader.
    let moved = wait_until(Duration::from_secs(10), || held(&c) == 6).await;
    assert!(
        moved.is_some_and(|t| t <= config().taker_interval * 2),
        "took {moved:?}"
    );
    fill(&stream, 100);
    assert!(
        wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 400)
            .await
            .is_some()
    );
    let repeats = delivered_by(&seen).values().filter(|w| w.len() > 1).count();
    assert_eq!(
        repeats, 0,
        "a checkpointed in shutdown_requested: c repeats nothing"
    );
    c.shutdown.shutdown();
    c.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn rebalancing_is_a_handoff_that_repeats_nothing() {
    let (stream, store, seen) = world(8);
    let b = Behaviour::default(); // checkpoints only when asked to stop
    let a = start("a", config(), &stream, &store, &seen, &b);
    assert!(
        wait_until(Duration::from_secs(5), || held(&a) == 8)
            .await
            .is_some()
    );
    fill(&stream, 400);
    assert!(
        wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 400)
            .await
            .is_some()
    );
    let c = start(
        "c",
        config().max_leases_to_steal(4),
        &stream,
        &store,
        &seen,
        &b,
    );
    let balanced = wait_until(Duration::from_secs(20), || held(&a) == 4 && held(&c) == 4).await;
    assert!(
        balanced.is_some_and(|t| t < config().failover_time),
        "balanced after {balanced:?}: no expiry wait"
    );
    fill(&stream, 400);
    assert!(
        wait_until(Duration::from_secs(10), || delivered_by(&seen).len() == 800)
            .await
            .is_some()
    );
    let repeats = delivered_by(&seen).values().filter(|w| w.len() > 1).count();
    assert_eq!(repeats, 0);
    for w in [a, c] {
        w.shutdown.shutdown();
        w.task.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_processor_restarts_its_shard_not_the_worker() {
    let (stream, store, seen) = world(3);
    let b = Behaviour {
        every_batch: true,
        panic_once_on: stream.shard_for("key-0"),
        ..Behaviour::default()
    };
    fill(&stream, 150);
    let a = start("a", config(), &stream, &store, &seen, &b);
    assert!(
        wait_until(Duration::from_secs(30), || delivered_by(&seen).len() == 150)
            .await
            .is_some()
    );
    assert!(b.panicked.load(Ordering::SeqCst));
    assert_eq!(held(&a), 3, "the lease stayed held through the restart");
    assert!(!a.task.is_finished());
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_shutdown_deadline_stops_a_processor_that_hangs() {
    let (stream, store, seen) = world(2);
    let b = Behaviour {
        hang_on_shutdown: true,
        ..Behaviour::default()
    };
    let a = start(
        "a",
        config().shutdown_timeout(Duration::from_secs(3)),
        &stream,
        &store,
        &seen,
        &b,
    );
    assert!(
        wait_until(Duration::from_secs(5), || held(&a) == 2)
            .await
            .is_some()
    );
    let asked = Instant::now();
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(4),
        "{took:?}"
    );
    // No shard lease was released: they will expire for others. (The coordination rows
    // were given back.)
    assert!(
        store
            .list()
            .await
            .unwrap()
            .iter()
            .filter(|l| !is_coordination_key(&l.key))
            .all(|l| l.owner.is_some())
    );
}

#[tokio::test(start_paused = true)]
async fn a_fenced_worker_stops_the_shard_and_its_checkpoints_fail() {
    let (stream, store, seen) = world(1);
    let b = Behaviour {
        every_batch: true,
        ..Behaviour::default()
    };
    let a = start("a", config(), &stream, &store, &seen, &b);
    assert!(
        wait_until(Duration::from_secs(5), || held(&a) == 1)
            .await
            .is_some()
    );
    // Another worker takes the lease behind a's back (as after an expiry it missed).
    let row = store
        .list()
        .await
        .unwrap()
        .into_iter()
        .find(|l| !is_coordination_key(&l.key))
        .unwrap();
    store
        .client("intruder")
        .take(&row, &"intruder".into())
        .await
        .unwrap();
    fill(&stream, 10);
    let stopped = wait_until(Duration::from_secs(10), || held(&a) == 0).await;
    assert!(
        stopped.is_some(),
        "a stops the shard once a write of it fails"
    );
    let journal = store.journal();
    let after_take = journal.iter().skip_while(|e| e.client != "intruder");
    // (Its leader row, which the lease carried, names another carrier or itself: a write of
    // a coordination row.)
    assert!(
        after_take
            .filter(|e| e.client == "a" && !is_coordination_key(&e.lease.key))
            .all(|e| e.operation == "take" || e.operation == "request_handoff")
    );
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
}

/// A source whose stream does not exist.
struct Missing;

impl kcl_core::ShardSource for Missing {
    async fn list_shards(&self) -> Result<Vec<kcl_core::Shard>, kcl_core::BackendError> {
        Err(kcl_core::BackendError::new(
            kcl_core::ErrorKind::Fatal,
            "list_shards",
            "stream orders-typo not found",
        ))
    }
    async fn shard_iterator(
        &self,
        _: &ShardId,
        _: &kcl_core::StartingPosition,
    ) -> Result<kcl_core::ShardIterator, kcl_core::BackendError> {
        unreachable!("no shard was listed")
    }
    async fn get_records(
        &self,
        _: &kcl_core::ShardIterator,
        _: u32,
    ) -> Result<kcl_core::RecordBatch, kcl_core::BackendError> {
        unreachable!("no shard was listed")
    }
}

#[tokio::test(start_paused = true)]
async fn a_missing_stream_at_start_up_is_a_clear_error_not_a_retry_loop() {
    let w = Worker::new(
        "a",
        config(),
        Missing,
        MemoryLeaseStore::new(),
        |shard: &ShardId| Recorder {
            worker: "a".into(),
            shard: shard.clone(),
            seen: Seen::default(),
            behaviour: Behaviour::default(),
        },
    )
    .unwrap();
    let error = w.run().await.expect_err("fails");
    assert!(matches!(error, kcl_core::Error::Source(_)));
    let chain = format!("{:?}", std::error::Error::source(&error));
    assert!(chain.contains("orders-typo"), "{chain}");
}

/// A singleton on the worker's token (`ShutdownHandle::token`) stops when the worker stops,
/// here because it fails before its first cycle (a source without enhanced fan-out asked
/// for it): its row is handed back, not left to expire while the process stays on as a
/// candidate.
#[tokio::test(start_paused = true)]
async fn a_singleton_on_the_workers_token_stops_when_the_worker_fails() {
    let store = MemoryLeaseStore::new();
    let fan_out = kcl_core::Retrieval::FanOut {
        consumer_name: "app".into(),
    };
    let w = Worker::new(
        "a",
        config().retrieval(fan_out),
        Missing,
        store.client("a"),
        |shard: &ShardId| Recorder {
            worker: "a".into(),
            shard: shard.clone(),
            seen: Seen::default(),
            behaviour: Behaviour::default(),
        },
    )
    .unwrap();
    let token = w.shutdown_handle().token();
    let singleton = kcl_core::singleton::Singleton::new(
        "summary",
        "a",
        store.client("a"),
        kcl_core::singleton::SingletonConfig::default(),
    )
    .unwrap();
    let holder = singleton.holder();
    let job = tokio::spawn(async move {
        singleton
            .run(token, |lost| async move { lost.cancelled().await })
            .await
    });
    let held = wait_until(Duration::from_secs(5), || holder.borrow().is_some()).await;
    assert!(held.is_some(), "the singleton runs first");
    // The worker's store call has a moment to fail: the singleton holds its row meanwhile.
    assert!(w.run().await.is_err());
    let stopped = tokio::time::timeout(Duration::from_secs(5), job).await;
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
    let row = store
        .get(&ShardId::new("kcl-coordination/summary"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.owner, None, "the row is handed back");
}

#[tokio::test(start_paused = true)]
async fn a_lease_handed_over_just_before_shutdown_is_released_not_left_to_expire() {
    let (stream, store, seen) = world(2);
    let b = start(
        "b",
        config().max_leases(1),
        &stream,
        &store,
        &seen,
        &Behaviour::default(),
    );
    assert!(
        wait_until(Duration::from_secs(5), || held(&b) == 1)
            .await
            .is_some()
    );
    // A handoff to b lands between two of b's cycles: b owns the lease but does not hold it.
    let free = store
        .list()
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.owner.is_none())
        .unwrap();
    store.take(&free, &"b".into()).await.unwrap();
    b.shutdown.shutdown();
    b.task.await.unwrap().unwrap();
    assert!(
        store.leases().iter().all(|l| l.owner.is_none()),
        "{:?}",
        store.leases()
    );
}

#[tokio::test(start_paused = true)]
async fn a_processor_can_be_unit_tested_with_a_harness() {
    let (stream, store, seen) = world(1);
    fill(&stream, 5);
    let shard = ShardId::new("shardId-000000000000");
    let records = stream.records(&shard);
    let mut harness = kcl_core::memory::ProcessorHarness::new(&store, shard.clone())
        .await
        .unwrap();
    let mut processor = Recorder {
        worker: "unit".into(),
        shard: shard.clone(),
        seen: seen.clone(),
        behaviour: Behaviour {
            every_batch: true,
            ..Behaviour::default()
        },
    };
    harness.initialize(&mut processor).await.unwrap();
    harness
        .process(&mut processor, records[..3].to_vec())
        .await
        .unwrap();
    assert_eq!(
        harness.checkpoint().await.unwrap(),
        kcl_core::Checkpoint::Sequence(records[2].position())
    );
    harness
        .process(&mut processor, records[3..].to_vec())
        .await
        .unwrap();
    assert_eq!(
        harness.checkpoint().await.unwrap(),
        kcl_core::Checkpoint::Sequence(records[4].position())
    );
    assert_eq!(seen.lock().unwrap().len(), 5);
    // The worker never delivers an empty batch; neither does the harness.
    assert!(harness.process(&mut processor, Vec::new()).await.is_err());
}

/// A checkpoint beyond what was delivered is refused, in a harness as in a worker.
#[tokio::test(start_paused = true)]
async fn a_harness_refuses_a_checkpoint_beyond_what_it_delivered() {
    struct Ahead(kcl_core::ExtendedSequenceNumber);
    impl RecordProcessor for Ahead {
        async fn process_records(
            &mut self,
            _: kcl_core::ProcessRecordsInput<'_>,
            cp: &mut kcl_core::Checkpointer,
        ) -> Result<(), kcl_core::BoxError> {
            cp.checkpoint_at(self.0.clone()).await?;
            Ok(())
        }
    }
    let (stream, store, _) = world(1);
    fill(&stream, 5);
    let shard = ShardId::new("shardId-000000000000");
    let records = stream.records(&shard);
    let mut harness = kcl_core::memory::ProcessorHarness::new(&store, shard)
        .await
        .unwrap();
    let mut processor = Ahead(records[4].position());
    let refused = harness.process(&mut processor, records[..2].to_vec()).await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(
        harness.checkpoint().await.unwrap(),
        kcl_core::Checkpoint::TrimHorizon
    );
}

/// Everything a worker calls can be driven from a harness: a quiet shard's empty batch, the
/// shard's end and the loss of its lease.
#[tokio::test(start_paused = true)]
async fn a_harness_drives_quiet_batches_shard_end_and_lease_loss() {
    /// Checkpoints only when a batch comes empty (on time, not on count), and notes a loss.
    #[derive(Default)]
    struct OnQuiet {
        lost: bool,
        end_without_checkpoint: bool,
    }
    impl RecordProcessor for OnQuiet {
        async fn process_records(
            &mut self,
            input: kcl_core::ProcessRecordsInput<'_>,
            cp: &mut kcl_core::Checkpointer,
        ) -> Result<(), kcl_core::BoxError> {
            if input.records().is_empty() {
                cp.checkpoint().await?;
            }
            Ok(())
        }
        async fn lease_lost(&mut self) {
            self.lost = true;
        }
        async fn shard_ended(
            &mut self,
            cp: &mut kcl_core::Checkpointer,
        ) -> Result<(), kcl_core::BoxError> {
            if !self.end_without_checkpoint {
                cp.checkpoint().await?;
            }
            Ok(())
        }
    }
    let (stream, store, _) = world(3);
    fill(&stream, 9);
    let shards = stream.open_shards();
    let at =
        async |harness: &kcl_core::memory::ProcessorHarness| harness.checkpoint().await.unwrap();

    // A quiet batch checkpoints what came before it.
    let records = stream.records(&shards[0]);
    let mut harness = kcl_core::memory::ProcessorHarness::new(&store, shards[0].clone())
        .await
        .unwrap();
    let mut processor = OnQuiet::default();
    harness
        .process(&mut processor, records.clone())
        .await
        .unwrap();
    assert_eq!(at(&harness).await, kcl_core::Checkpoint::TrimHorizon);
    harness.process_empty(&mut processor).await.unwrap();
    let last = records.last().unwrap().position();
    assert_eq!(at(&harness).await, kcl_core::Checkpoint::Sequence(last));

    // The shard's end: the processor checkpoints SHARD_END, or the harness says it did not.
    let children = vec![ShardId::new("shardId-000000000009")];
    harness
        .shard_ended(&mut processor, children.clone())
        .await
        .unwrap();
    assert_eq!(at(&harness).await, kcl_core::Checkpoint::ShardEnd);
    let mut forgetful = OnQuiet {
        end_without_checkpoint: true,
        ..OnQuiet::default()
    };
    let mut other = kcl_core::memory::ProcessorHarness::new(&store, shards[1].clone())
        .await
        .unwrap();
    let refused = other.shard_ended(&mut forgetful, children).await;
    assert!(refused.is_err(), "{refused:?}");

    // A lost lease: the processor hears of it, and checkpoints fail from then on.
    let mut harness = kcl_core::memory::ProcessorHarness::new(&store, shards[2].clone())
        .await
        .unwrap();
    let records = stream.records(&shards[2]);
    harness.process(&mut processor, records).await.unwrap();
    harness.lease_lost(&mut processor).await;
    assert!(processor.lost);
    let failed = harness.process_empty(&mut processor).await;
    assert!(
        failed.is_err(),
        "a checkpoint after the loss fails: {failed:?}"
    );
    assert_eq!(at(&harness).await, kcl_core::Checkpoint::TrimHorizon);
}

/// A worker holding many shards keeps at most `max_concurrent_reads` reads in flight (and so
/// as many connections and in-flight responses), and still reads every shard.
#[tokio::test(start_paused = true)]
async fn reads_in_flight_stay_within_max_concurrent_reads() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use kcl_core::memory::{IdleProcessor, MemoryStream};
    use kcl_core::{
        BackendError, RecordBatch, Shard, ShardIterator, ShardSource, StartingPosition,
    };

    /// Counts the reads in flight, each taking 50 ms.
    struct Counting {
        inner: MemoryStream,
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
    }
    impl Counting {
        async fn counted<T>(&self, call: impl Future<Output = T>) -> T {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
            sleep(Duration::from_millis(50)).await;
            let out = call.await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            out
        }
    }
    impl ShardSource for Counting {
        async fn list_shards(&self) -> Result<Vec<Shard>, BackendError> {
            self.inner.list_shards().await
        }
        async fn shard_iterator(
            &self,
            shard: &ShardId,
            position: &StartingPosition,
        ) -> Result<ShardIterator, BackendError> {
            self.counted(self.inner.shard_iterator(shard, position))
                .await
        }
        async fn get_records(
            &self,
            iterator: &ShardIterator,
            limit: u32,
        ) -> Result<RecordBatch, BackendError> {
            self.counted(self.inner.get_records(iterator, limit)).await
        }
    }

    let (stream, store, _) = world(40);
    fill(&stream, 400);
    let most = Arc::new(AtomicUsize::new(0));
    let source = Counting {
        inner: stream.clone(),
        now: Arc::new(AtomicUsize::new(0)),
        most: most.clone(),
    };
    let worker = Worker::builder(source, store.clone())
        .id("a")
        .config(config().max_concurrent_reads(4))
        .build(|_| IdleProcessor)
        .unwrap();
    let status = worker.status();
    let stop = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    assert!(
        wait_until(Duration::from_secs(30), || status.borrow().held.len() == 40)
            .await
            .is_some()
    );
    sleep(Duration::from_secs(5)).await;
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 4, "{most} reads in flight at once, bound 4");
    assert_eq!(most, 4, "40 shards keep the 4 permits busy");
    stop.shutdown();
    task.await.unwrap().unwrap();
}

/// Leases taken in one cycle are not renewed in one burst: their first renewals spread over
/// the second half of the renewal interval (each lease keeps its own phase afterwards), so a
/// worker holding many leases never has as many renewal writes, and connections, at once.
#[tokio::test(start_paused = true)]
async fn renewals_of_leases_taken_together_are_spread_out() {
    use std::collections::BTreeSet;

    let (stream, store, seen) = world(40);
    let w = start("a", config(), &stream, &store, &seen, &Behaviour::default());
    assert!(
        wait_until(Duration::from_secs(30), || held(&w) == 40)
            .await
            .is_some()
    );
    sleep(config().renew_interval * 3).await;
    let renewals: Vec<Instant> = store
        .journal()
        .iter()
        .filter(|e| e.operation == "renew")
        .map(|e| e.started)
        .collect();
    let instants: BTreeSet<Instant> = renewals.iter().copied().collect();
    assert!(renewals.len() >= 40, "{} renewals", renewals.len());
    assert!(
        instants.len() >= 20,
        "{} renewals of 40 leases at only {} distinct instants",
        renewals.len(),
        instants.len()
    );
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn children_of_a_shard_a_follower_ends_start_within_cycles_not_a_sync_interval() {
    let (stream, store, seen) = world(2);
    let b = Behaviour::default();
    let a = start("a", config(), &stream, &store, &seen, &b);
    let c = start("c", config(), &stream, &store, &seen, &b);
    assert!(
        wait_until(Duration::from_secs(10), || held(&a) == 1 && held(&c) == 1)
            .await
            .is_some()
    );
    let leader = store
        .leases()
        .into_iter()
        .find(|l| l.key.as_str() == "kcl-coordination/worker-leader")
        .and_then(|l| l.owner)
        .expect("a leader");
    let follower = if leader.as_str() == "a" { &c } else { &a };
    let parent = follower.status.borrow().held[0].clone();
    // The leader synced at start; its next periodic sync is a shard_sync_interval away.
    stream.split(&parent).unwrap();
    let written = fill(&stream, 100);
    let all = wait_until(Duration::from_secs(120), || {
        common::undelivered(&seen, &written) == 0
    })
    .await;
    let bound = config().taker_interval * 10;
    assert!(
        all.is_some_and(|t| t <= bound),
        "children's records after {all:?}, bound {bound:?} (shard_sync_interval {:?})",
        config().shard_sync_interval
    );
    for w in [a, c] {
        w.shutdown.shutdown();
        w.task.await.unwrap().unwrap();
    }
}

/// A `MakeWriter` into a shared buffer, to read what a test logged.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Logs {
    fn contains(&self, text: &str) -> bool {
        String::from_utf8_lossy(&self.0.lock().unwrap()).contains(text)
    }
}

/// Two processes given one worker id (stop 48's adversarial run): each writes the other's
/// leases as its own, and they take them from each other all the time. Nothing is lost, but
/// every loss read as an ordinary one; now the worker says another process runs as it.
#[tokio::test(start_paused = true)]
async fn two_workers_under_one_id_are_told_apart_in_the_log() {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let (stream, store, seen) = world(4);
    let b = Behaviour {
        every_batch: true,
        ..Behaviour::default()
    };
    let one = start("twin", config(), &stream, &store, &seen, &b);
    assert!(
        wait_until(Duration::from_secs(10), || held(&one) == 4)
            .await
            .is_some()
    );
    let two = start("twin", config(), &stream, &store, &seen, &b);
    fill(&stream, 200);
    let told = wait_until(Duration::from_secs(60), || {
        logs.contains("another process runs as this worker")
    })
    .await;
    assert!(told.is_some(), "no warning in 60 s");
    assert!(
        wait_until(Duration::from_secs(60), || delivered_by(&seen).len() == 200)
            .await
            .is_some(),
        "none lost"
    );
    for w in [one, two] {
        w.shutdown.shutdown();
        let _ = w.task.await;
    }
}
