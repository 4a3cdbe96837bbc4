//! One fleet over several streams on the in-memory backends, under paused time: every
//! stream's records reach its own processor type, leases are keyed as KCL Java keys them and
//! balanced as one pool, a stream added while running starts at its own initial position, and
//! a removed stream's leases are deleted after the grace period (their processors get
//! `lease_lost`), while one added back in time keeps its place; one left out across a restart
//! goes after the grace too.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{config, fill, wait_until};
use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::multi_stream::{MultiStreamSource, StreamFactories, StreamId, Streams};
use kcl_core::{
    BoxError, Checkpointer, InitialPosition, LeaseStore, ProcessRecordsInput, RecordProcessor,
    ShardId, ShutdownHandle, Status, Worker,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::sleep;

/// Deliveries: (processor kind, stream name, shard, payload).
type Log = Arc<Mutex<Vec<(&'static str, String, String, String)>>>;

/// Two processor types, to show each stream gets its own.
struct Orders(String, ShardId, Log);
struct Clicks(String, ShardId, Log, Arc<Mutex<usize>>);

async fn record(
    kind: &'static str,
    stream: &str,
    shard: &ShardId,
    log: &Log,
    input: ProcessRecordsInput<'_>,
    cp: &mut Checkpointer,
) -> Result<(), BoxError> {
    for r in input.records() {
        let data = String::from_utf8_lossy(&r.data).into_owned();
        log.lock()
            .unwrap()
            .push((kind, stream.to_owned(), shard.to_string(), data));
    }
    cp.checkpoint().await?;
    Ok(())
}

impl RecordProcessor for Orders {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        record("orders", &self.0, &self.1, &self.2, input, cp).await
    }
}

impl RecordProcessor for Clicks {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        record("clicks", &self.0, &self.1, &self.2, input, cp).await
    }

    async fn lease_lost(&mut self) {
        *self.3.lock().unwrap() += 1;
    }
}

struct Fleet {
    streams: Streams,
    by_id: BTreeMap<StreamId, MemoryStream>,
    store: MemoryLeaseStore,
    log: Log,
    lost: Arc<Mutex<usize>>,
}

struct Running {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    shutdown: ShutdownHandle,
    status: watch::Receiver<Status>,
}

fn id(name: &str) -> StreamId {
    StreamId::new("123456789012", name, 1_700_000_000)
}

impl Fleet {
    fn new(streams: &[(&str, u32)]) -> Self {
        let by_id = streams
            .iter()
            .map(|(name, shards)| (id(name), MemoryStream::new(*shards)))
            .collect();
        Self {
            streams: Streams::default(),
            by_id,
            store: MemoryLeaseStore::new(),
            log: Log::default(),
            lost: Arc::default(),
        }
    }

    fn start(&self, worker: &str) -> Running {
        let by_id = self.by_id.clone();
        let source = MultiStreamSource::new(self.streams.clone(), move |s: &StreamId| {
            by_id.get(s).cloned().expect("a stream of the test")
        })
        .removal_grace(Duration::from_secs(10));
        let (log, log2, lost) = (self.log.clone(), self.log.clone(), self.lost.clone());
        let factories = StreamFactories::new()
            .stream(id("orders"), move |shard: &ShardId| {
                Orders("orders".into(), shard.clone(), log.clone())
            })
            .otherwise(move |stream: &StreamId, shard: &ShardId| {
                Clicks(
                    stream.name.clone(),
                    shard.clone(),
                    log2.clone(),
                    lost.clone(),
                )
            });
        let w = Worker::builder(source, self.store.client(worker))
            .id(worker)
            .config(config().shard_sync_interval(Duration::from_secs(1)))
            .build_with(factories)
            .unwrap();
        Running {
            shutdown: w.shutdown_handle(),
            status: w.status(),
            task: tokio::spawn(w.run()),
        }
    }

    /// Tracks `stream` from its oldest record.
    fn track(&self, stream: &str) {
        self.streams.add(id(stream), InitialPosition::TrimHorizon);
    }

    fn delivered(&self, stream: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s, _, _)| s == stream)
            .map(|(_, _, _, d)| d.clone())
            .collect()
    }
}

/// Leases with a running shard task.
fn running(r: &Running) -> usize {
    r.status.borrow().held.len()
}

