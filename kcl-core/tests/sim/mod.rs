//! Pieces of the fleet simulation.
pub mod checks;
pub mod fleet;
pub mod handler;
pub mod mutations;
pub mod processor;
pub mod scenario;
pub mod schedule;

/// A hash that is the same in every run, to derive seeds from names.
pub fn hash(value: &str) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}
