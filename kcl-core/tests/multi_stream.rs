//! One fleet over several streams on the in-memory backends, under paused time: every
//! stream's records reach its own processor type, leases are keyed as KCL Java keys them and
//! balanced as one pool, a stream added while running starts at its own initial position, and
//! a removed stream's leases are deleted after the grace period (their processors get
//! `lease_lost`), while one added back in time keeps its place.
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
    input: ProcessRecordsInput,
    cp: &mut Checkpointer,
) -> Result<(), BoxError> {
    for r in &input.records {
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
        input: ProcessRecordsInput,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        record("orders", &self.0, &self.1, &self.2, input, cp).await
    }
}

impl RecordProcessor for Clicks {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput,
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
    fleet
        .streams
        .add(id("orders"), InitialPosition::TrimHorizon);
    fleet
        .streams
        .add(id("clicks"), InitialPosition::TrimHorizon);
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
        .filter(|k| !kcl_core::coordination::is_coordination_key(&ShardId::new(k.as_str())))
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
    fleet
        .streams
        .add(id("clicks"), InitialPosition::TrimHorizon);
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
    let left = fleet.store.list().await.unwrap();
    assert!(left.iter().all(|l| !l.key.as_str().contains(":clicks:")));
    assert_eq!(
        *fleet.lost.lock().unwrap(),
        3,
        "each holder told lease_lost"
    );
    a.shutdown.shutdown();
    b.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
    b.task.await.unwrap().unwrap();
}
