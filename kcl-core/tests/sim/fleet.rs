//! The simulated fleet: workers as whole processes (frozen together by a pause), each also a
//! candidate for one fleet-wide singleton task.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use kcl_core::memory::{Faults, MemoryLeaseStore, MemoryNetwork, MemoryStream};
use kcl_core::multi_stream::{MultiStreamSource, StreamFactories, StreamId, Streams};
use kcl_core::singleton::{Messenger, Singleton, SingletonConfig, SingletonHandle, TaskContext};
use kcl_core::{
    Liveness, ProcessorFactory, Shard, ShardId, ShardSource, ShutdownHandle, Status, Worker,
    WorkerConfig,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::poison::Poison;
use super::processor::{Factory, Log};
use kcl_core::failure::DeadLetters;

pub struct Member {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    singleton: JoinHandle<Result<(), kcl_core::Error>>,
    singleton_stop: CancellationToken,
    periodic: JoinHandle<Result<(), kcl_core::Error>>,
    periodic_stop: CancellationToken,
    shutdown: ShutdownHandle,
    pub status: watch::Receiver<Status>,
}

pub struct Fleet {
    pub seed: u64,
    pub config: WorkerConfig,
    pub stream: MemoryStream,
    pub store: MemoryLeaseStore,
    pub faults: Faults,
    pub log: Log,
    pub instances: Arc<AtomicU64>,
    pub live: BTreeMap<String, Member>,
    pub next_id: usize,
    pub failure_rate: f64,
    /// Every other worker renews per lease, whatever `config` says (a mixed fleet).
    pub mixed: bool,
    /// How the lease table keys the stream's shards.
    pub keys: Keys,
    /// Singletons run in health mode, and some of their runs hang (stop heartbeating).
    pub health: bool,
    /// How many candidates stand in line behind the singletons' holders (0: all poll fast).
    pub standbys: u8,
    /// The singletons' messages travel here; every acceptance goes to the log.
    pub network: MemoryNetwork,
    /// Records in flight per shard under `Parallel`; `None`: the plain processor.
    pub parallel: Option<usize>,
    /// The seed's failing records and policy, if it has them.
    pub poison: Option<Arc<Poison>>,
    /// Whether processors commit outputs with their checkpoints, and how the store takes
    /// them (`sim/outputs.rs`).
    pub outputs: Option<super::outputs::Transactional>,
    /// The sink that keeps each shard's position, where the outputs go in a share of those
    /// seeds (`sim/positions.rs`): one handle per worker, sharing the store's faults.
    pub sink: Option<kcl_core::memory::MemoryPositionSink>,
}

/// Sends a message to the fleet's singleton every few hundred milliseconds until `stop`,
/// logging how each send ended.
pub async fn send_messages(
    network: MemoryNetwork,
    store: MemoryLeaseStore,
    faults: Faults,
    log: super::processor::Log,
    seed: u64,
    stop: CancellationToken,
) {
    let messenger: Arc<dyn Messenger> = Arc::new(network.messenger("sender", faults));
    let handle = SingletonHandle::new(
        "sim",
        store.client("sender"),
        messenger,
        Duration::from_millis(250),
    );
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5e4d);
    let mut n = 0u64;
    while !stop.is_cancelled() {
        sleep(Duration::from_millis(rng.random_range(200..1_000))).await;
        let message = format!("msg-{n}");
        n += 1;
        let result = handle
            .send(bytes::Bytes::from(message.clone()), Duration::from_secs(5))
            .await;
        log.lock().sends.push(super::processor::Send {
            message,
            failed: result.err().map(|e| e.maybe_delivered),
        });
    }
}

/// The period of the fleet's periodic job.
pub const PERIOD: Duration = Duration::from_secs(2);

/// How shards are keyed in the lease table: by their id, or, when the workers read through a
/// [`MultiStreamSource`], as KCL Java's multi-stream leases (`account:stream:epoch:shardId`).
/// The checks speak lease keys; the stream, shard ids.
#[derive(Debug, Clone, Default)]
pub struct Keys(pub Option<StreamId>);

impl Keys {
    /// The lease key of a shard.
    pub fn of(&self, shard: &ShardId) -> ShardId {
        self.0
            .as_ref()
            .map_or_else(|| shard.clone(), |s| s.lease_key(shard))
    }

    /// The shard of a lease key.
    pub fn shard_of(&self, key: &ShardId) -> ShardId {
        match &self.0 {
            Some(_) => StreamId::split_key(key).map_or_else(|| key.clone(), |(_, s)| s),
            None => key.clone(),
        }
    }

