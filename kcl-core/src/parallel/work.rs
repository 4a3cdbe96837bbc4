//! What [`Parallel`](super::Parallel) runs on a record, and what becomes of a success: a
//! [`RecordHandler`]'s record is finished (its `Ack` done) when the handler returns; an
//! [`OutputHandler`](super::OutputHandler)'s is *computed*, and finished by the committer once
//! its writes committed with a checkpoint (see [`outputs`](super::outputs)).
//!
//! Sealed: the trait is public for the bounds of [`Parallel`](super::Parallel)'s impls, in a
//! module nobody outside the crate can name.

use std::future::Future;
use std::sync::Arc;

use super::RecordHandler;
use super::committer::Committer;
use crate::ack::Ack;
use crate::checkpoint::Checkpointer;
use crate::error::BoxError;
use crate::failure::Handling;
use crate::types::{ExtendedSequenceNumber, Record};

/// What becomes of the record at a position once it succeeded with an output, or was given
/// up on (`None`: dead-lettered or skipped): its `Ack` is settled here.
pub(super) type Done<O> = Arc<dyn Fn(ExtendedSequenceNumber, Option<O>, Ack) + Send + Sync>;

/// A processor's side of its successes: where they go, and the committer that finishes
/// them, if they are not finished at once.
pub struct Started<O> {
    /// Called on every success.
    pub(super) done: Done<O>,
    /// Commits computed records' writes (outputs only).
    pub(super) committer: Option<Committer>,
}

impl<O> std::fmt::Debug for Started<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Started")
            .field("committer", &self.committer)
            .finish_non_exhaustive()
    }
}

/// A processor's failure policy, if it gives records up (none: a record that fails restarts
/// the shard): for a success that turns out to fail later (outputs that cannot commit).
#[derive(Debug, Default)]
pub struct Policy(pub(super) Option<Handling>);

/// The work [`Parallel`](super::Parallel) runs on a record; sealed (see the module docs).
pub trait Work: Send + Sync + 'static {
    /// What a successful run yields.
    type Output: Send + 'static;

    /// Runs the handler on `record`.
    fn run(&self, record: Record) -> impl Future<Output = Result<Self::Output, BoxError>> + Send;

    /// Where one processor's successes go, from its first batch on (`checkpointer` is its
    /// own).
    fn start(&self, checkpointer: &Checkpointer, policy: &Policy) -> Started<Self::Output>;

    /// Whether a parked key's letters may be replayed through [`run`](Self::run) (a
    /// redrive): not when their outputs would have to commit outside the shard's checkpoint.
    fn replays(&self) -> bool {
        true
    }

    /// Whether its outputs commit into a sink that keeps its own position.
    fn needs_positions(&self) -> bool {
        false
    }

    /// Checks the settings that depend on the work.
    fn check(&self, park_keys: bool) -> Result<(), crate::ConfigError> {
        let _ = park_keys;
        Ok(())
    }
}

impl<H: RecordHandler> Work for H {
    type Output = ();

    fn run(&self, record: Record) -> impl Future<Output = Result<(), BoxError>> + Send {
        self.handle(record)
    }

    fn start(&self, _checkpointer: &Checkpointer, _policy: &Policy) -> Started<()> {
        Started {
            done: Arc::new(|_, output: Option<()>, ack: Ack| match output {
                Some(()) => ack.done(),
                None => ack.given_up(),
            }),
            committer: None,
        }
    }
}