#[tokio::test(start_paused = true)]
async fn streams_share_one_pool_and_keep_their_own_processors() {
    let fleet = Fleet::new(&[("orders", 2), ("clicks", 3), ("views", 2)]);
    fleet.track("orders");
    fleet.track("clicks");
    let a = fleet.start("a");
    let b = fleet.start("b");
    fill(&fleet.by_id[&id("orders")], 40);
    fill(&fleet.by_id[&id("clicks")], 60);
    assert!(
        wait_until(Duration::from_secs(30), || {
            running(&a) + running(&b) == 5 && fleet.log.lock().unwrap().len() == 100
        })
        .await
        .is_some(),
        "every record of both streams delivered"
    );
    // One pool: 5 leases over 2 workers, whatever stream they belong to.
    assert!((2..=3).contains(&running(&a)) && (2..=3).contains(&running(&b)));
    for (kind, stream, _, _) in fleet.log.lock().unwrap().iter() {
        assert_eq!(
            *kind == "orders",
            stream == "orders",
            "{stream} went to {kind}"
        );
    }
    let keys: Vec<String> = fleet
        .store
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.key.to_string())
        .filter(|k| !kcl_core::singleton::is_coordination_key(&ShardId::new(k.as_str())))
        .collect();
    assert!(keys.contains(&"123456789012:clicks:1700000000:shardId-000000000002".to_owned()));
    assert_eq!(keys.len(), 5, "{keys:?}");

    // Added while running, at LATEST: what was written before is not wanted.
    fill(&fleet.by_id[&id("views")], 10);
    fleet.streams.add(id("views"), InitialPosition::Latest);
    assert!(
        wait_until(Duration::from_secs(10), || running(&a) + running(&b) == 7)
            .await
            .is_some()
    );
    sleep(Duration::from_secs(1)).await;
    fill(&fleet.by_id[&id("views")], 10);
    assert!(
        wait_until(Duration::from_secs(10), || fleet.delivered("views").len()
            == 10)
        .await
        .is_some()
    );
    sleep(Duration::from_secs(2)).await;
    assert_eq!(
        fleet.delivered("views").len(),
        10,
        "nothing from before it was added"
    );

    // Removed and added back within the grace period: nothing happens to its leases.
    fleet.streams.remove(&id("clicks"));
    sleep(Duration::from_secs(3)).await;
    fleet.track("clicks");
    sleep(Duration::from_secs(15)).await;
    assert_eq!(running(&a) + running(&b), 7);
    assert_eq!(*fleet.lost.lock().unwrap(), 0);

    // Removed for good: after the grace period its 3 leases go and their holders stop.
    fleet.streams.remove(&id("clicks"));
    assert!(
        wait_until(Duration::from_secs(40), || running(&a) + running(&b) == 4)
            .await
            .is_some(),
        "the removed stream's leases are let go"
    );
    clicks_let_go(&fleet).await;
    a.shutdown.shutdown();
    b.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
    b.task.await.unwrap().unwrap();
}

/// No lease of clicks (3 shards) left, and each of its holders told `lease_lost`.
async fn clicks_let_go(fleet: &Fleet) {
    let left = fleet.store.list().await.unwrap();
    assert!(left.iter().all(|l| !l.key.as_str().contains(":clicks:")));
    assert_eq!(
        *fleet.lost.lock().unwrap(),
        3,
        "each holder told lease_lost"
    );
}

/// A fleet restarted with a stream left out of its configuration: that stream's leases are in
/// the table, but no tracker of the new processes ever named it. They are read on for the
/// grace period (the stream may be back in the next deploy), then deleted.
#[tokio::test(start_paused = true)]
async fn a_stream_left_out_across_a_restart_is_let_go_after_the_grace() {
    let fleet = Fleet::new(&[("orders", 2), ("clicks", 3)]);
    fleet.track("orders");
    fleet.track("clicks");
    let a = fleet.start("a");
    fill(&fleet.by_id[&id("clicks")], 30);
    assert!(
        wait_until(Duration::from_secs(30), || running(&a) == 5
            && fleet.delivered("clicks").len() == 30)
        .await
        .is_some()
    );
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();

    // The next deploy tracks orders only.
    fleet.streams.remove(&id("clicks"));
    let b = fleet.start("b");
    assert!(
        wait_until(Duration::from_secs(5), || running(&b) == 5)
            .await
            .is_some(),
        "the left-out stream's leases are still taken"
    );
    fill(&fleet.by_id[&id("clicks")], 10);
    assert!(
        wait_until(Duration::from_secs(5), || fleet.delivered("clicks").len()
            == 40)
        .await
        .is_some(),
        "and read within the grace period"
    );
    assert!(
        wait_until(Duration::from_secs(30), || running(&b) == 2)
            .await
            .is_some(),
        "then let go"
    );
    clicks_let_go(&fleet).await;
    b.shutdown.shutdown();
    b.task.await.unwrap().unwrap();
}

/// Only the streams in the table at this source's first look are taken for former streams: a
/// stream that shows up later was added by a worker with a newer tracker (a deploy under
/// way), and is left alone however long it stays.
#[tokio::test(start_paused = true)]
async fn a_stream_added_by_a_newer_worker_is_not_taken_for_a_former_one() {
    use kcl_core::ShardSource as _;

    let fleet = Fleet::new(&[("orders", 1), ("clicks", 1), ("views", 1)]);
    fleet.track("orders");
    let by_id = fleet.by_id.clone();
    let source = MultiStreamSource::new(fleet.streams.clone(), move |s: &StreamId| {
        by_id.get(s).cloned().expect("a stream of the test")
    })
    .removal_grace(Duration::from_secs(10));
    let key = |name: &str| id(name).lease_key(&ShardId::new("shardId-000000000000"));
    assert!(!source.is_retired(&key("clicks")), "not listed yet");

    source.list_shards().await.unwrap();
    // The first pass over the table: clicks is there and not tracked.
    assert!(!source.is_retired(&key("orders")));
    assert!(!source.is_retired(&key("clicks")), "within the grace");
    source.list_shards().await.unwrap();
    // Later passes: views appeared in the table since.
    assert!(!source.is_retired(&key("views")));
    sleep(Duration::from_secs(11)).await;
    source.list_shards().await.unwrap();
    assert!(
        source.is_retired(&key("clicks")),
        "former stream, grace over"
    );
    assert!(!source.is_retired(&key("views")), "a newer worker's stream");
    assert!(!source.is_retired(&key("orders")));
}