    /// A map by shard as a map by lease key.
    pub fn keyed<V>(&self, by_shard: BTreeMap<ShardId, V>) -> BTreeMap<ShardId, V> {
        by_shard
            .into_iter()
            .map(|(s, v)| (self.of(&s), v))
            .collect()
    }

    /// A shard as the lease table knows it.
    pub fn shard(&self, shard: &Shard) -> Shard {
        Shard {
            id: self.of(&shard.id),
            parent_shard_ids: shard.parent_shard_ids.iter().map(|p| self.of(p)).collect(),
            hash_key_range: shard.hash_key_range,
            closed: shard.closed,
        }
    }
}

impl Fleet {
    pub fn join(&mut self) {
        let id = format!("w{}", self.next_id);
        self.next_id += 1;
        self.rejoin(&id);
    }

    /// Starts worker `id` (again, after a graceful stop: a restart under the same id).
    pub fn rejoin(&mut self, id: &str) {
        let id = id.to_owned();
        let number: usize = id.trim_start_matches('w').parse().unwrap_or(0);
        let config = if self.mixed && number % 2 == 1 {
            self.config.clone().liveness(Liveness::PerLease)
        } else {
            self.config.clone()
        };
        let factory = Factory {
            worker: id.clone(),
            log: self.log.clone(),
            seed: self.seed,
            instances: self.instances.clone(),
            failure_rate: self.failure_rate,
            parallel: self.parallel,
            poison: self.poison.clone(),
            outputs: self.outputs.map(|_| match &self.sink {
                Some(sink) => {
                    super::outputs::Target::Sink(super::outputs::RoundTrip(sink.client(&id)))
                }
                None => super::outputs::Target::Store(self.store.client(&id)),
            }),
        };
        // Its own client name, so that a partition can cut a worker off from the lease table
        // alone, or from the stream alone.
        let stream = self.stream.client(&stream_client(&id));
        match self.keys.0.clone() {
            None => {
                let factory = move |shard: &ShardId| factory.create(shard);
                self.launch(&id, config, stream, factory);
            }
            Some(stream_id) => {
                let tracker = Streams::default();
                tracker.add(stream_id, config.initial_position);
                let source = MultiStreamSource::new(tracker, move |_: &StreamId| stream.clone());
                let factory =
                    StreamFactories::new().otherwise(move |s: &StreamId, shard: &ShardId| {
                        factory.create(&s.lease_key(shard))
                    });
                self.launch(&id, config, source, factory);
            }
        }
    }

    fn launch<S: ShardSource, F: ProcessorFactory>(
        &mut self,
        id: &str,
        config: WorkerConfig,
        source: S,
        factory: F,
    ) {
        let mut worker = Worker::builder(source, self.store.client(id)).id(id);
        worker = match &self.poison {
            Some(poison) => worker
                .config(config.failure(poison.policy.clone()))
                .dead_letters(DeadLetters::new(poison.sink.clone()).reader(poison.sink.clone())),
            None => worker.config(config),
        };
        if let Some(sink) = &self.sink {
            worker = worker.positions(super::positions::Opens::new(
                sink.client(id),
                self.log.clone(),
            ));
        }
        let worker = worker.build_with(factory).expect("valid config");
        let (singleton, singleton_stop) = self.compete_for_singleton(id);
        let (periodic, periodic_stop) = self.run_periodic(id);
        super::problems::sample(id, worker.status(), self.log.clone());
        let member = Member {
            shutdown: worker.shutdown_handle(),
            status: worker.status(),
            task: tokio::spawn(self.faults.run_as(id, worker.run())),
            singleton,
            singleton_stop,
            periodic,
            periodic_stop,
        };
        self.live.insert(id.to_owned(), member);
    }

    pub fn singleton_config(&self) -> SingletonConfig {
        let config = SingletonConfig::default()
            .failover_time(self.config.failover_time)
            .poll_interval(self.config.taker_interval)
            .standbys(self.standbys);
        if self.health {
            config.health_timeout(Duration::from_secs(1))
        } else {
            config
        }
    }

    /// Every worker is also a candidate for the fleet's periodic job, numbered on the
    /// stream's clock (which follows the simulation's time).
    fn run_periodic(
        &self,
        id: &str,
    ) -> (JoinHandle<Result<(), kcl_core::Error>>, CancellationToken) {
        let stream = self.stream.clone();
        let singleton = Singleton::new(
            "sim-periodic",
            id,
            self.store.client(id),
            self.singleton_config(),
        )
        .expect("valid config")
        .with_clock(Arc::new(move || stream.now()));
        let stop = CancellationToken::new();
        let (log, me, token) = (self.log.clone(), id.to_owned(), stop.clone());
        let task = async move {
            singleton
                .every(PERIOD, token, move |p| {
                    let (log, me) = (log.clone(), me.clone());
                    async move {
                        log.period_ran(&me, p.index);
                        sleep(Duration::from_millis(300)).await;
                    }
                })
                .await
        };
        (tokio::spawn(self.faults.run_as(id, task)), stop)
    }

