//! The daemon's failure policy as a child sees it, without AWS: a [`ChildProcessor`] whose
//! worker delivers a failed batch again to it (`failureExhausted` = `dead-letter` or `skip`),
//! driven by kcl's `ProcessorHarness` on the in-memory lease store, its child the scripted
//! Python process of the conformance tests (`children/scripted.py`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod scripted;

use kcl_core::memory::MemoryLeaseStore;
use kcl_core::{Checkpoint, ShardId};
use kcl_multilang::FailurePolicy;

use scripted::{harness, record, scripted_with};

/// A stop (or a handoff) while a batch waits for its next try under a policy in place: the
/// child that raised is still there and hears `shutdownRequested` (`--exit-on-child-failure`
/// is not tripped); a child that crashed is replaced by one initialized as the first was,
/// which hears it. No error either way.
#[tokio::test]
async fn a_stop_while_a_batch_waits_for_its_next_try_is_a_clean_stop() {
    for mode in ["raise", "exit"] {
        let store = MemoryLeaseStore::new();
        let mut h = harness(&store).await;
        let exit = tokio_util::sync::CancellationToken::new();
        let policy = FailurePolicy {
            exit: (mode == "raise").then(|| exit.clone()),
            in_place: true,
        };
        let (mut processor, child) = scripted_with(mode, None, true, policy);
        h.initialize(&mut processor).await.unwrap();
        let poison = record(7, 0, "k", b"poison");
        h.process(&mut processor, vec![poison]).await.unwrap_err();
        // The worker waits for the next try; the stop comes first.
        h.shutdown_requested(&mut processor).await.unwrap();
        assert!(
            !exit.is_cancelled(),
            "{mode}: --exit-on-child-failure tripped"
        );
        let received = child.received();
        let actions: Vec<&str> = received
            .iter()
            .filter_map(|l| l.split('"').nth(3))
            .filter(|a| *a != "checkpoint")
            .collect();
        let want: &[&str] = match mode {
            "raise" => &[
                "initialize",
                "processRecords",
                "shutdownRequested",
                "leaseLost",
            ],
            _ => &[
                "initialize",
                "processRecords",
                "initialize",
                "shutdownRequested",
                "leaseLost",
            ],
        };
        assert_eq!(actions, want, "{mode}: {received:#?}");
    }
}

/// A closed shard whose last batch's child crashed, the record then given up by the policy:
/// `shardEnded` goes to a new child, initialized as the first was, which checkpoints the end.
#[tokio::test]
async fn shard_ended_after_a_crash_goes_to_a_new_child() {
    let store = MemoryLeaseStore::new();
    let mut h = harness(&store).await;
    let policy = FailurePolicy {
        in_place: true,
        ..FailurePolicy::default()
    };
    let (mut processor, child) = scripted_with("exit", None, true, policy);
    h.initialize(&mut processor).await.unwrap();
    h.process(&mut processor, vec![record(7, 0, "k", b"x")])
        .await
        .unwrap_err();
    h.shard_ended(&mut processor, vec![ShardId::from("shardId-000000000002")])
        .await
        .unwrap();
    assert_eq!(h.checkpoint().await.unwrap(), Checkpoint::ShardEnd);
    let initialized = child
        .received()
        .iter()
        .filter(|l| l.contains(r#""action":"initialize""#))
        .count();
    assert_eq!(initialized, 2);
}
