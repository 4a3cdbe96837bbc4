//! Per-shard series are refreshed while the shard is held and no longer once it leaves, so an
//! exporter's idle timeout drops exactly the series of shards processed elsewhere.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Behaviour, config, fill, held, start, wait_until, world};
use kcl_core::LeaseStore;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};
use tokio::time::{Instant, sleep};

/// When each series was last updated.
type Touched = Arc<Mutex<BTreeMap<String, Instant>>>;

struct Series(String, Touched);

impl Series {
    fn touch(&self) {
        self.1
            .lock()
            .unwrap()
            .insert(self.0.clone(), Instant::now());
    }
}

impl CounterFn for Series {
    fn increment(&self, _: u64) {
        self.touch();
    }
    fn absolute(&self, _: u64) {
        self.touch();
    }
}

impl GaugeFn for Series {
    fn increment(&self, _: f64) {
        self.touch();
    }
    fn decrement(&self, _: f64) {
        self.touch();
    }
    fn set(&self, _: f64) {
        self.touch();
    }
}

/// Records when each series was last touched.
struct LastTouch(Touched);

impl LastTouch {
    fn series(&self, key: &Key) -> Arc<Series> {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        Arc::new(Series(
            format!("{}{{{}}}", key.name(), labels.join(",")),
            self.0.clone(),
        ))
    }
}

impl Recorder for LastTouch {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.series(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.series(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[tokio::test(start_paused = true)]
async fn a_shard_that_leaves_stops_refreshing_its_series_and_the_others_keep_theirs() {
    let touched = Touched::default();
    metrics::set_global_recorder(LastTouch(touched.clone())).unwrap();
    let (stream, store, seen) = world(2);
    let shards = stream.open_shards();
    let a = start("a", config(), &stream, &store, &seen, &Behaviour::default());
    assert!(
        wait_until(Duration::from_secs(5), || held(&a) == 2)
            .await
            .is_some()
    );
    fill(&stream, 40); // both shards get records: their gauges exist
    sleep(Duration::from_secs(2)).await;
    let last = |name: &str, shard: &kcl_core::ShardId| {
        touched
            .lock()
            .unwrap()
            .get(&format!("{name}{{shard={shard}}}"))
            .copied()
    };
    for shard in &shards {
        assert!(
            last("kcl_behind_latest_seconds", shard).is_some(),
            "{:?}",
            touched.lock()
        );
    }
    assert!(
        touched
            .lock()
            .unwrap()
            .contains_key("kcl_leases_lost_total{}"),
        "at zero from the start"
    );

    // Another worker takes the first shard behind a's back: a stops processing it.
    let row = store.get(&shards[0]).await.unwrap().unwrap();
    let intruder = store.client("intruder");
    let mut taken = intruder.take(&row, &"intruder".into()).await.unwrap();
    let renewing = tokio::spawn(async move {
        loop {
            sleep(Duration::from_secs(1)).await;
            taken = intruder.renew(&taken).await.unwrap();
        }
    });
    assert!(
        wait_until(Duration::from_secs(10), || held(&a) == 1)
            .await
            .is_some()
    );
    let left = Instant::now();
    sleep(Duration::from_secs(5)).await;
    for name in ["kcl_behind_latest_seconds", "kcl_records_processed_total"] {
        let gone = last(name, &shards[0]).unwrap();
        let kept = last(name, &shards[1]).unwrap();
        assert!(
            gone <= left,
            "{name} of the shard that left was refreshed after it left"
        );
        assert!(
            kept > left + Duration::from_secs(3),
            "{name} of the held shard went stale"
        );
    }
    renewing.abort();
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
}
