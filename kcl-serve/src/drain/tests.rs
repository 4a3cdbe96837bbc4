//! `POST /drain` against a `watch` of `Status` values, over a real socket; its client.

use std::net::SocketAddr;

use axum::body::Body;
use kcl_core::ShardId;
use tower::ServiceExt;

use super::*;
use crate::server;
use client::parse;

fn holding(phase: Phase, n: usize) -> Status {
    let mut status = Status::default();
    status.phase = phase;
    status.held = (0..n)
        .map(|i| ShardId::new(format!("shardId-{i}")))
        .collect();
    status
}

struct Served {
    addr: SocketAddr,
    handle: ShutdownHandle,
    status: watch::Sender<Status>,
    also: CancellationToken,
    stop: CancellationToken,
}

/// `POST /drain` served for a worker whose status starts as `initial`, its token written to
/// its default place.
async fn serve(initial: Status) -> Served {
    serve_with(initial, false).await
}

/// As [`serve`], for a worker with a `restart_grace` or not.
async fn serve_with(initial: Status, restart_grace: bool) -> Served {
    let (status, rx) = watch::channel(initial);
    let (handle, also, stop) = (
        ShutdownHandle::default(),
        CancellationToken::new(),
        CancellationToken::new(),
    );
    let listener = server::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let token = token::Token::write(&token::default_path(addr.port())).unwrap();
    let setup = Setup {
        handle: handle.clone(),
        status: rx,
        also: also.clone(),
        token: Some(token),
        restart_grace,
    };
    tokio::spawn(server::serve(
        listener,
        routes(setup),
        stop.clone().cancelled_owned(),
        server::Limits::default(),
    ));
    Served {
        addr,
        handle,
        status,
        also,
        stop,
    }
}

/// The client, off the runtime's threads (it blocks).
async fn drain_of(addr: SocketAddr, timeout: Duration) -> Result<Drained, DrainError> {
    tokio::task::spawn_blocking(move || request(addr, timeout))
        .await
        .unwrap()
}

/// The routes alone, with a token written to a file of the test's, and that file.
fn routed(
    handle: &ShutdownHandle,
    rx: watch::Receiver<Status>,
    also: &CancellationToken,
) -> (Router, String) {
    let path = std::env::temp_dir().join(format!(
        "kcl-drain-routes-{}-{}.token",
        std::process::id(),
        kcl_core::memory::next_event_seq()
    ));
    let token = token::Token::write(&path).unwrap();
    let secret = token::read(&path).unwrap();
    let setup = Setup {
        handle: handle.clone(),
        status: rx,
        also: also.clone(),
        token: Some(token),
        restart_grace: false,
    };
    (routes(setup), secret)
}

#[test]
fn where_a_drain_stands() {
    assert_eq!(
        DrainState::of(&holding(Phase::Running, 0)),
        DrainState::Draining
    );
    assert_eq!(
        DrainState::of(&holding(Phase::Running, 2)),
        DrainState::Draining
    );
    assert_eq!(
        DrainState::of(&holding(Phase::ShuttingDown, 2)),
        DrainState::Draining
    );
    assert_eq!(
        DrainState::of(&holding(Phase::ShuttingDown, 0)),
        DrainState::Drained
    );
    assert_eq!(
        DrainState::of(&holding(Phase::Stopped, 0)),
        DrainState::Drained
    );
    assert_eq!(
        DrainState::of(&holding(Phase::Stopped, 1)),
        DrainState::StoppedHolding
    );
}

#[test]
fn only_local_peers_may_drain() {
    let peer = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
    assert!(is_local(peer("127.0.0.1:5000")));
    assert!(is_local(peer("127.3.2.1:5000")));
    assert!(is_local(peer("[::1]:5000")));
    assert!(is_local(peer("[::ffff:127.0.0.1]:5000")));
    assert!(!is_local(peer("10.0.0.7:5000")));
    assert!(!is_local(peer("[::ffff:10.0.0.7]:5000")));
    assert!(!is_local(peer("[fd00::1]:5000")));
    assert!(!is_local(None));
}

#[tokio::test]
async fn another_host_gets_403_and_nothing_stops() {
    let (_tx, rx) = watch::channel(holding(Phase::Running, 2));
    let (handle, also) = (ShutdownHandle::default(), CancellationToken::new());
    let (router, secret) = routed(&handle, rx, &also);
    for peer in [Some("10.1.2.3:4000"), None] {
        let mut request = Request::post("/drain")
            .header("authorization", format!("Bearer {secret}"))
            .body(Body::empty())
            .unwrap();
        if let Some(peer) = peer {
            let peer: SocketAddr = peer.parse().unwrap();
            request.extensions_mut().insert(ConnectInfo(peer));
        }
        let response = router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{peer:?}");
    }
    assert!(!handle.is_shutdown() && !also.is_cancelled());
}

