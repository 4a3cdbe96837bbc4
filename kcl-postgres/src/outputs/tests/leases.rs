//! Commits of [`PostgresLeaseStore`]: statements and checkpoint together, the tenure's
//! condition before any statement, each failure mapped to what it means, and a lost
//! `COMMIT` answer settled by the retry.

use std::time::{Duration, Instant};

use kcl_core::outputs::CommitError;
use kcl_core::{ErrorKind, LeaseStore};

use super::proxy::Proxy;
use super::{Call, Fixture, Sql, at, lease_row};
use crate::PostgresLeaseStore;

#[tokio::test]
async fn a_commit_applies_its_statements_and_the_checkpoint_and_leaves_the_counter() {
    let Some(f) = Fixture::new("commit_applies").await else {
        return;
    };
    let held = f.held("shard-1", "w").await;
    let renewed = f.store.renew(&held).await.unwrap();
    let call = Call::new(&held, at(200), vec![f.insert(1, 10), f.insert(2, 20)]);
    call.send(&f.store).await.unwrap();
    assert_eq!(f.ids().await, vec![1, 2]);
    let row = f.row("shard-1").await;
    assert_eq!(row.checkpoint, at(200));
    assert_eq!(row.counter, renewed.counter, "the counter is the renewal's");
    assert_eq!((row.owner, row.fence), (held.owner, held.fence));
    f.store.renew(&renewed).await.expect("the holder renews on");
}

#[tokio::test]
async fn a_stale_tenure_or_checkpoint_is_refused_before_any_statement_runs() {
    let Some(f) = Fixture::new("commit_stale").await else {
        return;
    };
    let held = f.held("shard-1", "w").await;
    let writes = || vec![f.ran(), f.insert(1, 10)];
    let mut other = Call::new(&held, at(200), writes());
    other.owner = kcl_core::WorkerId::new("z");
    let mut earlier = Call::new(&held, at(200), writes());
    earlier.fence.0 -= 1;
    let mut moved = Call::new(&held, at(200), writes());
    moved.before = at(150);
    for call in [other, earlier, moved] {
        lease_row(call.send(&f.store).await);
    }
    // A later tenure of the same worker: the old one's commit is a zombie's.
    let lost = f.store.take(&held, &"v".into()).await.unwrap();
    let back = f.store.take(&lost, &"w".into()).await.unwrap();
    lease_row(Call::new(&held, at(200), writes()).send(&f.store).await);
    assert!(!f.any_ran().await, "a refused commit ran a statement");
    assert_eq!(f.ids().await, Vec::<i64>::new());
    assert_eq!(f.row("shard-1").await, back, "the row is untouched");
    Call::new(&back, at(200), writes())
        .send(&f.store)
        .await
        .unwrap();
    assert!(f.any_ran().await, "the holder's commit ran its statements");
}

#[tokio::test]
async fn a_write_refused_by_its_constraint_is_named_and_nothing_applies() {
    let Some(f) = Fixture::new("commit_refused").await else {
        return;
    };
    let held = f.held("shard-1", "w").await;
    Call::new(&held, at(200), vec![f.insert(1, 10)])
        .send(&f.store)
        .await
        .unwrap();
    let now = f.row("shard-1").await;
    let duplicate = vec![f.insert(2, 10), f.insert(1, 99_999), f.insert(3, 10)];
    match Call::new(&now, at(300), duplicate).send(&f.store).await {
        Err(CommitError::Refused { index: 1, reason }) => {
            assert!(reason.contains("23505"), "{reason}");
            assert!(!reason.contains("99999"), "a value in the reason: {reason}");
        }
        other => panic!("expected Refused {{ index: 1 }}, got {other:?}"),
    }
    let negative = vec![f.insert(2, 10), f.insert(3, 10), f.insert(4, -1)];
    match Call::new(&now, at(300), negative).send(&f.store).await {
        Err(CommitError::Refused { index: 2, reason }) => {
            assert!(reason.contains("23514"), "{reason}");
        }
        other => panic!("expected Refused {{ index: 2 }}, got {other:?}"),
    }
    assert_eq!(
        f.ids().await,
        vec![1],
        "nothing of a refused commit applied"
    );
    assert_eq!(f.row("shard-1").await, now);
}

