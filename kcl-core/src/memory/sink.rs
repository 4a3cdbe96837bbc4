//! An in-memory dead-letter sink that can be told to refuse, for tests and the simulation.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::{BackendError, ErrorKind};
use crate::failure::{DeadLetter, DeadLetterSink};

/// A [`DeadLetterSink`] that keeps what it accepted in memory; clones share it.
///
/// ```
/// use kcl_core::memory::MemorySink;
///
/// let sink = MemorySink::new();
/// sink.refuse(true); // every put fails until refuse(false)
/// assert!(sink.letters().is_empty());
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemorySink(Arc<Mutex<State>>);

#[derive(Debug, Default)]
struct State {
    accepted: Vec<DeadLetter>,
    /// The letters still kept (not removed by a redrive), each with its handle.
    kept: Vec<(u64, DeadLetter)>,
    refusing: bool,
    refused: usize,
}

impl MemorySink {
    /// An empty sink that accepts everything.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Refuse every put (`true`) or accept again.
    pub fn refuse(&self, refusing: bool) {
        self.lock().refusing = refusing;
    }

    /// The letters accepted so far, in order.
    pub fn letters(&self) -> Vec<DeadLetter> {
        self.lock().accepted.clone()
    }

    /// The letters kept now: those accepted that no redrive removed
    /// ([`LetterReader`](crate::failure::LetterReader)).
    pub fn kept(&self) -> Vec<DeadLetter> {
        self.lock().kept.iter().map(|(_, l)| l.clone()).collect()
    }

    /// How many puts were refused.
    pub fn refused(&self) -> usize {
        self.lock().refused
    }
}

impl DeadLetterSink for MemorySink {
    async fn put(&self, letter: &DeadLetter) -> Result<(), BackendError> {
        let mut state = self.lock();
        if state.refusing {
            state.refused += 1;
            return Err(BackendError::new(
                ErrorKind::Retryable,
                "put_dead_letter",
                "the in-memory sink refuses (told to)",
            ));
        }
        state.accepted.push(letter.clone());
        let handle = state.accepted.len() as u64;
        state.kept.push((handle, letter.clone()));
        Ok(())
    }
}

impl crate::failure::LetterReader for MemorySink {
    async fn parked(&self, key: &str) -> Result<Vec<crate::failure::Kept>, BackendError> {
        let state = self.lock();
        let kept = state.kept.iter();
        let of_key = kept.filter(|(_, l)| l.parked_key.as_deref() == Some(key));
        Ok(of_key
            .map(|(h, l)| crate::failure::Kept::new(l.clone(), h.to_string()))
            .collect())
    }

    async fn remove(&self, kept: &crate::failure::Kept) -> Result<(), BackendError> {
        self.lock()
            .kept
            .retain(|(h, _)| h.to_string() != kept.handle);
        Ok(())
    }
}
