//! The Redis cells of the rights matrix: what Redis itself refuses each
//! user (`NOPERM`; `NOAUTH` for a client that does not log in), on a single
//! server and on a Sentinel group, each beside a control that the same user
//! can do what its role needs; and what a lock client can still do, which
//! Redis cannot stop (a script runs with its caller's rights).

use std::time::Duration;

use fencelock::redis::{fence_key, lock_key, RedisLock, GRANT_SCRIPT};
use fencelock::redis_sentinel::RedisSentinelLock;
use fencelock::{HolderLookup, LockError, LockService, LockState, Token};
use harness::redis_acl::{GATEWAY, REPLICATION, SENTINEL};
use harness::{Redis, SentinelGroup};
use redis::aio::MultiplexedConnection;
use redis::{Cmd, Value};

use crate::support::redis::{query, raw, secured, ADMIN, WORKER};
use crate::support::{granted, held, holder_of, spawn_acquire};

const TTL: Duration = Duration::from_secs(30);

fn cmd(words: &[&str]) -> Cmd {
    let mut c = redis::cmd(words[0]);
    for w in &words[1..] {
        c.arg(*w);
    }
    c
}

/// Each of `commands` is refused by the server with `code` (its own error,
/// not the client's), on `conn`, logged in as `who`.
#[track_caller]
fn refused<'a>(
    conn: &'a mut MultiplexedConnection,
    who: &'a str,
    code: &'a str,
    commands: &'a [&'a [&'a str]],
) -> impl std::future::Future<Output = ()> + 'a {
    let caller = std::panic::Location::caller();
    async move {
        for words in commands {
            match cmd(words).query_async::<Value>(conn).await {
                Err(e) if e.code() == Some(code) => {}
                other => panic!("{caller}: {who}'s {words:?} answered {other:?}, not {code}"),
            }
        }
    }
}

/// Who was refused what by the server on `url` (as admin) so far (`ACL
/// LOG`: user, then command, key or channel), even where the client
/// ignores the error.
async fn refusals(url: &str) -> Vec<(String, String)> {
    let mut admin = raw(url).await;
    let log: Vec<std::collections::HashMap<String, Value>> =
        query(&mut admin, redis::cmd("ACL").arg("LOG")).await;
    let field = |entry: &std::collections::HashMap<String, Value>, name: &str| {
        entry
            .get(name)
            .and_then(|v| redis::from_redis_value::<String>(v).ok())
            .unwrap_or_default()
    };
    log.iter()
        .map(|entry| (field(entry, "username"), field(entry, "object")))
        .collect()
}

/// Nothing that any user sent to the server on `url` was refused.
async fn nothing_refused(url: &str) {
    assert_eq!(refusals(url).await, vec![], "{url}");
}

#[tokio::test]
async fn redis_refuses_the_lock_client_all_but_the_lock_keys_channels_and_recipe_commands() {
    let redis = secured().await;
    // Control first: the recipe (contended, fair and not, reentrant, a
    // waiter woken by the release, a lookup) meets no refusal at all.
    let svc = RedisLock::connect(&redis.url_as(WORKER)).await.unwrap();
    let lease = held(&svc, "page:P", TTL).await;
    let waiting = spawn_acquire(&svc, "page:P", TTL, Duration::from_secs(10));
    let reentrant = svc.clone().non_fair().reentrant();
    held(&reentrant, "page:Q", TTL)
        .await
        .release()
        .await
        .unwrap();
    assert_eq!(svc.current_holder("page:P").await, Ok(holder_of(&lease)));
    lease.renew().await.unwrap();
    lease.release().await.unwrap();
    granted(waiting, "woken").await.release().await.unwrap();
    nothing_refused(&redis.url_as(ADMIN)).await;

    let mut worker = raw(&redis.url_as(WORKER)).await;
    refused(
        &mut worker,
        WORKER,
        "NOPERM",
        &[
            &["HSET", "pages:{page:P}", "token", "9"],
            &["SET", "otherkey", "1"],
            &["GET", "otherkey"],
            &["KEYS", "*"],
            &["SCAN", "0"],
            &["FLUSHALL"],
            &["FLUSHDB"],
            &["CONFIG", "GET", "*"],
            &["CONFIG", "SET", "appendonly", "no"],
            &["ACL", "LIST"],
            &["ACL", "SETUSER", "worker", "+@all"],
            &["EVAL", "return 1", "0"],
            &["SCRIPT", "FLUSH"],
            &["FUNCTION", "FLUSH"],
            &["PUBLISH", "other", "x"],
            &["REPLICAOF", "NO", "ONE"],
            &["CLIENT", "LIST"],
            &["INFO"],
            &["SHUTDOWN", "NOSAVE"],
        ],
    )
    .await;
    // The lock's own script on another key is refused too.
    let other: Result<Value, _> = redis::Script::new(GRANT_SCRIPT)
        .key("other:{x}")
        .key(fence_key("x"))
        .arg("id w")
        .arg(1000)
        .invoke_async(&mut worker)
        .await;
    assert_eq!(other.unwrap_err().code(), Some("NOPERM"));
    refused(&mut worker, WORKER, "NOPERM", &[&["SUBSCRIBE", "other"]]).await;

    // What Redis cannot stop: a lock client may write the lock's keys by
    // hand (a script runs with its caller's rights).
    let planted: i64 = query(
        &mut worker,
        redis::cmd("HSET")
            .arg(lock_key("page:P"))
            .arg("token")
            .arg(i64::MAX)
            .arg("owner")
            .arg("x alice"),
    )
    .await;
    assert_eq!(planted, 2);
}

