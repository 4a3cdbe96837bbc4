//! A singleton task across three worker processes on the emulators: SIGKILL its holder and
//! another starts it within the failover time plus a poll; SIGTERM the new holder and the
//! row is handed back at once, so the third starts it within a poll; the fencing token grows
//! with every holder; never two holders at once (by the journals' wall-clock lines).
//! Messages sent over HTTP before and after each move reach the instance running then, each
//! once; a sender with the wrong secret is refused.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kcl_aws::DynamoDbLeaseStore;
use kcl_core::singleton::SingletonHandle;
use kcl_serve::HttpMessenger;
use kcl_serve::messenger::Limits;

use kcl_integration_tests::journal::Event;
use kcl_integration_tests::{Context, WorkerProcess, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const FAILOVER: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_singleton_moves_on_kill_and_on_sigterm() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("singleton").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(run(ctx))).await
}

const SECRET: &str = "s3cret";

/// A sender from outside the fleet, with `secret`.
fn handle(ctx: &Context, secret: &str) -> SingletonHandle<DynamoDbLeaseStore> {
    let messenger = HttpMessenger::new(secret, None, Limits::default());
    SingletonHandle::new(
        "report",
        ctx.store(),
        Arc::new(messenger),
        Duration::from_millis(200),
    )
}

/// The messages an instance of `w` took, with its fencing token.
fn received(w: &WorkerProcess) -> anyhow::Result<Vec<(String, u64)>> {
    Ok(w.events()?
        .into_iter()
        .filter(|e| e.event == "message")
        .map(|e| (e.data.unwrap_or_default(), e.token.unwrap_or_default()))
        .collect())
}

fn starts(w: &WorkerProcess) -> anyhow::Result<Vec<Event>> {
    Ok(w.events()?
        .into_iter()
        .filter(|e| e.event == "singleton_start")
        .collect())
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    let args = [
        "--singleton",
        "report",
        "--singleton-poll-ms",
        "500",
        "--failover-ms",
        "3000",
        "--messenger-secret",
        SECRET,
    ];
    let send = async |text: &str| -> anyhow::Result<String> {
        handle(&ctx, SECRET)
            .send(Bytes::from(text.to_owned()), Duration::from_secs(15))
            .await?;
        Ok(text.to_owned())
    };
    let mut a = WorkerProcess::spawn(WORKER, &ctx, "worker-a", &args)?;
    wait_until(
        "worker-a to start the singleton",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || Ok(!starts(&a)?.is_empty()),
    )
    .await
    .map_err(|e| e.context(a.log_tail()))?;
    let b = WorkerProcess::spawn(WORKER, &ctx, "worker-b", &args)?;
    let c = WorkerProcess::spawn(WORKER, &ctx, "worker-c", &args)?;
    let mut sent = vec![send("m-a").await?];
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        starts(&b)?.is_empty() && starts(&c)?.is_empty(),
        "one holder"
    );
    // A wrong secret is refused, at once and for sure.
    let refused = handle(&ctx, "not-the-secret")
        .send(Bytes::from_static(b"intruder"), Duration::from_secs(15))
        .await
        .expect_err("refused");
    assert!(
        !refused.maybe_delivered && refused.waited < Duration::from_secs(2),
        "{refused}"
    );

    a.kill()?;
    let killed = Instant::now();
    // Sent while nobody runs it: it waits for the next holder.
    let (in_between, took) = tokio::join!(
        send("m-failover"),
        wait_until(
            "another worker to start it after the kill",
            Duration::from_secs(20),
            Duration::from_millis(20),
            async || Ok(!starts(&b)?.is_empty() || !starts(&c)?.is_empty()),
        )
    );
    let took = took?;
    eprintln!("SIGKILL: a new holder {took:?} after the kill");
    let bound = FAILOVER + POLL + Duration::from_secs(1);
    assert!(
        took <= bound && killed.elapsed() >= took,
        "took {took:?} > {bound:?}"
    );
    sent.push(in_between?);
    sent.push(send("m-second").await?);

    let (holder, other) = if starts(&b)?.is_empty() {
        (c, b)
    } else {
        (b, c)
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    holder.terminate()?;
    let termed = Instant::now();
    let took = wait_until(
        "the third worker to start it after the SIGTERM",
        Duration::from_secs(20),
        Duration::from_millis(20),
        async || Ok(!starts(&other)?.is_empty()),
    )
    .await?;
    eprintln!("SIGTERM: a new holder {took:?} after the signal");
    assert!(
        took < Duration::from_secs(1) && termed.elapsed() >= took,
        "took {took:?}"
    );
    sent.push(send("m-third").await?);

    // Tokens grow with each holder, and no two holders overlapped.
    let runs = |w: &WorkerProcess| -> anyhow::Result<(u64, i64, Option<i64>)> {
        let events = w.events()?;
        let start = events
            .iter()
            .find(|e| e.event == "singleton_start")
            .unwrap();
        let stop = events
            .iter()
            .find(|e| e.event == "singleton_stop")
            .map(|e| e.ms);
        Ok((start.token.unwrap(), start.ms, stop))
    };
    let (ta, _, _) = runs(&a)?;
    let (th, start_h, stop_h) = runs(&holder)?;
    let (to, start_o, _) = runs(&other)?;
    assert!(ta < th && th < to, "tokens {ta} < {th} < {to}");
    let stopped = stop_h.expect("the holder stopped its task on SIGTERM");
    assert!(
        start_h < stopped && stopped <= start_o,
        "the next started after it stopped"
    );

    // Each message once, to the instance running when it was sent.
    wait_until(
        "the last message",
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || Ok(received(&other)?.iter().any(|(m, _)| m == "m-third")),
    )
    .await?;
    let mut got: Vec<(String, u64)> = Vec::new();
    for w in [&a, &holder, &other] {
        got.extend(received(w)?);
    }
    got.sort_by_key(|(_, token)| *token);
    let texts: Vec<&str> = got.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(texts, sent.iter().map(String::as_str).collect::<Vec<_>>());
    let tokens: Vec<u64> = got.iter().map(|(_, t)| *t).collect();
    assert_eq!(
        tokens,
        [ta, th, th, to],
        "each reached the instance running then"
    );
    other.terminate()?;
    Ok(())
}
