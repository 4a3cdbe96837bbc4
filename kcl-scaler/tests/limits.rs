//! The scaler's server bounds what clients can hold, over real connections: streams past the
//! most are refused with RESOURCE_EXHAUSTED, and a full server makes room by closing its
//! oldest idle connection, refusing a new one only when every connection has a call in flight.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use kcl_core::{FleetSignals, Status};
use kcl_scaler::proto::external_scaler_client::ExternalScalerClient;
use kcl_scaler::proto::{IsActiveResponse, ScaledObjectRef};
use kcl_scaler::{Limits, ScalerError};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;

type Client = ExternalScalerClient<Channel>;

fn figures(arrival: f64) -> Status {
    let line = format!("v1 3 8 0 0 {arrival:.3} 0 0 0 2 2");
    let mut status = Status::default();
    status.fleet = Some(FleetSignals::decode(&line).unwrap());
    status
}

fn object() -> ScaledObjectRef {
    ScaledObjectRef {
        name: "kcl".into(),
        namespace: "default".into(),
        scaler_metadata: Default::default(),
    }
}

struct Served {
    addr: SocketAddr,
    status: watch::Sender<Status>,
    stop: CancellationToken,
    task: JoinHandle<Result<(), ScalerError>>,
}

async fn serve(limits: Option<Limits>) -> Served {
    let listener = kcl_scaler::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (status, rx) = watch::channel(figures(1.0));
    let stop = CancellationToken::new();
    let task = match limits {
        None => tokio::spawn(kcl_scaler::serve(listener, rx, stop.clone())),
        Some(limits) => tokio::spawn(kcl_scaler::serve_with(listener, rx, stop.clone(), limits)),
    };
    Served {
        addr,
        status,
        stop,
        task,
    }
}

/// A client on a connection of its own.
async fn client(addr: SocketAddr) -> Client {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    ExternalScalerClient::new(channel)
}

/// A `StreamIsActive` stream, open (its first answer read), or the code it was refused with.
async fn open(client: &mut Client) -> Result<tonic::Streaming<IsActiveResponse>, Code> {
    let mut stream = client
        .stream_is_active(object())
        .await
        .map_err(|e| e.code())?
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "{first:?}");
    Ok(stream)
}

/// Whether a raw connection is closed by the server within a second (it reads EOF or an error).
async fn closed(conn: &mut tokio::net::TcpStream) -> bool {
    let mut byte = [0u8; 64];
    loop {
        match tokio::time::timeout(Duration::from_secs(1), conn.read(&mut byte)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // The server's HTTP/2 settings: read on.
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_most_streams_the_next_is_refused_with_resource_exhausted() {
    let s = serve(None).await;
    let most = Limits::default().max_streams;
    // Over several connections (each carries at most 16 calls at once).
    let mut clients = Vec::new();
    for _ in 0..most.div_ceil(10) + 1 {
        clients.push(client(s.addr).await);
    }
    let mut open_streams = Vec::new();
    let mut refused = Vec::new();
    for i in 0..=most {
        let c = &mut clients[i / 10];
        match open(c).await {
            Ok(stream) => open_streams.push(stream),
            Err(code) => refused.push((i, code)),
        }
    }
    assert_eq!(open_streams.len(), most, "refused: {refused:?}");
    assert_eq!(refused, vec![(most, Code::ResourceExhausted)]);
    // One ends: another opens.
    drop(open_streams.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let last = clients.len() - 1;
    assert!(open(&mut clients[last]).await.is_ok());
    // The streams still open follow the figures.
    s.status.send_replace(figures(0.0));
    let next = tokio::time::timeout(Duration::from_secs(5), open_streams[0].message()).await;
    assert_eq!(
        next.ok().and_then(Result::ok).flatten().map(|r| r.result),
        Some(false)
    );
    s.stop.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(5), s.task).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_closes_its_oldest_idle_connection_for_a_new_one() {
    let limits = Limits {
        max_connections: 2,
        ..Limits::default()
    };
    let s = serve(Some(limits)).await;
    // An idle connection (it never even says hello), then one holding a stream.
    let mut idle = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut holding = client(s.addr).await;
    let mut stream = open(&mut holding).await.unwrap();
    assert!(
        !closed(&mut idle).await,
        "closed before the server was full"
    );

    // A third: the idle one is closed for it; the stream carries on.
    let mut third = client(s.addr).await;
    let answer = third
        .is_active(object())
        .await
        .map(|r| r.into_inner().result);
    assert_eq!(answer.map_err(|e| e.code()), Ok(true));
    assert!(closed(&mut idle).await, "the idle connection is still open");
    s.status.send_replace(figures(0.0));
    let next = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
    assert_eq!(
        next.ok().and_then(Result::ok).flatten().map(|r| r.result),
        Some(false)
    );

    // Both connections with a call in flight: a new one is refused (closed at once).
    let _also_holding = open(&mut third).await.unwrap();
    let mut refused = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    assert!(
        closed(&mut refused).await,
        "a connection past the most was kept"
    );
    s.stop.cancel();
}
