//! A failure injected on purpose (`--inject-failure`): the processor fails every call of one
//! hook, so that an operator can see, before a broken processor ships, what one looks like:
//! the shard reported `failing` in `/status`, `/readyz` not ready, `kcl_shards_failing` at 1
//! and the `KclShardFailing` alert firing. Never meant for production.

use kcl_core::{BoxError, Checkpointer, InitializationInput, ProcessRecordsInput, RecordProcessor};

/// Which hook fails, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Fault {
    /// Nothing fails (the default).
    #[default]
    None,
    /// Every `process_records` fails.
    ProcessRecords,
    /// Every `initialize` fails: the processor never starts.
    Initialize,
}

impl Fault {
    /// `none`, `process-records` or `initialize`.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "none" => Ok(Self::None),
            "process-records" => Ok(Self::ProcessRecords),
            "initialize" => Ok(Self::Initialize),
            _ => Err(format!(
                "expected none, process-records or initialize, got {s:?}"
            )),
        }
    }
}

/// The error of a hook that fails on purpose.
#[derive(Debug, thiserror::Error)]
#[error("{0} failed on purpose (--inject-failure)")]
struct Injected(&'static str);

/// `P`, failing where its [`Fault`] says.
#[derive(Debug)]
pub(crate) struct Faulty<P> {
    inner: P,
    fault: Fault,
}

impl<P> Faulty<P> {
    pub(crate) fn new(inner: P, fault: Fault) -> Self {
        Self { inner, fault }
    }
}

impl<P: RecordProcessor> RecordProcessor for Faulty<P> {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        if self.fault == Fault::Initialize {
            return Err(Injected("initialize").into());
        }
        self.inner.initialize(input).await
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        if self.fault == Fault::ProcessRecords {
            return Err(Injected("process_records").into());
        }
        self.inner.process_records(input, checkpointer).await
    }

    async fn lease_lost(&mut self) {
        self.inner.lease_lost().await;
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), BoxError> {
        self.inner.shard_ended(checkpointer).await
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.inner.shutdown_requested(checkpointer).await
    }
}
