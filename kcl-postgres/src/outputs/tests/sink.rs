//! [`PostgresSink`]: an open fences the shard's row for its tenure and returns the position,
//! waiting for a commit in flight; a commit applies only in the tenure the row names, from
//! a position at or before its checkpoint before, and once.

use std::time::{Duration, Instant};

use kcl_core::outputs::{CommitError, Positions};
use kcl_core::{Checkpoint, ErrorKind, FencingToken, ShardId, WorkerId};

use super::{Call, Fixture, at, lease_row, raw, unique, url};
use crate::{PostgresSink, TableSetup};

/// A sink on the fixture's server, for the fixture's application.
async fn sink(f: &Fixture) -> PostgresSink {
    PostgresSink::connect(&f.url, f.store.application())
        .await
        .unwrap()
}

async fn open(sink: &PostgresSink, owner: &str, fence: u64) -> Option<Checkpoint> {
    let (shard, owner) = (ShardId::new("shard-1"), WorkerId::new(owner));
    sink.open(&shard, &owner, FencingToken(fence))
        .await
        .unwrap()
}

impl Call {
    async fn send_to(&self, sink: &PostgresSink) -> Result<(), CommitError> {
        sink.transact(self.request()).await
    }
}

#[tokio::test]
async fn an_open_fences_the_row_for_its_tenure_and_returns_the_position() {
    let Some(f) = Fixture::new("sink_open").await else {
        return;
    };
    let sink = sink(&f).await;
    assert_eq!(open(&sink, "w", 7).await, None, "a new row has no position");
    let first = Call::of("shard-1", "w", 7, Checkpoint::TrimHorizon, at(200));
    first
        .with(vec![f.insert(1, 10)])
        .send_to(&sink)
        .await
        .unwrap();
    assert_eq!(open(&sink, "v", 8).await, Some(at(200)), "the position");
    // The old tenure's next commit: fenced off, nothing of it ran.
    let zombie = Call::of("shard-1", "w", 7, at(200), at(300));
    lease_row(
        zombie
            .with(vec![f.ran(), f.insert(2, 10)])
            .send_to(&sink)
            .await,
    );
    assert_eq!(sink.fenced_off(), 1);
    assert!(!f.any_ran().await, "a fenced-off commit ran a statement");
    let next = Call::of("shard-1", "v", 8, at(200), at(300));
    next.with(vec![f.insert(2, 10)])
        .send_to(&sink)
        .await
        .unwrap();
    assert_eq!(f.ids().await, vec![1, 2]);
    assert_eq!(sink.fenced_off(), 1);
}

#[tokio::test]
async fn a_commit_without_an_open_or_on_another_application_is_fenced_off() {
    let Some(f) = Fixture::new("sink_unopened").await else {
        return;
    };
    let sink = sink(&f).await;
    let call = Call::of("shard-1", "w", 7, Checkpoint::TrimHorizon, at(200));
    lease_row(
        call.clone()
            .with(vec![f.insert(1, 10)])
            .send_to(&sink)
            .await,
    );
    let other = PostgresSink::connect(&f.url, &unique("other_app"))
        .await
        .unwrap();
    let (shard, owner) = (ShardId::new("shard-1"), WorkerId::new("w"));
    other.open(&shard, &owner, FencingToken(7)).await.unwrap();
    lease_row(call.with(vec![f.insert(1, 10)]).send_to(&sink).await);
    assert_eq!(sink.fenced_off(), 2);
    assert_eq!(f.ids().await, Vec::<i64>::new());
}

#[tokio::test]
async fn a_row_fenced_higher_than_a_rebuilt_lease_table_lets_the_new_tenure_in() {
    let Some(f) = Fixture::new("sink_lower_fence").await else {
        return;
    };
    let sink = sink(&f).await;
    open(&sink, "gone", 1_000_000).await;
    open(&sink, "w", 3).await;
    let call = Call::of("shard-1", "w", 3, Checkpoint::TrimHorizon, at(200));
    call.with(vec![f.insert(1, 10)])
        .send_to(&sink)
        .await
        .unwrap();
    assert_eq!(f.ids().await, vec![1]);
}

