//! The request pool and a half-open database connection. A proxy
//! between the gateway and PostgreSQL stops forwarding (what a crashed host
//! or a dropped NAT entry looks like from the gateway: the connection stays
//! open and nothing answers). A connection that sat idle is pinged before
//! reuse, found dead and replaced; the request fails fast with 503 instead
//! of hanging until its deadline, and the pool heals once the path is back.

use std::time::Duration;

use crate::common::{keyed, Api};
use gateway::{FenceCheck, PoolOptions};
use harness::proxy::{via_proxy, DelayProxy, Mode};
use tokio::time::Instant;

/// The port in `postgres://user@host:PORT/db`.
fn port_of(url: &str) -> u16 {
    let after_host = url.rsplit('@').next().unwrap();
    let port = after_host.split(':').nth(1).unwrap();
    port.split('/').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_half_open_connection_is_found_by_the_idle_check_and_the_request_fails_fast() {
    let url = harness::fresh_database().await;
    let port = port_of(&url);
    let proxy = DelayProxy::start(([127, 0, 0, 1], port).into())
        .await
        .unwrap();
    let idle_check = Duration::from_millis(300);
    let request_timeout = Duration::from_secs(60);
    // Everything the gateway sends PostgreSQL goes through the proxy.
    let gw = gateway::spawn_with_options(
        &via_proxy(&url, port, proxy.port()),
        keyed(FenceCheck::Enforce)
            .pool_size(2)
            .pool_options(PoolOptions {
                check_after_idle: idle_check,
                ping_timeout: Duration::from_millis(500),
                acquire_timeout: Duration::from_secs(3),
                connect_timeout: Duration::from_secs(1),
                ..PoolOptions::default()
            })
            .request_timeout(request_timeout),
    )
    .await
    .unwrap();
    let api = Api::new(gw.url()).as_client("tester");
    api.put_fenced("p", "before", 1).await.expect(201);
    // Busy connections are reused without a ping: a request right after the
    // last one goes through as usual.
    // (A GET without a token is a public read: the read pool's.)
    api.get("p", &[]).await.expect(200);
    assert_eq!(gw.state().reads.idle_connections(), 1);

    // The path to PostgreSQL goes silent, and the idle connection ages past
    // the idle check (the condition under test is the time it sat idle).
    proxy.set_mode(Mode::Hold);
    tokio::time::sleep(idle_check * 2).await;
    let started = Instant::now();
    api.get("p", &[])
        .await
        .expect_error(503, "database_unavailable");
    let took = started.elapsed();
    assert!(
        took < request_timeout / 4,
        "a request on a half-open connection took {took:?}"
    );
    assert_eq!(
        gw.state().reads.idle_connections(),
        0,
        "the dead connection was closed, not put back"
    );

    // The path comes back: the pool opens a new connection by itself.
    proxy.set_mode(Mode::Pass);
    let page = api.get("p", &[]).await.expect(200);
    assert_eq!(page.json["body"], "before");
    api.put_fenced("p", "after", 1).await.expect(200);
    gw.shutdown().await.unwrap();
}

/// Public reads have a pool of their own: with every read connection taken
/// (a flood of readers), reads wait and are refused 503, and writes and
/// fenced reads still land at once on the writers' pool.
#[tokio::test]
async fn readers_holding_every_read_connection_do_not_hold_up_writers() {
    let url = harness::fresh_database().await;
    let gw = gateway::spawn_with_options(
        &url,
        keyed(FenceCheck::Enforce).pool_size(2).read_pool_size(1),
    )
    .await
    .unwrap();
    let api = Api::new(gw.url()).as_client("tester");
    api.put_fenced("p", "text", 1).await.expect(201);

    // The one read connection, held as a stuck reader would.
    let held = gw
        .state()
        .reads
        .acquire()
        .await
        .expect("the read connection");
    let asked = Instant::now();
    let (read, list, history, write) = tokio::join!(
        api.get("p", &[]),
        api.get_path("/pages"),
        api.get_path("/pages/p/history"),
        async {
            let r = api.put_fenced("p", "written meanwhile", 2).await;
            (r, asked.elapsed())
        },
    );
    for reply in [read, list, history] {
        reply.expect(503);
    }
    let (write, took) = write;
    write.expect(200);
    assert!(
        took < Duration::from_secs(2),
        "the write waited {took:?}: it needed a read connection"
    );
    api.get("p", &[("Fencing-Token", "2")]).await.expect(200);

    drop(held);
    assert_eq!(
        api.get("p", &[]).await.expect(200).json["body"],
        "written meanwhile"
    );
}

/// A pool whose connections are all taken queues at most `max_waiting`
/// requests; the rest are answered 503 at once instead of waiting for the
/// acquire timeout in a queue that cannot drain (load shedding).
#[tokio::test]
async fn beyond_the_waiting_requests_a_pool_sheds_load_at_once() {
    let url = harness::fresh_database().await;
    let acquire_timeout = Duration::from_secs(3);
    let gw = gateway::spawn_with_options(
        &url,
        keyed(FenceCheck::Enforce)
            .read_pool_size(1)
            .pool_options(PoolOptions {
                max_waiting: 2,
                acquire_timeout,
                ..PoolOptions::default()
            }),
    )
    .await
    .unwrap();
    let api = Api::new(gw.url()).as_client("tester");
    api.put_fenced("p", "text", 1).await.expect(201);
    let held = gw
        .state()
        .reads
        .acquire()
        .await
        .expect("the read connection");

    let mut readers = Vec::new();
    for _ in 0..8 {
        let api = api.clone();
        readers.push(tokio::spawn(async move {
            let asked = Instant::now();
            let reply = api.get_path("/pages").await;
            (asked.elapsed(), reply)
        }));
    }
    let (mut at_once, mut waited) = (0, 0);
    for r in readers {
        let (took, reply) = r.await.unwrap();
        reply.expect_error(503, "database_unavailable");
        if took < acquire_timeout / 2 {
            at_once += 1;
        } else {
            waited += 1;
        }
    }
    assert_eq!((at_once, waited), (6, 2), "shed at once, and waited");
    drop(held);
    api.get_path("/pages").await.expect(200);
}

/// A server slower to connect to than a request waits (a slow name lookup
/// or handshake; here the proxy holds each new connection's first bytes
/// 800 ms, and a request waits 500 ms) is still reached: the connection
/// being made when its request gave up goes to the idle list, and a later
/// request takes it. When the connection was made in the request's own
/// future, every request cancelled it, and every one got 503.
#[tokio::test]
async fn a_connection_slower_to_make_than_a_request_waits_serves_a_later_one() {
    let url = harness::fresh_database().await;
    let port = port_of(&url);
    let proxy = DelayProxy::start(([127, 0, 0, 1], port).into())
        .await
        .unwrap();
    proxy.delay_setup(Duration::from_millis(800));
    let db = gateway::request_pool(
        &via_proxy(&url, port, proxy.port()),
        PoolOptions {
            acquire_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_secs(5),
            ..PoolOptions::default()
        },
    )
    .unwrap();
    let mut answers = Vec::new();
    for _ in 0..5 {
        let got = db.acquire().await.is_ok();
        answers.push(got);
        if got {
            break;
        }
    }
    assert_eq!(
        answers.first(),
        Some(&false),
        "a new connection takes 800 ms"
    );
    assert_eq!(
        answers.last(),
        Some(&true),
        "a later request takes the connection made meanwhile: {answers:?}"
    );
}