#[tokio::test]
async fn a_local_caller_without_the_token_gets_403_and_nothing_stops() {
    // A sidecar forwarding traffic, `kubectl port-forward`, a hostNetwork neighbour: all
    // arrive from 127.0.0.1, none can read the pod's token file.
    let (_tx, rx) = watch::channel(holding(Phase::Running, 2));
    let (handle, also) = (ShutdownHandle::default(), CancellationToken::new());
    let (router, secret) = routed(&handle, rx, &also);
    let wrong = format!("Bearer {}", secret.replace(&secret[..1], "z"));
    for authorization in [
        None,
        Some("Bearer "),
        Some(wrong.as_str()),
        Some(secret.as_str()),
    ] {
        let mut request = Request::post("/drain?wait_ms=0");
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let mut request = request.body(Body::empty()).unwrap();
        let local: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        request.extensions_mut().insert(ConnectInfo(local));
        let response = router.clone().oneshot(request).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::FORBIDDEN,
            "{authorization:?}"
        );
    }
    assert!(!handle.is_shutdown() && !also.is_cancelled());
    // With it, from this host: the drain begins.
    let mut request = Request::post("/drain?wait_ms=0")
        .header("authorization", format!("Bearer {secret}"))
        .body(Body::empty())
        .unwrap();
    let local: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(local));
    let response = router.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert!(handle.is_draining() && also.is_cancelled());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_token_file_says_so_and_nothing_stops() {
    let s = serve(holding(Phase::Running, 2)).await;
    let missing = std::env::temp_dir().join("kcl-drain-no-such.token");
    let addr = s.addr;
    let result =
        tokio::task::spawn_blocking(move || request_with(addr, &missing, Duration::from_secs(2)))
            .await
            .unwrap();
    assert!(
        matches!(result, Err(DrainError::Token { .. })),
        "{result:?}"
    );
    assert!(!s.handle.is_shutdown());
    s.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_after_a_restart_grace_shutdown_began_says_what_it_kept_not_drained() {
    // Running with 3 leases; SIGTERM under restart_grace keeps 2 for the restart before the
    // drain comes: the one still held is handed over, the 2 kept wait for the grace.
    let s = serve_with(holding(Phase::Running, 3), true).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.handle.shutdown();
    s.status.send_replace(holding(Phase::ShuttingDown, 1));
    let client = tokio::spawn(drain_of(s.addr, Duration::from_secs(30)));
    while !s.handle.is_draining() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.status.send_replace(holding(Phase::ShuttingDown, 0));
    let said = client.await.unwrap();
    assert_eq!(
        said,
        Err(DrainError::Kept {
            kept: 2,
            handed_over: 1
        })
    );
    let message = said.unwrap_err().to_string();
    assert!(message.starts_with("not drained"), "{message}");

    // A drain asked before the shutdown (or without a grace) is a drain, as before.
    let s = serve_with(holding(Phase::Running, 3), true).await;
    let client = tokio::spawn(drain_of(s.addr, Duration::from_secs(30)));
    while !s.handle.is_draining() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s.status.send_replace(holding(Phase::ShuttingDown, 0));
    assert_eq!(client.await.unwrap().map(|d| d.leases), Ok(3));
    s.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_hands_every_lease_over_then_reports_how_many() {
    let s = serve(holding(Phase::Running, 3)).await;
    let client = tokio::spawn(drain_of(s.addr, Duration::from_secs(30)));
    // The worker as it drains: asked, shutting down, its leases handed over one by one.
    while !s.handle.is_draining() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(s.handle.is_shutdown() && s.also.is_cancelled());
    for held in [3, 2, 1, 0] {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.status.send_replace(holding(Phase::ShuttingDown, held));
    }
    let drained = client.await.unwrap().unwrap();
    assert_eq!(drained.leases, 3);
    assert!(drained.took >= Duration::from_millis(300), "{drained:?}");
    // Asked again (a second preStop): still drained, nothing else happens.
    assert_eq!(
        drain_of(s.addr, Duration::from_secs(5))
            .await
            .map(|d| d.leases),
        Ok(3)
    );
    s.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_does_not_finish_says_so() {
    // Still holding at the deadline.
    let s = serve(holding(Phase::ShuttingDown, 2)).await;
    let timed_out = drain_of(s.addr, Duration::from_millis(300)).await;
    assert!(
        matches!(
            timed_out,
            Err(DrainError::TimedOut {
                leases: 2,
                held: 2,
                ..
            })
        ),
        "{timed_out:?}"
    );
    // Stopped with leases it could not hand back.
    s.status.send_replace(holding(Phase::Stopped, 1));
    let stopped = drain_of(s.addr, Duration::from_secs(5)).await;
    assert_eq!(
        stopped,
        Err(DrainError::StoppedHolding { leases: 2, held: 1 })
    );
    // Gone while holding: exited.
    let s = serve(holding(Phase::ShuttingDown, 2)).await;
    let client = tokio::spawn(drain_of(s.addr, Duration::from_secs(30)));
    while !s.handle.is_draining() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.stop.cancel();
    drop(s.status); // the worker is gone: an answer in flight is given at once
    let exited = client.await.unwrap();
    assert_eq!(exited, Err(DrainError::Exited { leases: 2, held: 2 }));
    // Nothing listening.
    let nobody = drain_of(s.addr, Duration::from_secs(1)).await;
    assert!(
        matches!(nobody, Err(DrainError::Unreachable { .. })),
        "{nobody:?}"
    );
}

#[test]
fn answers_are_read_back_and_anything_else_is_refused() {
    let addr: SocketAddr = "127.0.0.1:9090".parse().unwrap();
    let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n\
              {\"state\":\"drained\",\"held\":0,\"held_at_start\":4,\"elapsed_ms\":1500}";
    let answer = parse(addr, ok).unwrap();
    assert_eq!(
        (
            answer.state,
            answer.held,
            answer.held_at_start,
            answer.elapsed
        ),
        (DrainState::Drained, 0, 4, Duration::from_millis(1500))
    );
    let forbidden = "HTTP/1.1 403 Forbidden\r\n\r\nPOST /drain is answered for …\n";
    assert!(matches!(
        parse(addr, forbidden),
        Err(DrainError::Refused { code: 403, .. })
    ));
    let not_found = "HTTP/1.1 404 Not Found\r\n\r\n";
    assert!(matches!(
        parse(addr, not_found),
        Err(DrainError::Refused { code: 404, .. })
    ));
}
