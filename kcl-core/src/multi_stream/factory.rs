//! [`StreamFactories`]: a processor factory per stream, behind one [`ProcessorFactory`].
//!
//! The worker has one processor type; streams may each want their own. [`BoxProcessor`]
//! erases a processor's type (each hook call costs one boxed future), so that the factories
//! of different streams can return different types.

use std::collections::BTreeMap;

use futures_util::future::BoxFuture;

use super::StreamId;
use crate::checkpoint::Checkpointer;
use crate::error::BoxError;
use crate::processor::{
    InitializationInput, ProcessRecordsInput, ProcessorFactory, RecordProcessor,
};
use crate::types::ShardId;

/// The object-safe form of [`RecordProcessor`].
trait Erased: Send + 'static {
    fn initialize<'a>(
        &'a mut self,
        input: &'a InitializationInput,
    ) -> BoxFuture<'a, Result<(), BoxError>>;
    fn process_records<'a>(
        &'a mut self,
        input: ProcessRecordsInput<'a>,
        checkpointer: &'a mut Checkpointer,
    ) -> BoxFuture<'a, Result<(), BoxError>>;
    fn lease_lost(&mut self) -> BoxFuture<'_, ()>;
    fn shard_ended<'a>(
        &'a mut self,
        checkpointer: &'a mut Checkpointer,
    ) -> BoxFuture<'a, Result<(), BoxError>>;
    fn shutdown_requested<'a>(
        &'a mut self,
        checkpointer: &'a mut Checkpointer,
    ) -> BoxFuture<'a, Result<(), BoxError>>;
}

impl<P: RecordProcessor> Erased for P {
    fn initialize<'a>(
        &'a mut self,
        input: &'a InitializationInput,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(RecordProcessor::initialize(self, input))
    }

    fn process_records<'a>(
        &'a mut self,
        input: ProcessRecordsInput<'a>,
        checkpointer: &'a mut Checkpointer,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(RecordProcessor::process_records(self, input, checkpointer))
    }

    fn lease_lost(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(RecordProcessor::lease_lost(self))
    }

    fn shard_ended<'a>(
        &'a mut self,
        checkpointer: &'a mut Checkpointer,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(RecordProcessor::shard_ended(self, checkpointer))
    }

    fn shutdown_requested<'a>(
        &'a mut self,
        checkpointer: &'a mut Checkpointer,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(RecordProcessor::shutdown_requested(self, checkpointer))
    }
}

/// A processor of any type.
pub struct BoxProcessor(Box<dyn Erased>);

impl std::fmt::Debug for BoxProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BoxProcessor")
    }
}

impl BoxProcessor {
    /// Erases `processor`'s type.
    pub fn new(processor: impl RecordProcessor) -> Self {
        Self(Box::new(processor))
    }
}

impl RecordProcessor for BoxProcessor {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        self.0.initialize(input).await
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.0.process_records(input, checkpointer).await
    }

    async fn lease_lost(&mut self) {
        self.0.lease_lost().await;
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), BoxError> {
        self.0.shard_ended(checkpointer).await
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.0.shutdown_requested(checkpointer).await
    }
}

type ForStream = Box<dyn Fn(&ShardId) -> BoxProcessor + Send + Sync>;
type ForAny = Box<dyn Fn(&StreamId, &ShardId) -> BoxProcessor + Send + Sync>;

/// Processor factories by stream, for a worker on a
/// [`MultiStreamSource`](super::MultiStreamSource). A factory gets the shard id without
/// its stream (`shardId-000000000001`).
#[derive(Default)]
pub struct StreamFactories {
    by_stream: BTreeMap<StreamId, ForStream>,
    otherwise: Option<ForAny>,
}

impl std::fmt::Debug for StreamFactories {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamFactories")
            .field("streams", &self.by_stream.keys().collect::<Vec<_>>())
            .field("otherwise", &self.otherwise.is_some())
            .finish()
    }
}

impl StreamFactories {
    /// No factories yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// `stream`'s shards get processors from `factory`.
    #[must_use]
    pub fn stream<P: RecordProcessor>(
        mut self,
        stream: StreamId,
        factory: impl Fn(&ShardId) -> P + Send + Sync + 'static,
    ) -> Self {
        self.by_stream.insert(
            stream,
            Box::new(move |shard| BoxProcessor::new(factory(shard))),
        );
        self
    }

    /// Shards of streams without a factory of their own (streams a tracker adds later, for
    /// example) get processors from `factory`.
    #[must_use]
    pub fn otherwise<P: RecordProcessor>(
        mut self,
        factory: impl Fn(&StreamId, &ShardId) -> P + Send + Sync + 'static,
    ) -> Self {
        self.otherwise = Some(Box::new(move |stream, shard| {
            BoxProcessor::new(factory(stream, shard))
        }));
        self
    }
}

impl ProcessorFactory for StreamFactories {
    type Processor = BoxProcessor;

    fn create(&self, key: &ShardId) -> BoxProcessor {
        let Some((stream, shard)) = StreamId::split_key(key) else {
            return BoxProcessor::new(Missing(format!("{key} is not a multi-stream lease key")));
        };
        if let Some(factory) = self.by_stream.get(&stream) {
            return factory(&shard);
        }
        match &self.otherwise {
            Some(factory) => factory(&stream, &shard),
            None => BoxProcessor::new(Missing(format!(
                "no processor factory for stream {stream}: add one with StreamFactories::stream or ::otherwise"
            ))),
        }
    }
}

/// Fails at once, saying why: its shard is retried with backoff, and the log says what to fix.
struct Missing(String);

impl RecordProcessor for Missing {
    async fn initialize(&mut self, _input: &InitializationInput) -> Result<(), BoxError> {
        Err(self.0.clone().into())
    }

    async fn process_records(
        &mut self,
        _input: ProcessRecordsInput<'_>,
        _checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        Err(self.0.clone().into())
    }
}
