//! # kcl-multilang
//!
//! A drop-in for KCL Java's MultiLangDaemon, on kcl: record processors written with the
//! Python (`amazon_kclpy`), Node.js (`aws-kcl`), Ruby or .NET client libraries run as child
//! processes of the `kcl-multilang` binary, unchanged, with no JVM. The binary reads the
//! daemon's `.properties` file ([`Properties`], [`DaemonConfig`]) and runs a kcl worker whose
//! processor for each shard is a child process ([`ChildProcessor`]) speaking the protocol
//! below.
//!
//! This library is the binary's parts, public for the binary and its tests only: the crate is
//! not published and its API carries no semver promise. What a user holds is the binary, its
//! properties keys (`kcl-multilang --print-config`) and the protocol.
//!
//! ## The protocol
//!
//! KCL Java's MultiLangDaemon documents its protocol only in its sources and those of the
//! client libraries; this is it, as KCL Java 3.x speaks it and as this crate implements it.
//!
//! **Processes.** One child process per shard lease held, started from `executableName` (split
//! at spaces: the program, then its arguments) when the lease is taken, and ended when the
//! lease ends. The child reads messages on its stdin and writes messages on its stdout; what it
//! writes on stderr is logged by the daemon. Each message is one JSON object on one line; a
//! line over 1 MiB on either pipe is skipped.
//!
//! **Exchanges.** The daemon writes one message and reads the child's stdout until a `status`
//! message answers it: `{"action":"status","responseFor":"<the action>"}`. Strictly one message
//! is in flight. While it waits, the child may ask to checkpoint, any number of times:
//! `{"action":"checkpoint","sequenceNumber":"…"|null,"subSequenceNumber":n|null}`; the daemon
//! checkpoints and answers with the same message plus `"error"`: `null` on success, else the
//! simple name of the exception KCL Java's checkpointer threw. Lines that are empty or not a
//! message are skipped (the client libraries write an empty line before each message, so that
//! a message never shares a line with something else the application printed).
//!
//! | daemon → child | fields (in this order) | when | may checkpoint |
//! |---|---|---|---|
//! | `initialize` | `shardId`, `sequenceNumber` (the lease's checkpoint: a sequence number or `TRIM_HORIZON`, `LATEST`, `AT_TIMESTAMP`, `SHARD_END`), `subSequenceNumber` | first, once | no |
//! | `processRecords` | `records`, `millisBehindLatest` | each batch, in order | yes |
//! | `leaseLost` | — | the lease was taken or expired; last message | no |
//! | `shardEnded` | — | every record of the shard was delivered; checkpoint (with no sequence number) to end the shard; last message | yes |
//! | `shutdownRequested` | — | the daemon stops or hands the shard over; the last chance to checkpoint; `leaseLost` follows | yes |
//! | `checkpoint` | `sequenceNumber`, `subSequenceNumber`, `error` | answers a checkpoint | — |
//!
//! A record: `{"data": base64, "partitionKey", "sequenceNumber", "approximateArrivalTimestamp":
//! epoch milliseconds, "subSequenceNumber": the position inside a KPL aggregate (0 otherwise),
//! "action":"record"}`. KPL aggregates arrive as their user records.
//!
//! After the last message the daemon closes the child's stdin; the child is expected to exit.
//!
//! | `error` | meaning |
//! |---|---|
//! | `ShutdownException` | the lease is gone: stop; another worker redoes what was not checkpointed |
//! | `ThrottlingException` | the lease table throttled the write: try again later |
//! | `InvalidStateException` | no checkpoint is possible in this message (`initialize`, `leaseLost`) |
//! | `IllegalArgumentException` | not a sequence number, not delivered yet, or behind the checkpoint |
//! | `KinesisClientLibDependencyException` | the lease table could not be written: try again later |
//!
//! A checkpoint without a sequence number is at the last record delivered (in `shardEnded`: the
//! shard's end); one without a sub-sequence number is at sub-sequence 0, as in KCL Java.
//!
//! ## Where it differs from the Java daemon
//!
//! - A child that exits, closes its stdout, answers the wrong `responseFor` or does not answer
//!   within `timeoutInSeconds` costs only its shard a restart from the last checkpoint, with a
//!   backoff; the Java daemon exits (`System.exit(1)`, or halts the JVM on a timeout) and takes
//!   every shard down. `--exit-on-child-failure` keeps the Java behaviour.
//! - `timeoutInSeconds` bounds each hook as a whole (writing the message, the checkpoints on the
//!   way, the answer, and after the last message the child's exit); Java's bounds each read of
//!   an answer, so a child that stops reading its stdin holds its shard there. Without the key,
//!   every hook is still bounded, by 5 min ([`DEFAULT_HOOK_BOUND`]; `leaseLost` by 10 s).
//! - Children run in their own process group: a Ctrl-C at a terminal reaches the daemon, which
//!   then lets every child checkpoint in `shutdownRequested`. A child goes with its group: once
//!   it has exited (or is killed), what is left of its group is killed and reaped.
//! - A `processRecords` during which the child reports on stderr that its processor raised
//!   (amazon_kclpy's `Caught exception from action dispatch: …`, written before it answers the
//!   batch anyway) fails, as a crash would: the shard restarts, or a failure policy
//!   (`failureExhausted`, `deadLetterSink`) bisects the batch and dead-letters the record, in
//!   the same child (it still answers: no restart). The Java daemon counts such a batch as
//!   processed; `childErrorsFailBatch = false` does too.
//! - `executableName`'s program is looked up at start (`PATH` for a name without a `/`, as
//!   `execvp` does); one that cannot be executed is an error naming the key, exit status 2.
//! - A file that is valid UTF-8 is read as UTF-8 (Java reads ISO-8859-1).
//!
//! Every other difference is a key: see `kcl-multilang --print-config`.

mod child;
mod config;
mod properties;
mod protocol;

pub use child::{
    CHILD_RESTARTS, CHILDREN_FAILED, ChildCommand, ChildProcessor, DEFAULT_HOOK_BOUND,
    FailurePolicy, refresh_series,
};
pub use config::{ClientSettings, Credentials, DaemonConfig, DeadLetterSettings, KeyError};
pub use properties::Properties;
pub use protocol::{CheckpointFailure, JsonRecord, ToChild};