#[tokio::test]
async fn a_write_that_cannot_run_as_written_is_invalid_and_named() {
    let Some(f) = Fixture::new("commit_invalid").await else {
        return;
    };
    let held = f.held("shard-1", "w").await;
    let o = &f.orders;
    let cases = [(
        Sql::new(format!(
            "INSERT INTO {o} (id, total) VALUES ($1, $2::text::int)"
        ))
        .bind(2_i64)
        .bind("secret-42"),
        "22P02",
    )];
    for (write, said) in cases {
        let call = Call::new(&held, at(200), vec![f.insert(1, 10), write.clone()]);
        match call.send(&f.store).await {
            Err(CommitError::Invalid {
                index: Some(1),
                reason,
            }) => {
                assert!(reason.contains(said), "{write:?}: {reason}");
                assert!(
                    !reason.contains("secret"),
                    "a value in the reason: {reason}"
                );
            }
            other => panic!("{write:?}: expected Invalid {{ index: 1 }}, got {other:?}"),
        }
    }
    assert_eq!(f.ids().await, Vec::<i64>::new());
    assert_eq!(f.row("shard-1").await, held);
}

#[tokio::test]
async fn a_statement_wrong_for_every_record_is_the_stores_error_not_the_writes() {
    let Some(f) = Fixture::new("commit_unmigrated").await else {
        return;
    };
    let held = f.held("shard-1", "w").await;
    let o = &f.orders;
    // A column the code expects before its migration ran, and a syntax error: every record
    // would fail alike, so the shard stalls for a fix rather than give them all up.
    let cases = [
        (
            Sql::new(format!("INSERT INTO {o} (id, nope) VALUES ($1, $2)"))
                .bind(2_i64)
                .bind(1),
            "42703",
        ),
        (
            Sql::new(format!("INSRT INTO {o} (id) VALUES ($1)")).bind(2_i64),
            "42601",
        ),
        // Found before anything is sent: a Rust type the column does not take, a count of
        // values, kcl's own table.
        (
            Sql::new(format!("INSERT INTO {o} (id, total) VALUES ($1, $2)"))
                .bind("two")
                .bind(1),
            "cannot convert",
        ),
        (
            Sql::new(format!("INSERT INTO {o} (id, total) VALUES ($1, $2)")).bind(2_i64),
            "takes 2 values",
        ),
        (
            Sql::new("UPDATE kcl_leases SET checkpoint = 'SHARD_END'"),
            "kcl's own table",
        ),
    ];
    for (write, said) in cases {
        let call = Call::new(&held, at(200), vec![f.insert(1, 10), write.clone()]);
        match call.send(&f.store).await {
            Err(CommitError::Store(e)) => {
                assert_eq!(e.kind(), ErrorKind::Fatal, "{write:?}: {e}");
                assert!(e.to_string().contains(said), "{write:?}: {e}");
            }
            other => panic!("{write:?}: expected a store error, got {other:?}"),
        }
    }
    assert_eq!(f.ids().await, Vec::<i64>::new());
    assert_eq!(f.row("shard-1").await, held);
}