#[tokio::test]
async fn redis_refuses_the_gateway_every_write_and_lets_it_read_the_holder_and_counter() {
    let redis = secured().await;
    let locks = RedisLock::connect(&redis.url_as(WORKER))
        .await
        .unwrap()
        .with_client_id("alice")
        .unwrap();
    let lease = held(&locks, "page:P", TTL).await;
    // Control: the issuer check's reads, as the gateway.
    let gateway = RedisLock::connect(&redis.url_as(GATEWAY.name))
        .await
        .unwrap();
    let state = LockState {
        holder: holder_of(&lease),
        minted: lease.token(),
    };
    assert_eq!(gateway.state("page:P").await, Ok(state));
    assert_eq!(gateway.minted("page:P").await, Ok(lease.token()));
    assert_eq!(
        gateway.minted("page:never").await,
        Ok(Some(Token::MIN)),
        "no counter: nothing minted"
    );
    nothing_refused(&redis.url_as(ADMIN)).await;

    let mut conn = raw(&redis.url_as(GATEWAY.name)).await;
    refused(
        &mut conn,
        GATEWAY.name,
        "NOPERM",
        &[
            &["HSET", "lock:{page:P}", "token", "9223372036854775807"],
            &["SET", "fence:{page:P}", "9223372036854775806"],
            &["INCR", "fence:{page:P}"],
            &["DEL", "lock:{page:P}"],
            &["DEL", "fence:{page:P}"],
            &["PEXPIRE", "lock:{page:P}", "1"],
            &[
                "EVAL",
                "return redis.call('SET', KEYS[1], 1)",
                "1",
                "fence:{page:P}",
            ],
            &["EVALSHA", "0000000000000000000000000000000000000000", "0"],
            &["GET", "otherkey"],
            &["KEYS", "*"],
            &["PUBLISH", "released:{page:P}", "*"],
            &["FLUSHALL"],
            &["CONFIG", "GET", "*"],
            &["ACL", "LIST"],
        ],
    )
    .await;
    // A lock's script, as the gateway, is refused before it runs.
    let script: Result<Value, _> = redis::Script::new(GRANT_SCRIPT)
        .key(lock_key("page:P"))
        .key(fence_key("page:P"))
        .arg("id mallory")
        .arg(1000)
        .invoke_async(&mut conn)
        .await;
    assert_eq!(script.unwrap_err().code(), Some("NOPERM"));
    lease.release().await.unwrap();
}

#[tokio::test]
async fn redis_refuses_a_client_that_does_not_log_in_and_the_service_users_their_reads() {
    let redis = secured().await;
    let mut anonymous = raw(&redis.url()).await;
    refused(
        &mut anonymous,
        "anonymous",
        "NOAUTH",
        &[
            &["PING"],
            &["GET", "fence:{page:P}"],
            &["HGETALL", "lock:{page:P}"],
        ],
    )
    .await;
    match RedisLock::connect(&redis.url()).await {
        Err(LockError::Unavailable { detail, .. }) => {
            assert!(detail.contains("NOAUTH"), "{detail}")
        }
        other => panic!("an anonymous lock client connected: {other:?}"),
    }
    for user in [REPLICATION.name, SENTINEL.name] {
        let mut conn = raw(&redis.url_as(user)).await;
        let reads: &[&[&str]] = &[&["GET", "fence:{page:P}"], &["SET", "fence:{page:P}", "1"]];
        refused(&mut conn, user, "NOPERM", reads).await;
    }
    // A wrong password is refused when the client logs in, and the error
    // does not repeat it.
    let wrong = format!(
        "redis://{WORKER}:not-the-password@127.0.0.1:{}/",
        redis.port()
    );
    let e = RedisLock::connect(&wrong).await.unwrap_err().to_string();
    assert!(!e.contains("not-the-password"), "{e}");
}

