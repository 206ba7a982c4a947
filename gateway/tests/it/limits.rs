//! Slow and greedy clients: a client that stalls in the middle of its request
//! line is cut off after the header-read timeout while others are served, and
//! connections beyond the cap wait to be accepted instead of breaking anything.

use std::time::Duration;

use crate::common::{gateway_with, keyed, Api};
use gateway::FenceCheck;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How much later than its timeout a stalled client may be cut off on a
/// loaded machine (hyper's own default timeout, 30 s, would exceed it).
const SLACK: Duration = Duration::from_secs(15);

/// Connect and send half a request line, then nothing.
async fn stalled_client(addr: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(b"GET /pages/p HT").await.expect("write");
    stream
}

/// Wait (bounded) until the server closes `stream`; returns when it did.
async fn closed_by_server(mut stream: TcpStream, limit: Duration) -> Instant {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(limit, stream.read(&mut buf)).await {
            Err(_) => panic!("the server kept a stalled connection open for {limit:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return Instant::now(),
            Ok(Ok(_)) => {} // hyper may answer 408 before closing; read on
        }
    }
}

/// Wait (bounded) until the gateway serves exactly `n` connections.
async fn wait_open_connections(gw: &gateway::RunningGateway, n: i64) {
    harness::wait_until(Duration::from_secs(20), || async {
        let open = gw.state().metrics.open_connections();
        if open == n {
            Ok(())
        } else {
            Err(format!("{open} open connections, waiting for {n}"))
        }
    })
    .await
    .expect("connections accepted");
}

#[tokio::test]
async fn a_stalled_client_is_cut_off_after_the_header_timeout_while_others_are_served() {
    let timeout = Duration::from_secs(2);
    let (gw, api, _) = gateway_with(keyed(FenceCheck::Enforce).header_read_timeout(timeout)).await;
    api.put_fenced("p", "text", 1).await.expect(201);

    let started = Instant::now();
    let stalled = stalled_client(gw.addr()).await;
    wait_open_connections(&gw, 1).await;
    let cut = tokio::spawn(closed_by_server(stalled, timeout + SLACK));

    // Meanwhile, normal requests are served, on fresh connections each.
    let mut served = 0;
    while !cut.is_finished() {
        let fresh = Api::new(gw.url()).as_client("tester");
        fresh.get("p", &[]).await.expect(200);
        served += 1;
    }
    let cut_at = cut.await.unwrap();
    assert!(
        cut_at - started >= timeout,
        "cut off after {:?}, before the {timeout:?} timeout",
        cut_at - started
    );
    assert!(served > 0, "no request was served while the client stalled");
    api.put_fenced("p", "still fine", 2).await.expect(200);
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_to_be_accepted_and_are_then_served() {
    let timeout = Duration::from_secs(2);
    let (gw, api, _) = gateway_with(
        keyed(FenceCheck::Enforce)
            .max_connections(2)
            .header_read_timeout(timeout),
    )
    .await;
    api.put_fenced("p", "text", 1).await.expect(201);
    // The client's pooled keep-alive connection would hold one of the two
    // places; this test wants both taken by stalled clients.
    drop(api);
    wait_open_connections(&gw, 0).await;

    // Neither stalled client can be cut off before `timeout` after this.
    let stalled_at = Instant::now();
    let first = stalled_client(gw.addr()).await;
    let second = stalled_client(gw.addr()).await;
    wait_open_connections(&gw, 2).await;

    // A third client: the kernel completes its connection (the listen
    // backlog), but the gateway does not accept it while the cap is reached.
    let waiting = tokio::spawn({
        let api = Api::new(gw.url()).as_client("tester");
        async move {
            let reply = api.get("p", &[]).await.expect(200);
            (Instant::now(), reply.json["body"].clone())
        }
    });
    let first = tokio::spawn(closed_by_server(first, timeout + SLACK));
    let second = tokio::spawn(closed_by_server(second, timeout + SLACK));
    let (served_at, body) = waiting.await.unwrap();
    assert_eq!(body, "text");
    assert!(
        served_at - stalled_at >= timeout,
        "the third connection was served after {:?}, before a stalled one could be cut off",
        served_at - stalled_at
    );
    first.await.unwrap();
    second.await.unwrap();

    // Many more clients than places: all are served, in turn.
    let mut clients = Vec::new();
    for i in 0..12 {
        let api = Api::new(gw.url()).as_client("tester");
        clients.push(tokio::spawn(async move {
            api.put_fenced("p", &format!("client {i}"), 1)
                .await
                .status
                .as_u16()
        }));
    }
    for c in clients {
        assert_eq!(c.await.unwrap(), 200);
    }
    assert!(gw.state().metrics.open_connections() <= 2);
}
