//! What a Redis lock client can write that Redis cannot stop (the lock's
//! own keys: a script runs with its caller's rights), and what the gateway
//! does with it: a holder hash planted with a huge token, a counter pushed
//! near 2^63. Redis runs with ACL users: the locks log in as `worker`, the
//! forger is a worker too, the gateway's issuer as `gateway`, repairs as
//! `admin`. Each refusal is 409 `suspected_forgery` with one history row,
//! nothing else written and the fence unmoved; honest writers go on once
//! an admin repairs the keys.

use std::time::Duration;

use fencelock::lease_table::LeaseTable;
use fencelock::redis::{fence_key, lock_key, RedisLock};
use fencelock::redis_sentinel::RedisSentinelLock;
use fencelock::zookeeper::ZooKeeperLock;
use fencelock::{Lease, LockError, LockService};
use gateway::{FenceCheck, GatewayOptions, RunningGateway};
use harness::redis_acl::{userinfo, ADMIN, GATEWAY, WORKER};
use harness::{Persistence, Redis, SentinelGroup};
use redis::aio::MultiplexedConnection;
use serde_json::{json, Value};

use crate::common::{gateway_with, keyed, Api, Reply};

const PAGE: &str = "forged";
const LOCK: &str = "page:forged";
const TTL: Duration = Duration::from_secs(30);
const BIGGEST: u64 = i64::MAX as u64;

/// A Redis server with ACL users, a gateway checking its tokens as the
/// `gateway` user, and the API as `client`.
struct Setup {
    redis: Redis,
    _gw: RunningGateway,
    api: Api,
}

impl Setup {
    async fn start(options: GatewayOptions) -> Setup {
        let redis = Redis::start_with_acl(Persistence::None).await;
        let options = options
            .issuer("redis", &redis.url_as(GATEWAY.name))
            .issuer_timeout(Duration::from_secs(5));
        let (gw, api, _) = gateway_with(options).await;
        Setup {
            redis,
            _gw: gw,
            api,
        }
    }

    /// The lock service of `client`, as the worker takes it.
    async fn locks(&self, client: &str) -> RedisLock {
        RedisLock::connect(&self.redis.url_as(WORKER.name))
            .await
            .unwrap()
            .with_client_id(client)
            .unwrap()
    }

    /// A plain connection as ACL user `user`.
    async fn raw(&self, user: &str) -> MultiplexedConnection {
        redis::Client::open(self.redis.url_as(user))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

async fn run(conn: &mut MultiplexedConnection, cmd: &mut redis::Cmd) {
    let _: redis::Value = cmd.query_async(conn).await.expect("the command runs");
}

/// `SET fence:{page:forged} value` as the user of `conn`.
async fn set_counter(conn: &mut MultiplexedConnection, value: impl redis::ToRedisArgs) {
    run(conn, redis::cmd("SET").arg(fence_key(LOCK)).arg(value)).await;
}

/// `client`'s PUT (`Some(body)`) or fenced GET of [`PAGE`] with `token`.
async fn send(api: &Api, client: &str, token: u64, body: Option<&str>) -> Reply {
    let api = api.as_client(client);
    let token = token.to_string();
    let headers = [
        ("Fencing-Token", token.as_str()),
        ("Fencing-Issuer", "redis"),
    ];
    match body {
        Some(body) => api.put(PAGE, body, &headers).await,
        None => api.get(PAGE, &headers).await,
    }
}

/// `reply` is a suspected forgery of `token`, and left one history row
/// (by `client`, `method`) on top of `before`, nothing else.
#[track_caller]
fn assert_suspected<'a>(
    api: &'a Api,
    reply: Reply,
    token: u64,
    before: &'a (Option<Value>, Vec<Value>),
    client: &'a str,
    method: &'a str,
) -> impl std::future::Future<Output = Value> + 'a {
    let caller = std::panic::Location::caller();
    async move {
        let reply = reply.expect_error(409, "suspected_forgery");
        assert_eq!(
            reply.json["offered_token"], token,
            "{caller}: {}",
            reply.json
        );
        let (page, history) = api.snapshot(PAGE).await;
        assert_eq!(page, before.0, "{caller}: the page changed");
        assert_eq!(history.len(), before.1.len() + 1, "{caller}: {history:?}");
        assert_eq!(&history[1..], &before.1[..], "{caller}");
        let row = &history[0];
        assert_eq!(
            (
                &row["outcome"],
                &row["method"],
                &row["token"],
                &row["client_id"]
            ),
            (
                &json!("suspected_forgery"),
                &json!(method),
                &json!(token),
                &json!(client)
            ),
            "{caller}: {row}"
        );
        let fence = before
            .0
            .as_ref()
            .map_or(json!(null), |p| p["fence"]["token"].clone());
        assert_eq!(
            row["fence_token"], fence,
            "{caller}: the fence moved: {row}"
        );
        reply.json
    }
}

