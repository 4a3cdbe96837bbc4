//! The one row through which every worker answers an autoscaler with the leader's figures.
//! Stub: filled in below.

/// The key of the row the leader publishes its signals in.
pub(crate) const SIGNALS_KEY: &str = "kcl-coordination/fleet-signals";

/// Publishes (leader) or reads (others) the signals row.
#[derive(Debug, Default)]
pub(crate) struct Publisher {}
