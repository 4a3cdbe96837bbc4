//! Opening a shard on a worker given a sink that keeps shards' positions
//! ([`WorkerBuilder::positions`](crate::WorkerBuilder::positions)): the sink is fenced for
//! this tenure, the lease row is read back to prove the tenure still holds it
//! (`Tenure::open_sink`), and a lease checkpoint behind the sink's position is brought up to
//! it, so that the shard resumes after the later of the two. Why, and what the sink
//! guarantees: [`Positions`](crate::outputs::Positions).

use super::{Failure, ShardContext, Stop};
use crate::lease::CheckpointUpdate;
use crate::lease::tenure::{Tenure, TenureError};
use crate::mutation::{self, Mutation};
use crate::source::ShardSource;
use crate::task::bounded;
use crate::types::Checkpoint;

/// Fences the worker's sink, if it has one, and brings the lease up to its position; the
/// stop when the tenure turned out to be lost.
pub(super) async fn open<S: ShardSource>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Tenure,
) -> Result<Option<Stop>, Failure> {
    let Some(sink) = &ctx.positions else {
        return Ok(None);
    };
    let position = match tenure.open_sink(sink).await {
        Ok(position) => position,
        Err(TenureError::Store(e)) => return Err(Failure::Positions(e)),
        Err(_) => return Ok(Some(Stop::Lost)),
    };
    let Some(position) = position else {
        return Ok(None);
    };
    let lease = tenure.snapshot().await;
    let ahead = position.progress_cmp(&lease.checkpoint) == Some(std::cmp::Ordering::Greater);
    if !ahead || mutation::on(Mutation::SinkPositionIgnored) {
        return Ok(None);
    }
    tracing::info!(
        lease_checkpoint = %lease.checkpoint,
        sink_position = %position,
        "the lease's checkpoint was behind the position of the sink: resuming after the sink's"
    );
    let mut update = CheckpointUpdate::new(position);
    if update.checkpoint == Checkpoint::ShardEnd {
        update.child_shard_ids = children(ctx, tenure).await?;
    }
    forward(tenure, &update).await
}

/// The children of the tenure's shard, for a `SHARD_END` the sink has and the lease has
/// not (the lease's write after the sink's commit failed): the parent's row names them, as
/// every ended parent's does.
async fn children<S: ShardSource>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Tenure,
) -> Result<Vec<crate::types::ShardId>, Failure> {
    let shards = bounded(
        ctx.config.call_timeout,
        "list_shards",
        ctx.source.list_shards(),
    )
    .await
    .map_err(Failure::Positions)?;
    let parent = tenure.shard();
    Ok(shards
        .into_iter()
        .filter(|s| s.parent_shard_ids.contains(parent))
        .map(|s| s.id)
        .collect())
}

/// Moves the lease's checkpoint up to the sink's position. Records the row listed as
/// finished past its old checkpoint are not carried over: past the sink's position, only
/// the sink knows what was written.
async fn forward(tenure: &Tenure, update: &CheckpointUpdate) -> Result<Option<Stop>, Failure> {
    match tenure.checkpoint(update).await {
        Ok(_) => Ok(None),
        Err(TenureError::Lost) => Ok(Some(Stop::Lost)),
        // Another write of this tenure moved the checkpoint past it meanwhile.
        Err(TenureError::Behind(_)) => Ok(None),
        Err(TenureError::Store(e)) => Err(Failure::Positions(e)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::time::sleep;

    use crate::memory::{Faults, MemoryLeaseStore, MemoryPositionSink, MemoryStream, MemoryWrite};
    use crate::outputs::Outputs;
    use crate::singleton::is_coordination_key;
    use crate::types::Checkpoint;
    use crate::{
        BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, Worker, WorkerConfig,
    };

    /// Records handed to a processor, by position: how many times.
    type Handed = Arc<Mutex<BTreeMap<String, usize>>>;

    struct Exact {
        sink: MemoryPositionSink,
        handed: Handed,
    }

    impl RecordProcessor for Exact {
        async fn process_records(
            &mut self,
            input: ProcessRecordsInput<'_>,
            cp: &mut Checkpointer,
        ) -> Result<(), BoxError> {
            let mut outputs = Outputs::new();
            for r in input.records() {
                let key = r.position().to_string();
                *self.handed.lock().unwrap().entry(key.clone()).or_default() += 1;
                outputs.push(r, MemoryWrite::add(key, 1));
            }
            Ok(cp.commit_outputs(&self.sink, outputs).await?)
        }
    }

    /// Runs a worker given `sink` until `handed` has seen `n` records, then stops it.
    async fn run(
        stream: &MemoryStream,
        store: &MemoryLeaseStore,
        sink: &MemoryPositionSink,
        handed: &Handed,
        n: usize,
    ) {
        let config = WorkerConfig::default()
            .failover_time(Duration::from_secs(6))
            .idle_time_between_reads(Duration::from_millis(100));
        let (outputs, seen) = (sink.clone(), handed.clone());
        let worker = Worker::builder(stream.clone(), store.clone())
            .id("w")
            .config(config)
            .positions(sink.clone())
            .build(move |_: &crate::ShardId| Exact {
                sink: outputs.clone(),
                handed: seen.clone(),
            })
            .unwrap();
        let stop = worker.shutdown_handle();
        let task = tokio::spawn(worker.run());
        for _ in 0..600 {
            if sink.outputs().len() >= n {
                break;
            }
            sleep(Duration::from_millis(100)).await;
        }
        stop.shutdown();
        task.await.unwrap().unwrap();
    }

    /// A lease moved back behind the sink's position (an operator's reset, a table restored
    /// from a backup) resumes after the sink's: nothing the sink holds is handed again.
    #[tokio::test(start_paused = true)]
    async fn a_lease_behind_the_sink_resumes_after_the_sinks_position() {
        // The mutation check runs this test with the mutation it catches (`Mutation::unit_test`).
        crate::mutation::set_from_env();
        let faults = Faults::seeded(1);
        let (stream, store) = (
            MemoryStream::new(1),
            MemoryLeaseStore::with_faults(faults.clone()),
        );
        let sink = MemoryPositionSink::new(faults);
        let handed = Handed::default();
        for i in 0..30 {
            stream.put("key", format!("record-{i}"));
        }
        run(&stream, &store, &sink, &handed, 30).await;
        for mut lease in store.leases() {
            if !is_coordination_key(&lease.key) {
                lease.checkpoint = Checkpoint::TrimHorizon;
                store.insert(lease);
            }
        }
        for i in 30..40 {
            stream.put("key", format!("record-{i}"));
        }
        run(&stream, &store, &sink, &handed, 40).await;
        let again: Vec<_> = handed
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(again, Vec::<String>::new(), "handed again");
        assert!(sink.outputs().values().all(|item| item.count == 1));
        assert_eq!(sink.outputs().len(), 40);
    }
}
