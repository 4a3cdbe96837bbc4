//! # kcl-example-consumer
//!
//! The library half of the example consumer: its [`processor`], a windowed counter that is
//! meant to be read and copied, and [`periodic`], a processor that checkpoints every N
//! records or T seconds, quiet shards included. The binary (`src/main.rs`) adds the command line, settings,
//! health and metrics endpoints, signal handling and the `demo`.

pub mod messenger;
pub mod periodic;
pub mod processor;

pub use messenger::HttpMessenger;
pub use periodic::EveryNOrT;
pub use processor::{StdoutSink, WindowCounter, WindowSink, WindowSummary};
