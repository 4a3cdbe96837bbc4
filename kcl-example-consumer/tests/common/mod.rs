//! Helpers shared by the binary's tests.
#![allow(dead_code, clippy::panic)]

pub(crate) mod consumer;
pub(crate) mod example;

/// The arguments of a consumer on the in-memory backend that logs JSON and listens on a free
/// port of 127.0.0.1.
pub(crate) const MEMORY_CONSUMER: &[&str] = &[
    "--backend",
    "memory",
    "--stream",
    "demo",
    "--application-name",
    "demo",
    "--listen",
    "127.0.0.1:0",
    "--log-format",
    "json",
];