async fn acquire(locks: &RedisLock) -> Lease {
    locks
        .acquire(LOCK, TTL, Duration::from_secs(10))
        .await
        .unwrap()
}

/// `locks`' grant, and its token, after a worker set the lock's counter to
/// `counter` by hand.
async fn grant_after(
    forger: &mut MultiplexedConnection,
    locks: &RedisLock,
    counter: u64,
) -> (Lease, u64) {
    set_counter(forger, counter).await;
    let lease = acquire(locks).await;
    let token = lease.token().unwrap().get();
    (lease, token)
}

#[tokio::test]
async fn a_holder_hash_planted_with_the_largest_token_is_refused_and_honest_writers_go_on() {
    let s = Setup::start(keyed(FenceCheck::Enforce)).await;
    let alice = s.locks("alice").await;
    let lease = acquire(&alice).await;
    send(&s.api, "alice", 1, Some("by alice")).await.expect(201);
    lease.release().await.unwrap();

    // Alice's worker credentials write a holder hash by hand, in her name.
    let mut forger = s.raw(WORKER.name).await;
    run(
        &mut forger,
        redis::cmd("HSET")
            .arg(lock_key(LOCK))
            .arg("token")
            .arg(BIGGEST)
            .arg("owner")
            .arg("x alice"),
    )
    .await;
    let before = s.api.snapshot(PAGE).await;
    let reply = send(&s.api, "alice", BIGGEST, Some("forged")).await;
    let body = assert_suspected(&s.api, reply, BIGGEST, &before, "alice", "PUT").await;
    assert_eq!(body["minted_token"], 1, "{body}");
    assert_eq!(body["current_token"], 1, "{body}");
    let before = s.api.snapshot(PAGE).await;
    let reply = send(&s.api, "alice", BIGGEST, None).await;
    assert_suspected(&s.api, reply, BIGGEST, &before, "alice", "GET").await;

    // The planted hash never expires: the lock is stuck (what a lock
    // client can break) until an admin deletes it; then Bob goes on.
    let bob = s.locks("bob").await;
    let stuck = bob.acquire(LOCK, TTL, Duration::ZERO).await;
    assert!(matches!(stuck, Err(LockError::Timeout { .. })), "{stuck:?}");
    run(
        &mut s.raw(ADMIN.name).await,
        redis::cmd("DEL").arg(lock_key(LOCK)),
    )
    .await;
    let lease = acquire(&bob).await;
    assert_eq!(lease.token().unwrap().get(), 2);
    send(&s.api, "bob", 2, Some("by bob")).await.expect(200);
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_counter_planted_near_the_top_cannot_move_the_fence_and_breaks_only_that_lock() {
    let s = Setup::start(keyed(FenceCheck::Enforce)).await;
    let alice = s.locks("alice").await;
    let lease = acquire(&alice).await;
    send(&s.api, "alice", 1, Some("by alice")).await.expect(201);
    lease.release().await.unwrap();

    let mut forger = s.raw(WORKER.name).await;
    let planted = BIGGEST - 1;
    set_counter(&mut forger, planted).await;
    // Bob's next grant is honest, and mints 2^63-1: the jump is refused.
    let bob = s.locks("bob").await;
    let lease = acquire(&bob).await;
    assert_eq!(lease.token().unwrap().get(), BIGGEST);
    let before = s.api.snapshot(PAGE).await;
    let reply = send(&s.api, "bob", BIGGEST, Some("jumped")).await;
    let body = assert_suspected(&s.api, reply, BIGGEST, &before, "bob", "PUT").await;
    assert_eq!(body["minted_token"], BIGGEST, "{body}");
    lease.release().await.unwrap();

    // The counter at its top: that lock cannot be granted any more, with
    // an error that says why; the other locks are not affected.
    match bob.acquire(LOCK, TTL, Duration::ZERO).await {
        Err(LockError::Protocol { detail, .. }) => {
            assert!(detail.contains("cannot mint another token"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
    bob.acquire("page:other", TTL, Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // An admin repairs the counter (to the page's fence): honest writers
    // are back, the fence moved by nothing but honest grants.
    set_counter(&mut s.raw(ADMIN.name).await, 1).await;
    let lease = acquire(&alice).await;
    assert_eq!(lease.token().unwrap().get(), 2);
    let page = send(&s.api, "alice", 2, Some("after the repair"))
        .await
        .expect(200);
    assert_eq!(page.json["fence"]["token"], 2);
    lease.release().await.unwrap();
}

/// The bound, exactly: a counter raised by hand moves the fence by at
/// most `GATEWAY_MAX_TOKEN_JUMP` per write; further is refused until an
/// admin accepts the jump by setting the page's fence.
#[tokio::test]
async fn a_jump_is_accepted_up_to_the_bound_and_beyond_it_once_an_admin_sets_the_fence() {
    let s = Setup::start(keyed(FenceCheck::Enforce).max_token_jump(1000)).await;
    let alice = s.locks("alice").await;
    let mut forger = s.raw(WORKER.name).await;
    // The page is not fenced yet: a jump counts from 0.
    for (counter, token, accepted) in [(999, 1000, true), (2000, 2001, false), (1999, 2000, true)] {
        let (lease, granted) = grant_after(&mut forger, &alice, counter).await;
        assert_eq!(granted, token);
        let reply = send(&s.api, "alice", token, Some(&format!("{token}"))).await;
        match accepted {
            true => assert!(reply.status.is_success(), "{token}: {}", reply.json),
            false => assert_eq!(reply.error(), "suspected_forgery", "{token}"),
        }
        lease.release().await.unwrap();
    }
    assert_eq!(s.api.fence(PAGE).await["token"], 2000);
    // An admin accepts a jump of a million: the fence is set just below the
    // token (not above what the issuer minted: no `force` needed).
    let (lease, token) = grant_after(&mut forger, &alice, 1_002_000).await;
    let reply = send(&s.api, "alice", token, Some("big jump")).await;
    assert_eq!(reply.error(), "suspected_forgery");
    let admin = s.api.as_client(crate::common::ADMIN);
    admin
        .set_fence(
            PAGE,
            &json!({"issuer": "redis", "token": token - 1, "reason": "accept the jump"}),
        )
        .await
        .expect(200);
    send(&s.api, "alice", token, Some("big jump"))
        .await
        .expect(200);
    lease.release().await.unwrap();
}

#[tokio::test]
async fn with_no_bound_a_jump_is_accepted() {
    let s = Setup::start(keyed(FenceCheck::Enforce).max_token_jump(0)).await;
    let alice = s.locks("alice").await;
    let mut forger = s.raw(WORKER.name).await;
    let (_lease, token) = grant_after(&mut forger, &alice, 1 << 40).await;
    send(&s.api, "alice", token, Some("far")).await.expect(201);
    // The counter check still holds: a holder hash above the counter.
    run(
        &mut forger,
        redis::cmd("HSET")
            .arg(lock_key(LOCK))
            .arg("token")
            .arg(BIGGEST),
    )
    .await;
    let reply = send(&s.api, "alice", BIGGEST, Some("forged")).await;
    assert_eq!(reply.error(), "suspected_forgery", "{}", reply.json);
}

/// ZooKeeper's tokens (a node's czxid) jump by 2^32 at each leader
/// election, and a lease table's counter is written only through its
/// recipe: neither is bounded, whatever the bound.
#[tokio::test]
async fn zookeeper_and_lease_table_tokens_are_not_bounded() {
    let zk = harness::ZooKeeper::start().await;
    let lease_db = harness::fresh_database().await;
    let options = keyed(FenceCheck::Enforce)
        .max_token_jump(1)
        .issuer("zookeeper", &format!("zookeeper://{}", zk.connect_string()))
        .issuer("lease-postgres", &lease_db)
        .page_issuer("z", "zookeeper")
        .page_issuer("t", "lease-postgres")
        .issuer_timeout(Duration::from_secs(5));
    let (_gw, api, _) = gateway_with(options).await;
    let zookeeper = ZooKeeperLock::connect(&zk.connect_string(), Duration::from_secs(10))
        .await
        .unwrap()
        .with_client_id("alice")
        .unwrap();
    let table = LeaseTable::postgres(&lease_db)
        .await
        .unwrap()
        .with_client_id("alice")
        .unwrap();
    // Three grants of the lease table's lock before the first write: its
    // token is 3 above nothing.
    for _ in 0..2 {
        table
            .acquire("page:t", TTL, Duration::ZERO)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let alice = api.as_client("alice");
    for (locks, page) in [(&zookeeper as &dyn LockService, "z"), (&table, "t")] {
        let lease = locks
            .acquire(&format!("page:{page}"), TTL, Duration::from_secs(10))
            .await
            .unwrap();
        let token = lease.token().unwrap();
        assert!(token.get() > 2, "{token}");
        let headers = [
            ("Fencing-Token", token.to_string()),
            ("Fencing-Issuer", lease.issuer().to_string()),
        ];
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        alice.put(page, "unbounded", &headers).await.expect(201);
        lease.release().await.unwrap();
    }
}

/// The same through Sentinel, the issuer URL carrying the gateway's user
/// and password for the sentinels and the master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_issuer_logs_in_as_the_gateway_and_refuses_a_planted_holder() {
    let group = SentinelGroup::start_with_acl().await;
    let url = format!(
        "redis-sentinel://{}{}/{}",
        userinfo(GATEWAY.name),
        group.sentinel_addrs().join(","),
        group.master_name()
    );
    let options = keyed(FenceCheck::Enforce)
        .issuer("redis-sentinel", &url)
        .issuer_timeout(Duration::from_secs(5));
    let (_gw, api, _) = gateway_with(options).await;
    let alice =
        RedisSentinelLock::connect(&group.sentinel_addrs_as(WORKER.name), group.master_name())
            .await
            .unwrap()
            .with_client_id("alice")
            .unwrap();
    let lease = alice
        .acquire(LOCK, TTL, Duration::from_secs(10))
        .await
        .unwrap();
    let token = lease.token().unwrap().to_string();
    let headers = [
        ("Fencing-Token", token.as_str()),
        ("Fencing-Issuer", "redis-sentinel"),
    ];
    let client = api.as_client("alice");
    client
        .put(PAGE, "through sentinel", &headers)
        .await
        .expect(201);
    lease.release().await.unwrap();

    let mut forger = redis::Client::open(group.node_url_as(0, WORKER.name))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    run(
        &mut forger,
        redis::cmd("HSET")
            .arg(lock_key(LOCK))
            .arg("token")
            .arg(BIGGEST)
            .arg("owner")
            .arg("x alice"),
    )
    .await;
    let biggest = BIGGEST.to_string();
    let headers = [
        ("Fencing-Token", biggest.as_str()),
        ("Fencing-Issuer", "redis-sentinel"),
    ];
    client
        .put(PAGE, "forged", &headers)
        .await
        .expect_error(409, "suspected_forgery");
    assert_eq!(api.fence(PAGE).await["token"], 1);
}