    /// Every worker is also a candidate for one fleet-wide singleton task, which takes a
    /// while to stop once cancelled: sometimes longer than it is given.
    fn compete_for_singleton(
        &self,
        id: &str,
    ) -> (JoinHandle<Result<(), kcl_core::Error>>, CancellationToken) {
        let config = self.singleton_config();
        let budget = config.stop_timeout;
        let messenger = Arc::new(self.network.messenger(id, self.faults.clone()));
        let singleton = Singleton::new("sim", id, self.store.client(id), config)
            .expect("valid config")
            .with_messenger(messenger);
        let stop = CancellationToken::new();
        let (log, me, token) = (self.log.clone(), id.to_owned(), stop.clone());
        let mut rng = StdRng::seed_from_u64(self.seed ^ crate::sim::hash(id));
        // In health mode, some runs hang: they keep executing but stop heartbeating.
        let hangs = self.health;
        let task = async move {
            singleton
                .run_with(token, |ctx: TaskContext| {
                    let (log, me) = (log.clone(), me.clone());
                    let wind_down = budget.mul_f64(rng.random_range(0.0..2.0));
                    let hang_at =
                        (hangs && rng.random_bool(0.3)).then(|| rng.random_range(1..40u32));
                    async move {
                        let index = log.run_started(&me, ctx.fencing_token().0);
                        let mut inbox = ctx.inbox();
                        // It works every 100 ms until cancelled (reading its inbox), then takes
                        // `wind_down` to stop.
                        let mut ticks = 0;
                        loop {
                            tokio::select! {
                                biased;
                                () = ctx.cancelled().cancelled() => break,
                                () = sleep(Duration::from_millis(100)) => {
                                    log.run_active(index);
                                    while let Some(Ok(_)) = inbox.as_mut().map(|i| i.try_recv()) {}
                                    ticks += 1;
                                    if hang_at.is_none_or(|at| ticks < at) {
                                        ctx.heartbeat();
                                    }
                                }
                            }
                        }
                        log.run_active(index);
                        sleep(wind_down).await;
                        log.run_active(index);
                    }
                })
                .await
        };
        (tokio::spawn(self.faults.run_as(id, task)), stop)
    }

    pub fn pick(&self, rng: &mut StdRng) -> Option<String> {
        let ids: Vec<&String> = self.live.keys().collect();
        (!ids.is_empty()).then(|| ids[rng.random_range(0..ids.len())].clone())
    }

    /// Removes a worker: crashed (its process gone, nothing released) or stopped gracefully.
    /// A graceful stop must end within the shutdown deadline (plus the singleton's stop
    /// budget); what does not is returned as a violation.
    pub async fn remove(&mut self, id: &str, crash: bool) -> Option<String> {
        let m = self.live.remove(id)?;
        self.faults.resume(id);
        if crash {
            m.task.abort();
            m.singleton.abort();
            m.periodic.abort();
            let _ = m.task.await;
            let _ = m.singleton.await;
            let _ = m.periodic.await;
            return None;
        }
        let limit = self.config.shutdown_timeout + Duration::from_secs(1);
        m.singleton_stop.cancel();
        m.periodic_stop.cancel();
        let singleton = tokio::time::timeout(limit, m.singleton).await;
        if !matches!(
            tokio::time::timeout(limit, m.periodic).await,
            Ok(Ok(Ok(())))
        ) {
            return Some(format!(
                "shutdown: {id}'s periodic job did not stop cleanly within {limit:?}"
            ));
        }
        m.shutdown.shutdown();
        let worker = tokio::time::timeout(limit, m.task).await;
        match (singleton, worker) {
            (Ok(Ok(Ok(()))), Ok(Ok(Ok(())))) => None,
            (singleton, worker) => Some(format!(
                "shutdown: {id} did not stop cleanly within {limit:?}: singleton {singleton:?}, worker {worker:?}"
            )),
        }
    }

    /// Stops every worker gracefully.
    pub async fn stop_all(&mut self) -> Vec<String> {
        let ids: Vec<String> = self.live.keys().cloned().collect();
        let mut violations = Vec::new();
        for id in ids {
            violations.extend(self.remove(&id, false).await);
        }
        violations
    }
}

/// The client name of a worker's stream handle.
pub fn stream_client(worker: &str) -> String {
    format!("{worker}/stream")
}
