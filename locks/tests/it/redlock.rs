//! Redlock against real redis-server processes: the algorithm's guarantees,
//! and reproducible demonstrations of where it breaks (two clients holding a
//! valid grant at once) and of the mitigations the Redlock page proposes.
//!
//! Leases in the demonstrations are taken with `auto_renew(false)`: the first
//! client does what a client inside a long GC pause does, trust the validity it
//! was given. TTLs are a few seconds so the suite stays fast; the "two holders"
//! demonstrations never wait for a TTL.
//!
//! The masters have ACL users: the clients log in as the lock client's user
//! (`worker`), the tests look at the keys as `admin`.

use std::time::Duration;

use fencelock::redlock::{drift_of, key_of, Redlock, ISSUER};
use fencelock::{AcquireOptions, Fencing, Lease, LockError, LockService};
use harness::{free_port, wait_until, Persistence, Redis};
use tokio::time::Instant;

use crate::support::redis::{query, raw, ADMIN, WORKER};
use crate::support::{assert_timeout, held, held_with};

/// Per-node timeout used by these tests: well below every TTL here, and well
/// above a local reply even on a loaded 2-core machine.
const NODE_TIMEOUT: Duration = Duration::from_millis(100);

async fn start_nodes(n: usize, persistence: Persistence) -> Vec<Redis> {
    let mut nodes = Vec::with_capacity(n);
    for _ in 0..n {
        nodes.push(Redis::start_with_acl(persistence).await);
    }
    nodes
}

/// The nodes' URLs as the lock client's user.
fn urls(nodes: &[Redis]) -> Vec<String> {
    nodes.iter().map(|n| n.url_as(WORKER)).collect()
}

async fn client(urls: &[String]) -> Redlock {
    Redlock::connect(urls)
        .await
        .expect("connect to a majority")
        .with_node_timeout(NODE_TIMEOUT)
        .expect("node timeout")
}

/// Which client holds the lock on each node: 1, 2, or 0 for nobody (or no
/// answer). Asked through `c2`, whose connections are the freshest.
async fn map_of_holders(c1: &Redlock, c2: &Redlock, name: &str) -> Vec<u8> {
    c2.holders_on_nodes(name)
        .await
        .into_iter()
        .map(|h| match h {
            Some(o) if c1.owns(&o) => 1,
            Some(o) if c2.owns(&o) => 2,
            Some(_) => 9,
            None => 0,
        })
        .collect()
}

#[track_caller]
fn assert_still_believes_it_holds(lease: &Lease) {
    assert_eq!(
        lease.lost_reason(),
        None,
        "the first client's lease is lost"
    );
    assert!(
        lease.remaining().is_some_and(|r| r > Duration::ZERO),
        "the first client's lease has no validity left: {lease:?}"
    );
}

/// The arrangement of Kleppmann's example: five nodes, D and E unreachable
/// (down) while client 1 acquires, so client 1 holds a bare majority A, B, C.
async fn client_one_holds_a_bare_majority(
    nodes: &mut [Redis],
    name: &str,
    ttl: Duration,
) -> (Redlock, Lease) {
    nodes[3].kill();
    nodes[4].kill();
    let c1 = client(&urls(nodes)).await;
    // Client 1 gets A, B, C.
    let lease = held_with(&c1, name, AcquireOptions::new(ttl).auto_renew(false)).await;
    (c1, lease)
}

/// `c`'s grant of `name`, taken at once, how long it took, and the validity
/// it came with.
async fn timed_grant(c: &Redlock, name: &str, ttl: Duration) -> (Lease, Duration, Duration) {
    let started = Instant::now();
    let lease = held(c, name, ttl).await;
    let took = started.elapsed();
    let remaining = lease.remaining().expect("bounded");
    (lease, took, remaining)
}

/// D and E are reachable again (C as the test left it): a second client
/// connects and asks for `name` (no watchdog), for a second at most.
async fn a_second_client_asks(
    nodes: &mut [Redis],
    name: &str,
    ttl: Duration,
) -> (Redlock, Result<Lease, LockError>) {
    nodes[3].start_again().await;
    nodes[4].start_again().await;
    let c2 = client(&urls(nodes)).await;
    let second = c2.acquire_with(name, for_a_second(ttl)).await;
    (c2, second)
}

/// A second client's request: `ttl`, no watchdog, waiting a second at most.
fn for_a_second(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new(ttl)
        .auto_renew(false)
        .wait(Duration::from_secs(1))
}

/// Two clients hold a valid grant of `name` at once: client 1 on A and B,
/// client 2 on C, D and E (a majority).
async fn assert_two_holders(c1: &Redlock, c2: &Redlock, leases: [&Lease; 2], name: &str) {
    for lease in leases {
        assert_still_believes_it_holds(lease);
    }
    assert_eq!(map_of_holders(c1, c2, name).await, vec![1, 1, 2, 2, 2]);
}

