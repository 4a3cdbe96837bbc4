//! Pieces of the fleet simulation.
pub mod checks;
pub mod processor;
