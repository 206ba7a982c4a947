//! Slow and greedy clients: a client that stalls in the middle of its request
//! line is cut off after the header-read timeout while others are served;
//! connections and dashboard streams beyond their caps, overall or from one
//! address, are refused at once (503 with `Retry-After`), never queued.

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

/// Read a whole HTTP/1.1 answer on `stream` (the gateway closes it after a
/// refusal), within `limit`.
async fn answer_within(mut stream: TcpStream, limit: Duration) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(limit, stream.read_to_end(&mut answer))
        .await
        .unwrap_or_else(|_| panic!("no answer within {limit:?}: the connection hangs"))
        .expect("read the answer");
    String::from_utf8(answer).expect("an HTTP answer")
}

/// A connection to `addr` from the loopback address `from` (127.0.0.0/8:
/// each is another client address to the gateway).
async fn connect_from(from: &str, addr: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(format!("{from}:0").parse().unwrap())
        .expect("bind a loopback address");
    socket.connect(addr).await.expect("connect")
}

/// The JSON body of a refusal, after checking its head.
fn refusal(answer: &str, code: &str) -> serde_json::Value {
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("retry-after: 2"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(body["error"], code, "{body}");
    body
}

#[tokio::test]
async fn connections_beyond_the_cap_are_refused_at_once_and_served_again_once_places_free() {
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

    let first = stalled_client(gw.addr()).await;
    let second = stalled_client(gw.addr()).await;
    wait_open_connections(&gw, 2).await;

    // A third client is answered at once, not left in the listen backlog.
    let asked = Instant::now();
    let mut third = TcpStream::connect(gw.addr()).await.unwrap();
    third
        .write_all(b"GET /pages/p HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = answer_within(third, timeout).await;
    let body = refusal(&answer, "too_many_connections");
    assert_eq!(body["limit"], 2);
    assert_eq!(body["per_address"], false);
    assert!(
        asked.elapsed() < timeout,
        "refused after {:?}",
        asked.elapsed()
    );

    // Once the stalled clients are cut off, clients are served again.
    closed_by_server(first, timeout + SLACK).await;
    closed_by_server(second, timeout + SLACK).await;
    wait_open_connections(&gw, 0).await;
    let api = Api::new(gw.url()).as_client("tester");
    assert_eq!(api.get("p", &[]).await.expect(200).json["body"], "text");
    api.put_fenced("p", "served again", 2).await.expect(200);
}

/// Every connection of the main address taken: a health check there is
/// refused like any request, and a balancer checking there would take the
/// gateway out of rotation. The probe address answers it at once, and
/// serves nothing but the probes.
#[tokio::test]
async fn the_probe_address_answers_while_every_connection_is_taken() {
    let timeout = Duration::from_secs(5);
    let (gw, api, _) = gateway_with(
        keyed(FenceCheck::Enforce)
            .max_connections(2)
            .header_read_timeout(timeout),
    )
    .await;
    drop(api);
    wait_open_connections(&gw, 0).await;
    let probe_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let probes = probe_listener.local_addr().unwrap();
    let options = gateway::server::probe_options(&gateway::ServeOptions::default());
    let serving = tokio::spawn(gateway::server::serve_probes(
        probe_listener,
        gw.state().clone(),
        options,
        std::future::pending(),
    ));
    let _first = stalled_client(gw.addr()).await;
    let _second = stalled_client(gw.addr()).await;
    wait_open_connections(&gw, 2).await;

    let ask = |addr, path: &'static str| async move {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        answer_within(stream, timeout).await
    };
    refusal(&ask(gw.addr(), "/healthz").await, "too_many_connections");
    for path in ["/healthz", "/readyz"] {
        let answer = ask(probes, path).await;
        assert!(answer.starts_with("HTTP/1.1 200 "), "{path}: {answer}");
    }
    let answer = ask(probes, "/pages/p").await;
    assert!(answer.starts_with("HTTP/1.1 404 "), "{answer}");
    assert!(answer.contains("no route for GET /pages/p"), "{answer}");
    serving.abort();
}

#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let timeout = Duration::from_secs(2);
    let (gw, api, _) = gateway_with(
        keyed(FenceCheck::Enforce)
            .max_connections_per_address(2)
            .header_read_timeout(timeout),
    )
    .await;
    api.put_fenced("p", "text", 1).await.expect(201);
    drop(api);
    wait_open_connections(&gw, 0).await;

    let mut greedy = Vec::new();
    for _ in 0..2 {
        let mut c = connect_from("127.0.0.2", gw.addr()).await;
        c.write_all(b"GET /pages/p HT").await.unwrap();
        greedy.push(c);
    }
    wait_open_connections(&gw, 2).await;
    let answer = answer_within(connect_from("127.0.0.2", gw.addr()).await, timeout).await;
    let body = refusal(&answer, "too_many_connections");
    assert_eq!(
        (body["limit"].as_u64(), body["per_address"].as_bool()),
        (Some(2), Some(true))
    );

    // Another address is served meanwhile.
    let mut other = connect_from("127.0.0.3", gw.addr()).await;
    other
        .write_all(b"GET /pages/p HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = answer_within(other, timeout).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
}

/// A GET of the event stream from `from` (a loopback address), answered.
async fn open_stream(gw: &gateway::RunningGateway, from: &str) -> reqwest::Response {
    reqwest::Client::builder()
        .local_address(from.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap()
        .get(format!("{}/dashboard/events?page=p", gw.url()))
        .send()
        .await
        .expect("stream request")
}

#[tokio::test]
async fn streams_beyond_their_caps_are_refused_at_once_while_writes_land() {
    let (gw, api, _) = gateway_with(keyed(FenceCheck::Enforce).max_streams(6, 2)).await;
    api.put_fenced("p", "text", 1).await.expect(201);

    // Far more streams than the caps, from four addresses at once.
    let mut opening = Vec::new();
    for i in 0..40 {
        let gw_url = gw.url();
        let from = format!("127.0.0.{}", 2 + i % 4);
        opening.push(tokio::spawn(async move {
            let asked = Instant::now();
            let response = reqwest::Client::builder()
                .local_address(from.parse::<std::net::IpAddr>().unwrap())
                .build()
                .unwrap()
                .get(format!("{gw_url}/dashboard/events?page=p"))
                .send()
                .await
                .expect("stream request");
            (asked.elapsed(), response)
        }));
    }
    let (mut open, mut refused) = (Vec::new(), Vec::new());
    for o in opening {
        let (took, response) = o.await.unwrap();
        if response.status() == 200 {
            open.push(response);
        } else {
            refused.push((took, response));
        }
    }
    // Two from each of four addresses would be eight: the overall cap wins.
    assert_eq!(open.len(), 6, "streams open");
    assert_eq!(gw.state().streams.open(), 6);
    for (took, response) in refused {
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "2");
        assert!(took < Duration::from_secs(5), "refused after {took:?}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"], "too_many_streams", "{body}");
    }

    // A writer is not held up by the open streams.
    let put = Instant::now();
    api.put_fenced("p", "written under the streams", 2)
        .await
        .expect(200);
    assert!(
        put.elapsed() < Duration::from_secs(2),
        "the PUT took {:?}",
        put.elapsed()
    );

    // A closed stream gives its place back.
    drop(open.pop());
    harness::wait_until(Duration::from_secs(20), || async {
        match open_stream(&gw, "127.0.0.9").await.status().as_u16() {
            200 => Ok(()),
            s => Err(format!("still refused: {s}")),
        }
    })
    .await
    .expect("the freed place is taken");
}