#[tokio::test]
async fn connect_refuses_fewer_than_three_nodes_and_bad_urls() {
    let two = vec!["redis://127.0.0.1:1/".to_string(); 2];
    assert!(matches!(
        Redlock::connect(&two).await,
        Err(LockError::InvalidConfig(_))
    ));
    let bad = vec![
        "redis://127.0.0.1:1/".to_string(),
        "http://not-redis/".to_string(),
        "redis://127.0.0.1:2/".to_string(),
    ];
    assert!(matches!(
        Redlock::connect(&bad).await,
        Err(LockError::InvalidConfig(_))
    ));
}

#[tokio::test]
async fn connect_needs_a_majority_but_tolerates_a_minority_down() {
    let nodes = start_nodes(3, Persistence::None).await;
    let down = || format!("redis://127.0.0.1:{}/", free_port());

    let minority_down = vec![nodes[0].url_as(WORKER), nodes[1].url_as(WORKER), down()];
    let c = client(&minority_down).await;
    // Two of three nodes grant.
    let options = AcquireOptions::new(Duration::from_secs(2)).wait(Duration::from_secs(1));
    let lease = held_with(&c, "minority-down", options).await;
    lease.release().await.expect("release");

    let majority_down = vec![nodes[0].url_as(WORKER), down(), down()];
    match Redlock::connect(&majority_down).await {
        Err(LockError::Unavailable { service, .. }) => assert_eq!(service, ISSUER),
        other => panic!("expected Unavailable, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn lease_is_unfenced_and_excludes_a_second_client() {
    let nodes = start_nodes(3, Persistence::None).await;
    let (c1, c2) = (client(&urls(&nodes)).await, client(&urls(&nodes)).await);
    let ttl = Duration::from_secs(2);

    let lease = held(&c1, "excl", ttl).await;
    assert_eq!(lease.issuer(), "redlock");
    assert_eq!(lease.token(), None);
    assert!(matches!(lease.fencing(), Fencing::Unfenced { reason } if reason.contains("counter")));
    assert_eq!(map_of_holders(&c1, &c2, "excl").await, vec![1, 1, 1]);

    match c2.acquire("excl", ttl, Duration::from_millis(300)).await {
        Err(LockError::Timeout { name, .. }) => assert_eq!(name, "excl"),
        other => panic!("second client must wait, got {other:?}"),
    }
    // Its failed attempts left nothing behind.
    assert_eq!(map_of_holders(&c1, &c2, "excl").await, vec![1, 1, 1]);

    lease.release().await.expect("release");
    assert_eq!(map_of_holders(&c1, &c2, "excl").await, vec![0, 0, 0]);
    let second = held(&c2, "excl", ttl).await; // free again
    assert_eq!(map_of_holders(&c1, &c2, "excl").await, vec![2, 2, 2]);
    second.release().await.expect("release");
}

#[tokio::test]
async fn failed_acquisition_releases_the_nodes_it_took() {
    let nodes = start_nodes(3, Persistence::None).await;
    let c = client(&urls(&nodes)).await;
    let key = key_of("partial");
    for node in &nodes[1..] {
        let _: () = query(
            &mut raw(&node.url_as(ADMIN)).await,
            redis::cmd("SET")
                .arg(&key)
                .arg("someone-else")
                .arg("PX")
                .arg(10_000),
        )
        .await;
    }

    let attempt = c
        .acquire("partial", Duration::from_secs(2), Duration::ZERO)
        .await;
    assert_timeout(attempt, "no majority");
    assert_eq!(
        c.holders_on_nodes("partial").await,
        vec![
            None,
            Some("someone-else".into()),
            Some("someone-else".into())
        ],
        "the node it took alone must be released"
    );
}

#[tokio::test]
async fn renewal_extends_on_a_majority_and_refusal_loses_the_lease() {
    let nodes = start_nodes(3, Persistence::None).await;
    let c = client(&urls(&nodes)).await;
    let ttl = Duration::from_millis(1500);
    let lease = held_with(&c, "renew", AcquireOptions::new(ttl).auto_renew(false)).await;

    let validity = lease.renew().await.expect("renew while held");
    assert!(validity <= ttl - drift_of(ttl), "{validity:?}");
    let pttl: i64 = query(
        &mut raw(&nodes[0].url_as(ADMIN)).await,
        redis::cmd("PTTL").arg(key_of("renew")),
    )
    .await;
    assert!(pttl > 1000, "extended to the full TTL again: {pttl} ms");

    // Somebody else's key on a majority: the next renewal is refused.
    for node in &nodes[..2] {
        let _: () = query(
            &mut raw(&node.url_as(ADMIN)).await,
            redis::cmd("SET").arg(key_of("renew")).arg("thief"),
        )
        .await;
    }
    match lease.renew().await {
        Err(LockError::NotHeld { name, .. }) => assert_eq!(name, "renew"),
        other => panic!("expected NotHeld, got {other:?}"),
    }
    assert!(lease.is_lost());
    // A late release does not free the other owner's keys.
    lease.release().await.expect("release");
    assert_eq!(
        c.holders_on_nodes("renew").await[..2],
        [Some("thief".into()), Some("thief".into())]
    );
}

/// Keeps a node busy for `micros` (a Lua loop: Redis runs one script at a
/// time, so every other request to the node waits behind it).
const BUSY_SCRIPT: &str = "local s = redis.call('TIME') \
    local t0 = s[1] * 1000000 + s[2] \
    while true do \
      local n = redis.call('TIME') \
      if n[1] * 1000000 + n[2] - t0 >= tonumber(ARGV[1]) then return 1 end \
    end";

/// Demonstration 4, and the flaw found in an existing crate: a frozen minority
/// (SIGSTOP, sockets open, no answers) neither fails nor stalls a grant that
/// the majority can give, and the validity is counted down by the time the
/// grant took.
#[tokio::test]
async fn minority_partition_still_grants_with_validity_reduced_by_the_wait() {
    let mut nodes = start_nodes(5, Persistence::None).await;
    let ttl = Duration::from_secs(3);
    let drift = drift_of(ttl);
    let slow_timeout = Duration::from_millis(600);
    let c = Redlock::connect(&urls(&nodes))
        .await
        .expect("connect")
        .with_node_timeout(slow_timeout)
        .expect("node timeout");
    nodes[3].process().pause();
    nodes[4].process().pause();

    // D and E are frozen: A, B, C answer at once and decide the round (three
    // of five still grant).
    let (lease, took, remaining) = timed_grant(&c, "partitioned", ttl).await;
    assert!(
        took < slow_timeout,
        "the frozen minority must not set the pace: {took:?}"
    );
    // `took` is measured around the call, the lease counts from inside it:
    // allow a millisecond of bookkeeping between the two measurements.
    let slack = Duration::from_millis(1);
    assert!(
        remaining <= ttl - took - drift + slack,
        "{remaining:?} after {took:?}"
    );
    let holders = c.holders_on_nodes("partitioned").await;
    assert!(holders[..3]
        .iter()
        .all(|h| h.as_deref().is_some_and(|o| c.owns(o))));
    assert_eq!(holders[3..], [None, None], "frozen nodes answer nothing");
    lease.renew().await.expect("a majority extends");
    lease.release().await.expect("release");

    // Now C, the third vote, is slow too (busy for 300 ms): the grant has to
    // wait for it, and the validity shrinks by that wait.
    let busy = Duration::from_millis(300);
    let mut on_c = raw(&nodes[2].url_as(ADMIN)).await;
    let hog = tokio::spawn(async move {
        redis::cmd("EVAL")
            .arg(BUSY_SCRIPT)
            .arg(0)
            .arg(busy.as_micros() as u64)
            .query_async::<i64>(&mut on_c)
            .await
    });
    tokio::time::sleep(Duration::from_millis(20)).await; // let the script start
                                                         // A, B and the slow C still grant within the node timeout.
    let (lease, took, remaining) = timed_grant(&c, "partitioned", ttl).await;
    assert!(took >= busy / 2, "waited for C: {took:?}");
    assert!(
        remaining <= ttl - took - drift + slack,
        "validity must drop by the time spent waiting: {remaining:?} after {took:?}"
    );
    assert!(remaining < ttl - busy / 2 - drift, "{remaining:?}");
    hog.await.expect("join").expect("busy script");

    // Release is bounded by the node timeout, frozen nodes or not.
    let started = Instant::now();
    lease.release().await.expect("release");
    assert!(
        started.elapsed() < slow_timeout + Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    nodes[3].process().resume();
    nodes[4].process().resume();
}

/// Demonstration 1 (Kleppmann's example): a node that held the lock crashes
/// and restarts empty; a second client then gets a majority while the first
/// still holds a valid lease.
#[tokio::test]
async fn two_holders_after_node_restart_without_persistence() {
    let mut nodes = start_nodes(5, Persistence::None).await;
    let ttl = Duration::from_secs(5);
    let (c1, first) = client_one_holds_a_bare_majority(&mut nodes, "restart", ttl).await;

    nodes[2].restart().await; // C crashes and comes back without the key
    let (c2, second) = a_second_client_asks(&mut nodes, "restart", ttl).await;
    let second = second.expect("the second client gets C, D, E: a majority");
    assert_two_holders(&c1, &c2, [&first, &second], "restart").await;
    // The first client learns only when it next tries to extend.
    let renewal = first.renew().await;
    assert!(
        matches!(renewal, Err(LockError::NotHeld { .. })),
        "{renewal:?}"
    );
}

/// Demonstration 2: a clock jump on one node expires the key there early.
/// libfaketime cannot run Debian's redis-server (a jemalloc clash), so the
/// jump is simulated by what it causes: `PEXPIRE key 1` on node C, as if C's
/// clock had leapt past the key's expiry.
#[tokio::test]
async fn two_holders_after_clock_jump_on_one_node() {
    let mut nodes = start_nodes(5, Persistence::None).await;
    let ttl = Duration::from_secs(5);
    let (c1, first) = client_one_holds_a_bare_majority(&mut nodes, "jump", ttl).await;

    let mut on_c = raw(&nodes[2].url_as(ADMIN)).await;
    let expired: i64 = query(&mut on_c, redis::cmd("PEXPIRE").arg(key_of("jump")).arg(1)).await;
    assert_eq!(expired, 1, "C held client 1's key");
    wait_until(Duration::from_secs(2), || {
        let mut on_c = on_c.clone();
        async move {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(key_of("jump"))
                .query_async(&mut on_c)
                .await
                .map_err(|e| e.to_string())?;
            if exists == 0 {
                Ok(())
            } else {
                Err("key still on C".to_string())
            }
        }
    })
    .await
    .expect("the key expired on C");

    let (c2, second) = a_second_client_asks(&mut nodes, "jump", ttl).await;
    let second = second.expect("the second client gets C, D, E: a majority");
    assert_two_holders(&c1, &c2, [&first, &second], "jump").await;
}

/// Mitigation 1 of demonstration 1: the crashed node stays down longer than
/// the maximum TTL, so every key it held has expired everywhere before it
/// counts again.
#[tokio::test]
async fn delayed_restart_past_the_ttl_prevents_two_holders() {
    let mut nodes = start_nodes(5, Persistence::None).await;
    let ttl = Duration::from_millis(1500);
    let (c1, first) = client_one_holds_a_bare_majority(&mut nodes, "delayed", ttl).await;

    nodes[2].kill();
    let crashed_at = Instant::now();
    nodes[3].start_again().await;
    nodes[4].start_again().await;
    let c2 = client(&urls(&nodes)).await;

    // For all of the first lease's validity the second client keeps trying.
    assert_still_believes_it_holds(&first);
    let during = first
        .remaining()
        .expect("bounded")
        .saturating_sub(Duration::from_millis(100));
    assert!(
        during > Duration::from_millis(300),
        "setup too slow, nothing left to show: {during:?}"
    );
    let attempt = c2
        .acquire_with(
            "delayed",
            AcquireOptions::new(ttl).auto_renew(false).wait(during),
        )
        .await;
    assert!(
        matches!(attempt, Err(LockError::Timeout { .. })),
        "no majority while the first client holds: {attempt:?} (holders {:?})",
        map_of_holders(&c1, &c2, "delayed").await
    );

    // The delayed restart: C stays out for longer than the maximum TTL.
    tokio::time::sleep_until(crashed_at + ttl + Duration::from_millis(200)).await;
    nodes[2].start_again().await;
    let second = c2
        .acquire_with("delayed", for_a_second(ttl))
        .await
        .expect("free once the first grant expired");
    assert!(first.is_lost(), "granted only after the first lease ended");
    second.release().await.expect("release");
}

/// Mitigation 2 of demonstration 1: with `appendfsync always` the crashed node
/// comes back with the key, so the second client gets no majority.
#[tokio::test]
async fn appendfsync_always_prevents_two_holders_after_restart() {
    let mut nodes = start_nodes(5, Persistence::AofAlways).await;
    let ttl = Duration::from_secs(5);
    let (c1, first) = client_one_holds_a_bare_majority(&mut nodes, "aof", ttl).await;

    nodes[2].restart().await;
    nodes[3].start_again().await;
    nodes[4].start_again().await;
    let c2 = client(&urls(&nodes)).await;
    assert_eq!(map_of_holders(&c1, &c2, "aof").await, vec![1, 1, 1, 0, 0]);

    let attempt = c2.acquire_with("aof", for_a_second(ttl)).await;
    assert_timeout(attempt, "no majority");
    assert_still_believes_it_holds(&first);
    assert_eq!(map_of_holders(&c1, &c2, "aof").await, vec![1, 1, 1, 0, 0]);
}