#[tokio::test]
async fn an_open_waits_for_a_commit_in_flight_and_returns_its_position() {
    let Some(f) = Fixture::new("sink_open_waits").await else {
        return;
    };
    let sink = sink(&f).await;
    open(&sink, "w", 7).await;
    let held = Call::of("shard-1", "w", 7, Checkpoint::TrimHorizon, at(200))
        .with(vec![f.insert(1, 10), Fixture::sleep(0.6)]);
    let (committed, (position, waited)) = tokio::join!(held.send_to(&sink), async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let sent = Instant::now();
        (open(&sink, "v", 8).await, sent.elapsed())
    });
    committed.unwrap();
    assert_eq!(
        position,
        Some(at(200)),
        "the open saw the commit it waited for"
    );
    assert!(
        waited >= Duration::from_millis(300),
        "the open waited on the row lock: {waited:?}"
    );
    assert_eq!(f.ids().await, vec![1]);
}

#[tokio::test]
async fn a_commit_sent_again_after_its_answer_was_lost_applies_once() {
    let Some(f) = Fixture::new("sink_again").await else {
        return;
    };
    let sink = sink(&f).await;
    open(&sink, "w", 7).await;
    let call = Call::of("shard-1", "w", 7, Checkpoint::TrimHorizon, at(200))
        .with(vec![f.ran(), f.insert(1, 10)]);
    call.send_to(&sink).await.unwrap();
    let ran = format!("SELECT last_value FROM {}_ran", f.orders);
    let once: i64 = f.client.query_one(&ran, &[]).await.unwrap().get(0);
    call.send_to(&sink).await.expect("the same commit again");
    let twice: i64 = f.client.query_one(&ran, &[]).await.unwrap().get(0);
    assert_eq!(twice, once, "its statements did not run again");
    assert_eq!(f.ids().await, vec![1]);
    assert_eq!(sink.fenced_off(), 0);
}

#[tokio::test]
async fn a_commit_behind_the_sinks_position_is_refused_and_one_ahead_of_it_applies() {
    let Some(f) = Fixture::new("sink_behind").await else {
        return;
    };
    let sink = sink(&f).await;
    open(&sink, "w", 7).await;
    let first = Call::of("shard-1", "w", 7, Checkpoint::TrimHorizon, at(200));
    first
        .with(vec![f.insert(1, 10)])
        .send_to(&sink)
        .await
        .unwrap();
    let behind = Call::of("shard-1", "w", 7, at(100), at(300));
    lease_row(behind.with(vec![f.insert(2, 10)]).send_to(&sink).await);
    assert_eq!(sink.fenced_off(), 0, "not a fencing refusal");
    // The lease moved past the sink alone (an operator, a plain checkpoint): harmless.
    let ahead = Call::of("shard-1", "w", 7, at(250), at(300));
    ahead
        .with(vec![f.insert(3, 10)])
        .send_to(&sink)
        .await
        .unwrap();
    assert_eq!(open(&sink, "w", 7).await, Some(at(300)));
    assert_eq!(f.ids().await, vec![1, 3]);
}

#[tokio::test]
async fn a_refused_write_in_the_sink_leaves_the_position() {
    let Some(f) = Fixture::new("sink_refused").await else {
        return;
    };
    let sink = sink(&f).await;
    open(&sink, "w", 7).await;
    let first = Call::of("shard-1", "w", 7, Checkpoint::TrimHorizon, at(200));
    first
        .with(vec![f.insert(1, 10)])
        .send_to(&sink)
        .await
        .unwrap();
    let again = Call::of("shard-1", "w", 7, at(200), at(300));
    let result = again
        .with(vec![f.insert(2, 10), f.insert(1, 10)])
        .send_to(&sink)
        .await;
    assert!(
        matches!(result, Err(CommitError::Refused { index: 1, .. })),
        "{result:?}"
    );
    assert_eq!(open(&sink, "w", 7).await, Some(at(200)));
    assert_eq!(f.ids().await, vec![1]);
}

#[tokio::test]
async fn the_sink_makes_only_its_own_table_and_finds_it_missing_when_told_external() {
    let Some(url) = url() else {
        return;
    };
    let schema = unique("sink_schema");
    raw(&url)
        .await
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let join = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{join}options=-csearch_path%3D{schema}");
    let external = PostgresSink::builder(&url, "app")
        .table_setup(TableSetup::External)
        .build()
        .unwrap();
    let missing = external.ensure_table().await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
    PostgresSink::connect(&url, "app").await.unwrap();
    external.ensure_table().await.unwrap();
    let client = raw(&url).await;
    let tables = client
        .query_one(
            "SELECT to_regclass('kcl_positions') IS NOT NULL, to_regclass('kcl_leases') IS NULL",
            &[],
        )
        .await
        .unwrap();
    assert!(tables.get::<_, bool>(0) && tables.get::<_, bool>(1));
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