#[tokio::test]
async fn a_client_over_its_write_rate_gets_429_with_the_wait_and_others_write_on() {
    // One a second, so that a loaded machine's slow requests do not earn a
    // new one during the test; bursts of two.
    let (_gw, api, _) = gateway_with(keyed(FenceCheck::Enforce).write_rate(1, 2)).await;
    // The burst: two at once.
    api.put_fenced("p", "one", 1).await.expect(201);
    api.put_fenced("p", "two", 2).await.expect(200);
    let refused = api
        .put_fenced("p", "three", 3)
        .await
        .expect_error(429, "rate_limited");
    assert_eq!(refused.json["per_second"], 1);
    let wait: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(wait, 1, "at most a second, rounded up");
    // Nothing was written, and a fenced read counts too.
    api.get("p", &[("Fencing-Token", "3")])
        .await
        .expect_error(429, "rate_limited");
    assert_eq!(api.get("p", &[]).await.expect(200).json["body"], "two");

    // Another client has its own bucket.
    let other = api.as_client("alice");
    other.put_fenced("q", "alice's", 1).await.expect(201);

    // After the wait, the client writes again.
    tokio::time::sleep(Duration::from_secs(wait)).await;
    api.put_fenced("p", "three", 3).await.expect(200);
}

/// Behind a balancer every connection comes from the balancer's address.
/// HAProxy (`send-proxy-v2`, from 127.0.0.5, which the gateway trusts)
/// names each client in a PROXY header, and the per-address caps count the
/// clients, not the balancer. A connection from the trusted address without
/// a header is closed: it cannot be served as the balancer's.
#[tokio::test]
async fn behind_a_trusted_balancer_the_caps_count_each_client_by_its_proxy_header() {
    let trusted = gateway::proxy_protocol::TrustedProxies::parse("127.0.0.5").unwrap();
    let (gw, api, _) = gateway_with(
        keyed(FenceCheck::Enforce)
            .trusted_proxies(trusted)
            .max_streams(8, 1),
    )
    .await;
    api.put_fenced("p", "text", 1).await.expect(201);
    let balancer =
        harness::Haproxy::start_with_proxy_protocol(&[gw.addr().port()], "127.0.0.5").await;
    balancer
        .wait_up(1, Duration::from_secs(20))
        .await
        .expect("the health checks pass with their PROXY headers");

    let via = |from: &str| {
        let url = format!("{}/dashboard/events?page=p", balancer.url());
        let client = reqwest::Client::builder()
            .local_address(from.parse::<std::net::IpAddr>().unwrap())
            .build()
            .unwrap();
        async move { client.get(url).send().await.expect("stream request") }
    };
    let first = via("127.0.0.2").await;
    assert_eq!(first.status(), 200);
    let second = via("127.0.0.2").await;
    assert_eq!(second.status(), 503, "a second stream from the same client");
    let body: serde_json::Value = second.json().await.unwrap();
    assert_eq!(body["per_address"], true, "{body}");
    let other = via("127.0.0.3").await;
    assert_eq!(
        other.status(),
        200,
        "another client behind the same balancer"
    );

    // The trusted address without a PROXY header: closed, not served.
    let mut bare = connect_from("127.0.0.5", gw.addr()).await;
    bare.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), bare.read_to_end(&mut answer))
        .await
        .expect("closed at once, not left open");
    // Closed with unread bytes, the connection may be reset: closed too.
    if let Err(e) = read {
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    }
    assert!(
        answer.is_empty(),
        "answered without a PROXY header: {}",
        String::from_utf8_lossy(&answer)
    );
    drop((first, other));
}