/// A counter written by hand to its maximum makes every grant of that lock
/// fail, with an error that says which counter and why; the other locks
/// are not affected, and an operator's repair makes the lock work again.
#[tokio::test]
async fn a_counter_pushed_to_its_maximum_fails_that_locks_grants_with_a_clear_error() {
    let redis = secured().await;
    let svc = RedisLock::connect(&redis.url_as(WORKER)).await.unwrap();
    let mut worker = raw(&redis.url_as(WORKER)).await;
    let _: () = query(
        &mut worker,
        redis::cmd("SET").arg(fence_key("page:P")).arg(i64::MAX),
    )
    .await;
    for svc in [svc.clone(), svc.clone().non_fair()] {
        match svc.acquire("page:P", TTL, Duration::ZERO).await {
            Err(LockError::Protocol { detail, .. }) => {
                assert!(detail.contains("fence:{page:P}"), "{detail}");
                assert!(detail.contains("cannot mint another token"), "{detail}");
                assert!(detail.contains("overflow"), "{detail}");
            }
            other => panic!("granted or otherwise refused: {other:?}"),
        }
    }
    held(&svc, "page:other", TTL).await.release().await.unwrap();
    let mut admin = raw(&redis.url_as(ADMIN)).await;
    let _: () = query(
        &mut admin,
        redis::cmd("SET").arg(fence_key("page:P")).arg(41),
    )
    .await;
    let lease = held(&svc, "page:P", TTL).await;
    assert_eq!(lease.token(), Token::new(42));
}

/// The Sentinel group: the sentinels let a lock client or the gateway ask
/// where the master is, and nothing else; the data nodes are as a single
/// server's. Replication and a failover go through with the replica and
/// the sentinels logged in as their own users, refused nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_refuse_lock_clients_and_the_gateway_any_change_and_fail_over_authenticated() {
    let group = SentinelGroup::start_with_acl().await;
    let worker = RedisSentinelLock::connect(&group.sentinel_addrs_as(WORKER), group.master_name())
        .await
        .unwrap()
        .with_client_id("alice")
        .unwrap();
    let lease = held(&worker, "page:P", TTL).await;
    let gateway =
        RedisSentinelLock::connect(&group.sentinel_addrs_as(GATEWAY.name), group.master_name())
            .await
            .unwrap();
    let state = gateway.state("page:P").await.unwrap();
    assert_eq!(
        (state.holder, state.minted),
        (holder_of(&lease), lease.token())
    );
    lease.release().await.unwrap();

    let sentinel = |user: &str| format!("redis://{}/", group.sentinel_addrs_as(user)[0]);
    let master = group.master_name();
    for user in [WORKER, GATEWAY.name] {
        let mut conn = raw(&sentinel(user)).await;
        let asked: Option<(String, u16)> = query(
            &mut conn,
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(master),
        )
        .await;
        assert_eq!(asked.map(|a| a.1), Some(group.node_port(0)));
        refused(
            &mut conn,
            user,
            "NOPERM",
            &[
                &["SENTINEL", "FAILOVER", master],
                &["SENTINEL", "SET", master, "quorum", "1"],
                &["SENTINEL", "REMOVE", master],
                &["SENTINEL", "MONITOR", "other", "127.0.0.1", "1", "2"],
                &["SENTINEL", "RESET", "*"],
                &["SENTINEL", "CONFIG", "SET", "resolve-hostnames", "yes"],
                &["ACL", "LIST"],
                &["SHUTDOWN"],
            ],
        )
        .await;
    }
    let anonymous = format!("redis://127.0.0.1:{}/", group.sentinel_port(0));
    refused(
        &mut raw(&anonymous).await,
        "anonymous",
        "NOAUTH",
        &[&["PING"], &["SENTINEL", "get-master-addr-by-name", master]],
    )
    .await;

    // A failover, asked of a sentinel by the admin: the replica is promoted
    // and the old master follows it, all of them logged in as their users.
    let mut admin = raw(&sentinel(ADMIN)).await;
    let _: String = query(
        &mut admin,
        redis::cmd("SENTINEL").arg("FAILOVER").arg(master),
    )
    .await;
    let failover = Duration::from_secs(30);
    group.wait_master(1, failover).await.unwrap();
    group.wait_in_sync(1, 0, failover).await.unwrap();
    for i in 0..2 {
        nothing_refused(&group.node_url_as(i, ADMIN)).await;
    }
    for i in 0..3 {
        let url = format!("redis://{}/", group.sentinel_addrs_as(ADMIN)[i]);
        let refused = refusals(&url).await;
        assert!(
            refused
                .iter()
                .all(|(u, _)| u == WORKER || u == GATEWAY.name),
            "sentinel {i} refused its peers or the admin: {refused:?}"
        );
    }
    // The lock client follows the failover (its first try may meet the
    // demoted master), and the gateway reads the new master.
    let lease = harness::wait_until(failover, || async {
        worker.acquire("page:P", TTL, Duration::ZERO).await
    })
    .await
    .unwrap();
    assert_eq!(
        gateway.current_holder("page:P").await,
        Ok(holder_of(&lease))
    );
    lease.release().await.unwrap();
    let mut on_master = raw(&group.node_url_as(1, WORKER)).await;
    refused(
        &mut on_master,
        WORKER,
        "NOPERM",
        &[&["KEYS", "*"], &["FLUSHALL"]],
    )
    .await;
}

/// What the harness's servers run with by default: open, as before.
#[tokio::test]
async fn without_acl_the_harness_server_is_open_to_anybody() {
    let redis = Redis::start().await;
    let mut anonymous = raw(&redis.url()).await;
    let pong: String = query(&mut anonymous, &cmd(&["PING"])).await;
    assert_eq!(pong, "PONG");
}