#[tokio::test]
async fn a_dropped_output_table_is_the_stores_error_not_the_writes() {
    let Some(f) = Fixture::new("commit_no_table").await else {
        return;
    };
    let held = f.held("shard-1", "w").await;
    let drop = format!("DROP TABLE {}", f.orders);
    f.client.batch_execute(&drop).await.unwrap();
    match Call::new(&held, at(200), vec![f.insert(1, 10)])
        .send(&f.store)
        .await
    {
        Err(CommitError::Store(e)) => {
            assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
            assert!(e.to_string().contains("output write 0"), "{e}");
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(f.row("shard-1").await, held);
}

#[tokio::test]
async fn a_constraint_checked_at_commit_names_no_write() {
    let Some(f) = Fixture::new("commit_deferred").await else {
        return;
    };
    let held = f.held("shard-1", "w").await;
    let table = super::unique("deferred");
    let create = format!(
        "CREATE TABLE {table} (id bigint, CONSTRAINT {table}_id UNIQUE (id) \
         DEFERRABLE INITIALLY DEFERRED)"
    );
    f.client.batch_execute(&create).await.unwrap();
    let insert = Sql::new(format!("INSERT INTO {table} (id) VALUES ($1)")).bind(7_i64);
    let call = Call::new(&held, at(200), vec![insert.clone(), insert]);
    match call.send(&f.store).await {
        Err(CommitError::Invalid {
            index: None,
            reason,
        }) => {
            assert!(reason.contains("23505"), "{reason}");
        }
        other => panic!("expected Invalid {{ index: None }}, got {other:?}"),
    }
    assert_eq!(f.row("shard-1").await, held);
}

#[tokio::test]
async fn a_retry_waits_for_the_attempt_in_flight_then_finds_the_checkpoint_moved() {
    let Some(f) = Fixture::new("commit_waits").await else {
        return;
    };
    let held = f.held("shard-1", "w").await;
    let call = Call::new(&held, at(200), vec![f.insert(1, 10), Fixture::sleep(0.6)]);
    let started = Instant::now();
    let (first, (retry, waited)) = tokio::join!(call.send(&f.store), async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let sent = Instant::now();
        (call.send(&f.store).await, sent.elapsed())
    });
    first.unwrap();
    lease_row(retry);
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert!(
        waited >= Duration::from_millis(300),
        "the retry waited on the row lock: {waited:?}"
    );
    assert_eq!(f.ids().await, vec![1], "applied once");
    assert_eq!(f.row("shard-1").await.checkpoint, at(200));
}

/// What the core does with a commit whose `COMMIT` answer was lost: retries it with the same
/// checkpoint before, is refused on the lease row, reads the row and finds this tenure at
/// the commit's checkpoint (applied).
#[tokio::test]
async fn a_lost_commit_answer_is_retried_refused_and_read_back_as_applied() {
    let Some(f) = Fixture::new("commit_lost_answer").await else {
        return;
    };
    let proxy = Proxy::start(&f.url).await;
    let through = PostgresLeaseStore::connect(&proxy.url(&f.url), f.store.application())
        .await
        .unwrap();
    let held = f.held("shard-1", "w").await;
    let call = Call::new(&held, at(200), vec![f.insert(1, 10)]);
    proxy.lose_next_commit_answer();
    match call.send(&through).await {
        Err(CommitError::Store(e)) => assert_eq!(e.kind(), ErrorKind::Retryable, "{e}"),
        other => panic!("expected a retryable store error, got {other:?}"),
    }
    assert_eq!(proxy.commits_cut(), 1, "the answer was cut");
    lease_row(call.send(&through).await);
    let row = through.get(&held.key).await.unwrap().unwrap();
    assert_eq!((&row.owner, row.fence), (&held.owner, held.fence));
    assert_eq!(
        row.checkpoint, call.update.checkpoint,
        "read back as applied"
    );
    assert_eq!(f.ids().await, vec![1], "applied once");
}

/// A transaction whose client went silent holding the lease row's lock (a partition, a
/// stopped process) is ended by the server: the next take waits seconds, not hours.
#[tokio::test]
async fn a_transaction_left_open_by_a_silent_client_frees_the_lease_row() {
    let Some(f) = Fixture::new("commit_idle").await else {
        return;
    };
    let held = f.held("shard-1", "w").await;
    let silent = f.store.lend("test", None).await.unwrap();
    let lock = format!(
        "BEGIN; UPDATE kcl_leases SET owner = owner WHERE application = '{}' \
         AND lease_key = 'shard-1'",
        f.store.application()
    );
    silent.batch_execute(&lock).await.unwrap();
    let started = Instant::now();
    let taken = f.store.take(&held, &"v".into()).await;
    let waited = started.elapsed();
    taken.expect("the take, once the silent transaction ended");
    assert!(
        waited >= Duration::from_secs(4) && waited < Duration::from_secs(9),
        "the take waited for the server to end the silent transaction: {waited:?}"
    );
    drop(silent);
}
