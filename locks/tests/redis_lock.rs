//! The Redis backend against a real redis-server.

mod support;

use std::sync::Arc;
use std::time::Duration;

use fencelock::redis::{fence_key, lock_key, RedisLock};
use fencelock::{LockError, LockService};
use harness::{Persistence, Redis};
use support::contract;

async fn service(redis: &Redis) -> RedisLock {
    RedisLock::connect(&redis.url()).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_under_contention() {
    let redis = Redis::start().await;
    let svc: Arc<dyn LockService> = Arc::new(service(&redis).await);
    contract::mutual_exclusion_under_contention(svc, "page-1", 8, 25).await;
}

#[tokio::test]
async fn tokens_strictly_increase_per_lock_name() {
    let redis = Redis::start().await;
    let svc = service(&redis).await;
    assert_eq!(contract::tokens_strictly_increase(&svc, "a", 5).await, 5);
    // Another name has its own counter.
    assert_eq!(contract::tokens_strictly_increase(&svc, "b", 2).await, 2);
}

#[tokio::test]
async fn grant_sets_owner_key_with_ttl_and_counter_without() {
    let redis = Redis::start().await;
    let svc = service(&redis).await;
    let lease = svc
        .acquire("page", Duration::from_secs(5), Duration::ZERO)
        .await
        .unwrap();
    let mut raw = raw(&redis).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(lock_key("page"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!((1..=5000).contains(&pttl), "lock key pttl {pttl}");
    let fence_ttl: i64 = redis::cmd("PTTL")
        .arg(fence_key("page"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(fence_ttl, -1, "the counter must never expire");
    let fence: u64 = redis::cmd("GET")
        .arg(fence_key("page"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(Some(fence), lease.token().map(|t| t.get()));
    lease.release().await.unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(lock_key("page"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(exists, 0, "release deletes the lock key");
}

#[tokio::test]
async fn tokens_keep_increasing_across_restart_with_aof_always() {
    let mut redis = Redis::start_with(Persistence::AofAlways).await;
    let before = contract::tokens_strictly_increase(&service(&redis).await, "page", 3).await;
    redis.restart().await;
    let svc = service(&redis).await;
    let after = svc
        .acquire("page", Duration::from_secs(5), Duration::ZERO)
        .await
        .unwrap();
    assert!(after.token().unwrap().get() > before);
    after.release().await.unwrap();
}

/// The documented hazard: without persistence the counter restarts, so the
/// next holder's token is below tokens the storage has already seen.
#[tokio::test]
async fn tokens_go_backwards_after_restart_without_persistence() {
    let mut redis = Redis::start().await;
    let before = contract::tokens_strictly_increase(&service(&redis).await, "page", 3).await;
    assert_eq!(before, 3);
    redis.restart().await;
    let svc = service(&redis).await;
    let after = svc
        .acquire("page", Duration::from_secs(5), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        after.token().map(|t| t.get()),
        Some(1),
        "the counter restarted from scratch"
    );
    after.release().await.unwrap();
}

#[tokio::test]
async fn the_same_client_survives_a_restart() {
    let mut redis = Redis::start().await;
    let svc = service(&redis).await;
    contract::tokens_strictly_increase(&svc, "page", 1).await;
    redis.restart().await;
    // The first call after the restart may see the dead connection; the next reconnects.
    let _ = svc
        .acquire("other", Duration::from_secs(1), Duration::ZERO)
        .await;
    let lease = svc
        .acquire("page", Duration::from_secs(5), Duration::from_secs(2))
        .await
        .expect("reconnected");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn late_release_by_expired_holder_is_a_no_op() {
    let redis = Redis::start().await;
    let svc = service(&redis).await;
    contract::late_release_is_a_no_op(&svc, "page", Duration::from_millis(300)).await;
}

#[tokio::test]
async fn release_by_a_stranger_does_not_free_the_lock() {
    let redis = Redis::start().await;
    let svc = service(&redis).await;
    let lease = svc
        .acquire("page", Duration::from_secs(5), Duration::ZERO)
        .await
        .unwrap();
    let mut raw = raw(&redis).await;
    let deleted: i64 = redis::Script::new(fencelock::redis::RELEASE_SCRIPT)
        .key(lock_key("page"))
        .arg("somebody-else")
        .invoke_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(deleted, 0);
    let contender = svc
        .acquire("page", Duration::from_secs(5), Duration::ZERO)
        .await;
    assert!(matches!(contender, Err(LockError::Timeout { .. })));
    lease.release().await.unwrap();
}

#[tokio::test]
async fn expiry_lets_next_holder_in_with_higher_token() {
    let redis = Redis::start().await;
    let svc = service(&redis).await;
    contract::expiry_lets_next_holder_in_with_higher_token(
        &svc,
        "page",
        Duration::from_millis(300),
    )
    .await;
}

#[tokio::test]
async fn watchdog_keeps_lease_alive_well_past_ttl() {
    let redis = Redis::start().await;
    let svc = service(&redis).await;
    contract::renewal_keeps_lease_past_ttl(&svc, "page").await;
}

#[tokio::test]
async fn lost_signal_fires_when_redis_is_killed_during_hold() {
    let mut redis = Redis::start().await;
    let svc = service(&redis).await;
    let ttl = Duration::from_millis(500);
    contract::lost_signal_fires_within(&svc, "page", ttl, || redis.kill(), ttl + ttl / 2).await;
}

#[tokio::test]
async fn renewal_refused_after_key_deleted_fires_lost_signal() {
    let redis = Redis::start().await;
    let svc = service(&redis).await;
    let ttl = Duration::from_millis(600);
    let lease = svc.acquire("page", ttl, Duration::ZERO).await.unwrap();
    let mut raw = raw(&redis).await;
    let _: i64 = redis::cmd("DEL")
        .arg(lock_key("page"))
        .query_async(&mut raw)
        .await
        .unwrap();
    let reason = tokio::time::timeout(ttl, lease.lost_signal().lost())
        .await
        .expect("the next renewal (at ttl/3) is refused");
    assert!(reason.contains("no longer held"), "{reason}");
}

#[tokio::test]
async fn bad_config_is_a_clear_error() {
    let err = RedisLock::connect("not a url").await.err().unwrap();
    assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");

    let port = harness::free_port();
    let started = tokio::time::Instant::now();
    let err = RedisLock::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, LockError::Unavailable { service, .. } if service == "redis"),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3), "fail fast");

    let redis = Redis::start().await;
    contract::bad_requests_are_invalid_config(&service(&redis).await).await;
}

async fn raw(redis: &Redis) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test]
async fn holder_lookup_names_the_client_and_token() {
    let redis = Redis::start().await;
    let svc = service(&redis).await.with_client_id("alice").unwrap();
    contract::holder_lookup_names_the_client_and_token(&svc, &svc, "alice", "page", true).await;
    // A client id is what the gateway's keys allow: visible ASCII, no spaces.
    assert!(matches!(
        service(&redis).await.with_client_id("two words"),
        Err(LockError::InvalidConfig(_))
    ));
}

#[tokio::test]
async fn dropped_lease_is_released_in_the_background() {
    let redis = Redis::start().await;
    contract::dropped_lease_is_released_in_the_background(&service(&redis).await, "page").await;
}
