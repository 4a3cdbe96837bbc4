//! # kcl-example-consumer
//!
//! The library half of the example consumer: its [`processor`], a windowed counter that is
//! meant to be read and copied, and its [`table`], where the counts can go exactly once. The
//! binary (`src/main.rs`) adds the command line, settings, health and metrics endpoints,
//! signal handling and the `demo`.

pub mod processor;
mod resume;
pub mod table;
pub mod window;

pub use processor::{StdoutSink, WindowCounter, WindowSink, WindowSummary};
