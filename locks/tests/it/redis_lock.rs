//! The Redis backend against a real redis-server with ACL users: every
//! lock here is taken as the lock client's user (`worker`), and what the
//! tests look at or tamper with is read and written as `admin`.

use std::sync::Arc;
use std::time::Duration;

use fencelock::redis::{channel, deadlines_key, fence_key, lock_key, queue_key, RedisLock};
use fencelock::{AcquireOptions, HolderLookup, LockError, LockService};
use harness::proxy::{via_proxy, DelayProxy, Mode};
use harness::{Persistence, Redis};

use crate::support::fair::{self, Queue};
use crate::support::redis::{connections_received, query, raw, secured, ADMIN, WORKER};
use crate::support::{
    assert_timeout, assert_unavailable, contract, granted, held, held_with, spawn_acquire,
};

async fn service(redis: &Redis) -> RedisLock {
    RedisLock::connect(&redis.url_as(WORKER))
        .await
        .expect("connect")
}

/// A Redis server of the test's own, and a service on it.
async fn started() -> (Redis, RedisLock) {
    let redis = secured().await;
    let svc = service(&redis).await;
    (redis, svc)
}

/// [`service`] whose waiters poll every `fallback` at the latest.
async fn polling(redis: &Redis, fallback: Duration) -> RedisLock {
    service(redis).await.with_poll_fallback(fallback)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_under_contention() {
    let redis = secured().await;
    let svc: Arc<dyn LockService> = Arc::new(service(&redis).await);
    contract::mutual_exclusion_under_contention(svc, "page-1", 8, 25).await;
}

#[tokio::test]
async fn tokens_strictly_increase_per_lock_name() {
    let (_redis, svc) = started().await;
    assert_eq!(contract::tokens_strictly_increase(&svc, "a", 5).await, 5);
    // Another name has its own counter.
    assert_eq!(contract::tokens_strictly_increase(&svc, "b", 2).await, 2);
}

#[tokio::test]
async fn grant_sets_owner_key_with_ttl_and_counter_without() {
    let (redis, svc) = started().await;
    let lease = held(&svc, "page", Duration::from_secs(5)).await;
    let mut raw = raw(&redis.url_as(ADMIN)).await;
    let pttl: i64 = query(&mut raw, redis::cmd("PTTL").arg(lock_key("page"))).await;
    assert!((1..=5000).contains(&pttl), "lock key pttl {pttl}");
    let fence_ttl: i64 = query(&mut raw, redis::cmd("PTTL").arg(fence_key("page"))).await;
    assert_eq!(fence_ttl, -1, "the counter must never expire");
    let fence: u64 = query(&mut raw, redis::cmd("GET").arg(fence_key("page"))).await;
    assert_eq!(Some(fence), lease.token().map(|t| t.get()));
    lease.release().await.unwrap();
    let exists: i64 = query(&mut raw, redis::cmd("EXISTS").arg(lock_key("page"))).await;
    assert_eq!(exists, 0, "release deletes the lock key");
}

#[tokio::test]
async fn tokens_keep_increasing_across_restart_with_aof_always() {
    let mut redis = Redis::start_with_acl(Persistence::AofAlways).await;
    let before = contract::tokens_strictly_increase(&service(&redis).await, "page", 3).await;
    redis.restart().await;
    let svc = service(&redis).await;
    contract::the_next_token_is_higher(&svc, "page", before, Duration::ZERO).await;
}

/// The documented hazard: without persistence the counter restarts, so the
/// next holder's token is below tokens the storage has already seen.
#[tokio::test]
async fn tokens_go_backwards_after_restart_without_persistence() {
    let mut redis = secured().await;
    let before = contract::tokens_strictly_increase(&service(&redis).await, "page", 3).await;
    assert_eq!(before, 3);
    redis.restart().await;
    let svc = service(&redis).await;
    let after = held(&svc, "page", Duration::from_secs(5)).await;
    assert_eq!(
        after.token().map(|t| t.get()),
        Some(1),
        "the counter restarted from scratch"
    );
    after.release().await.unwrap();
}

#[tokio::test]
async fn the_same_client_survives_a_restart() {
    let mut redis = secured().await;
    let svc = service(&redis).await;
    contract::tokens_strictly_increase(&svc, "page", 1).await;
    redis.restart().await;
    // The first call after the restart may see the dead connection; the next reconnects.
    let _ = svc
        .acquire("other", Duration::from_secs(1), Duration::ZERO)
        .await;
    let reconnected = AcquireOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(2));
    let lease = held_with(&svc, "page", reconnected).await;
    lease.release().await.unwrap();
}

#[tokio::test]
async fn late_release_by_expired_holder_is_a_no_op() {
    let (_redis, svc) = started().await;
    contract::late_release_is_a_no_op(&svc, "page", Duration::from_millis(300)).await;
}

#[tokio::test]
async fn release_by_a_stranger_does_not_free_the_lock() {
    let (redis, svc) = started().await;
    let lease = held(&svc, "page", Duration::from_secs(5)).await;
    let mut raw = raw(&redis.url_as(ADMIN)).await;
    let token = lease.token().unwrap().get();
    let deleted: i64 = redis::Script::new(fencelock::redis::RELEASE_SCRIPT)
        .key(lock_key("page"))
        .key(queue_key("page"))
        .key(deadlines_key("page"))
        .arg("somebody-else x")
        .arg(token)
        .arg(channel("page"))
        .invoke_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(deleted, 0);
    let contender = svc.acquire("page", Duration::from_secs(5), Duration::ZERO);
    assert_timeout(contender.await, "a contender");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn expiry_lets_next_holder_in_with_higher_token() {
    let (_redis, svc) = started().await;
    contract::expiry_lets_next_holder_in_with_higher_token(
        &svc,
        "page",
        Duration::from_millis(300),
    )
    .await;
}

#[tokio::test]
async fn watchdog_keeps_lease_alive_well_past_ttl() {
    let (_redis, svc) = started().await;
    contract::renewal_keeps_lease_past_ttl(&svc, "page").await;
}

#[tokio::test]
async fn lost_signal_fires_when_redis_is_killed_during_hold() {
    let mut redis = secured().await;
    let svc = service(&redis).await;
    let ttl = Duration::from_millis(500);
    contract::lost_signal_fires_within(&svc, "page", ttl, || redis.kill(), ttl + ttl / 2).await;
}

#[tokio::test]
async fn renewal_refused_after_key_deleted_fires_lost_signal() {
    let (redis, svc) = started().await;
    let ttl = Duration::from_millis(600);
    let lease = svc.acquire("page", ttl, Duration::ZERO).await.unwrap();
    let mut raw = raw(&redis.url_as(ADMIN)).await;
    let _: i64 = query(&mut raw, redis::cmd("DEL").arg(lock_key("page"))).await;
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
    let unreachable = RedisLock::connect(&format!("redis://127.0.0.1:{port}/")).await;
    assert_unavailable(unreachable, "redis");
    assert!(started.elapsed() < Duration::from_secs(3), "fail fast");

    let redis = secured().await;
    contract::bad_requests_are_invalid_config(&service(&redis).await).await;
}

#[tokio::test]
async fn holder_lookup_names_the_client_and_token() {
    let redis = secured().await;
    let svc = service(&redis).await.with_client_id("alice").unwrap();
    contract::holder_lookup_names_the_client_and_token(&svc, &svc, "alice", "page", true).await;
    // A client id is what the gateway's keys allow: visible ASCII, no spaces.
    assert!(matches!(
        service(&redis).await.with_client_id("two words"),
        Err(LockError::InvalidConfig(_))
    ));
}

#[tokio::test]
async fn the_first_holder_lookup_after_a_restart_is_answered_not_refused() {
    let mut redis = secured().await;
    let svc = service(&redis).await.with_client_id("alice").unwrap();
    // No watchdog: nothing but the lookup may touch the kept connection.
    let opts = AcquireOptions::new(Duration::from_secs(30)).auto_renew(false);
    let lease = svc.acquire_with("page", opts).await.unwrap();
    let token = lease.token().unwrap();
    assert_eq!(
        svc.current_holder("page").await.unwrap().map(|h| h.token),
        Some(token),
        "the lookup's connection is open before the restart"
    );
    // Without persistence the restart forgets the lock: nobody holds it. The
    // lookup's kept connection is dead; the first lookup must still answer.
    redis.restart().await;
    assert_eq!(
        svc.current_holder("page").await,
        Ok(None),
        "the first lookup after a restart reconnects and answers"
    );
    drop(lease);
}

/// A holder lookup that its caller gives up on (the gateway waits 500 ms
/// for an issuer, less than the lock's own response timeout) must not leave
/// the connection it waited on in place: a server that stopped answering
/// would then time out every later lookup, each abandoned in turn. Here the
/// server is paused (SIGSTOP: its sockets stay open) while a lookup waits,
/// and the caller drops it; once the server is back, the next lookup runs on
/// a new connection (the server counts one more connection received).
#[tokio::test]
async fn a_lookup_abandoned_by_its_caller_does_not_keep_a_silent_connection() {
    let mut redis = secured().await;
    let svc = service(&redis).await;
    let mut admin = raw(&redis.url_as(ADMIN)).await;
    assert_eq!(svc.current_holder("page").await, Ok(None));
    redis.process().pause();
    let abandoned =
        tokio::time::timeout(Duration::from_millis(200), svc.current_holder("page")).await;
    assert!(abandoned.is_err(), "the paused server answers nothing");
    redis.process().resume();
    let before = connections_received(&mut admin).await;
    assert_eq!(svc.current_holder("page").await, Ok(None));
    assert_eq!(
        connections_received(&mut admin).await - before,
        1,
        "the next lookup opened a new connection"
    );
}

/// A proxy in front of `redis`, and a worker's lock service through it.
async fn through_proxy(redis: &Redis) -> (DelayProxy, RedisLock) {
    let proxy = DelayProxy::start(([127, 0, 0, 1], redis.port()).into())
        .await
        .unwrap();
    let svc = RedisLock::connect(&via_proxy(
        &redis.url_as(WORKER),
        redis.port(),
        proxy.port(),
    ))
    .await
    .unwrap();
    (proxy, svc)
}

/// A server that takes longer to connect to than any caller waits (a slow
/// name lookup or handshake; here the proxy holds each new connection's
/// first bytes 700 ms) is still reached: the reconnect goes on after its
/// caller gave up, and a later caller takes it over. When the reconnect ran
/// in the caller's own future, every lookup given 500 ms cancelled it, and
/// the gateway answered `issuer_unavailable` until it was restarted.
#[tokio::test]
async fn a_reconnect_slower_than_its_callers_still_completes() {
    let mut redis = secured().await;
    let (proxy, svc) = through_proxy(&redis).await;
    assert_eq!(svc.current_holder("page").await, Ok(None));
    proxy.delay_setup(Duration::from_millis(700));
    // The kept connection dies with the server; every new one is slow.
    redis.restart().await;
    let deadline = Duration::from_millis(500);
    let mut answers = Vec::new();
    for _ in 0..5 {
        let answer = tokio::time::timeout(deadline, svc.current_holder("page")).await;
        answers.push(answer.is_ok());
        if answer.is_ok() {
            break;
        }
    }
    assert_eq!(
        answers.first(),
        Some(&false),
        "a new connection takes 700 ms"
    );
    assert_eq!(
        answers.last(),
        Some(&true),
        "a lookup given 500 ms is answered once the reconnect completed: {answers:?}"
    );
}

#[tokio::test]
async fn dropped_lease_is_released_in_the_background() {
    let redis = secured().await;
    contract::dropped_lease_is_released_in_the_background(&service(&redis).await, "page").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_fair_mutual_exclusion_under_contention() {
    let redis = secured().await;
    let svc: Arc<dyn LockService> = Arc::new(service(&redis).await.non_fair());
    contract::mutual_exclusion_under_contention(svc, "page-1", 8, 25).await;
}

#[tokio::test]
async fn non_fair_tokens_strictly_increase_and_the_lookup_names_the_holder() {
    let redis = secured().await;
    let svc = service(&redis).await.non_fair();
    assert!(!svc.is_fair());
    assert_eq!(contract::tokens_strictly_increase(&svc, "a", 5).await, 5);
    let alice = svc.with_client_id("alice").unwrap();
    contract::holder_lookup_names_the_client_and_token(&alice, &alice, "alice", "b", true).await;
}

/// The length of lock `name`'s fair queue, as Redis holds it.
async fn queue_len(redis: &Redis, name: &str) -> i64 {
    query(
        &mut raw(&redis.url_as(ADMIN)).await,
        redis::cmd("LLEN").arg(queue_key(name)),
    )
    .await
}

/// The queue as the claims of a fair lock look at it.
impl Queue for Redis {
    /// Wait (bounded) until `name`'s queue holds `n` waiters.
    async fn wait_queued(&self, name: &str, n: i64) {
        harness::wait_until(Duration::from_secs(10), || async {
            match queue_len(self, name).await {
                len if len == n => Ok(()),
                len => Err(format!("{len} queued, waiting for {n}")),
            }
        })
        .await
        .unwrap();
    }
}

/// A waiter whose fallback poll (60 s) and holder's TTL (30 s) are far
/// beyond the test's bound: a prompt grant after the release can only come
/// from the release's message. Refused, subscribed, refused again: then it
/// waits for a message.
async fn waiter_is_woken_by_the_release(fair: bool) {
    let (redis, holder) = started().await;
    let waiter = polling(&redis, Duration::from_secs(60)).await;
    let waiter = if fair { waiter } else { waiter.non_fair() };
    fair::waiter_is_woken_by_the_release(&holder, &waiter, 2, &redis).await;
}

#[tokio::test]
async fn fair_waiter_is_woken_by_the_release_not_by_polling() {
    waiter_is_woken_by_the_release(true).await;
}

#[tokio::test]
async fn non_fair_waiter_is_woken_by_the_release_not_by_polling() {
    waiter_is_woken_by_the_release(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_granted_in_the_order_they_queued() {
    let (redis, holder) = started().await;
    // Each waiter its own connection, as separate processes would be.
    let mut waiters = vec![];
    for _ in 0..4 {
        waiters.push(service(&redis).await);
    }
    fair::fair_waiters_are_granted_in_the_order_they_queued(&holder, waiters, &redis).await;
}

/// What starved the waiters of the polled lock: the holder releases and
/// asks again at once. Fair, it queues behind the waiter that was there.
#[tokio::test]
async fn a_fair_holder_that_asks_again_at_once_queues_behind_the_waiter() {
    let redis = secured().await;
    let (first, second) = (service(&redis).await, service(&redis).await);
    fair::a_fair_holder_that_asks_again_at_once_queues_behind_the_waiter(&first, &second, &redis)
        .await;
}

#[tokio::test]
async fn a_dead_fair_waiter_is_skipped_once_its_place_lapses() {
    let redis = secured().await;
    // Places last 4 × 100 ms without renewal.
    let fallback = Duration::from_millis(100);
    let holder = service(&redis).await;
    let dead = polling(&redis, fallback).await;
    let live = polling(&redis, fallback).await;
    let ttl = Duration::from_secs(30);
    let lease = held(&holder, "page", ttl).await;
    // A waiter that queued, then stopped: never polled again, never dropped,
    // as a process that froze or died (no leave, no renewal of its place).
    let mut frozen = Box::pin(dead.acquire("page", ttl, Duration::from_secs(60)));
    tokio::select! {
        r = &mut frozen => panic!("the dead waiter was granted: {r:?}"),
        () = redis.wait_queued("page", 1) => {}
    }
    std::mem::forget(frozen);
    let waiting = spawn_acquire(&live, "page", ttl, Duration::from_secs(20));
    redis.wait_queued("page", 2).await;
    lease.release().await.unwrap();
    let why = "the live waiter gets the lock once the dead one's place lapsed";
    let granted = granted(waiting, why).await;
    assert_eq!(
        queue_len(&redis, "page").await,
        0,
        "the dead waiter is gone"
    );
    granted.release().await.unwrap();
}

/// A waiter whose future stops being polled in the middle of opening the
/// pub/sub connection (a task stuck elsewhere; here the test stops polling
/// it while the proxy holds the connection's first bytes) must not hold up
/// the next waiter of the same service: when the subscription ran in the
/// waiter's own future under the service's lock, the second waiter queued
/// for that lock after its first refusal and was never granted, past its own
/// wait.
#[tokio::test]
async fn a_waiter_stopped_mid_subscribe_does_not_hold_up_the_next_waiter() {
    let redis = secured().await;
    let (proxy, svc) = through_proxy(&redis).await;
    let ttl = Duration::from_secs(30);
    let lease = held(&service(&redis).await, "page", ttl).await;
    let mut first = Box::pin(svc.acquire("page", ttl, Duration::from_secs(60)));
    tokio::select! {
        r = &mut first => panic!("the first waiter was granted: {r:?}"),
        () = redis.wait_queued("page", 1) => {}
    }
    // Refused and queued: what it sends next opens its subscription.
    proxy.set_mode(Mode::Hold);
    let subscribing = async {
        while proxy.bytes_delayed() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        r = &mut first => panic!("the first waiter ended: {r:?}"),
        () = subscribing => {}
        () = tokio::time::sleep(Duration::from_secs(10)) => panic!("the first waiter sent nothing"),
    }
    // From here on it is never polled again (until the end of the test).
    proxy.set_mode(Mode::Pass);
    let second = spawn_acquire(&svc, "page", ttl, Duration::from_secs(10));
    redis.wait_queued("page", 2).await;
    lease.release().await.unwrap();
    let why = "the second waiter is granted once the stopped one's place lapses";
    granted(second, why).await.release().await.unwrap();
    drop(first);
}

#[tokio::test]
async fn a_fair_waiter_that_gives_up_leaves_the_queue() {
    let (redis, holder) = started().await;
    // Its place would last 40 s: only leaving explains an empty queue.
    let quitter = polling(&redis, Duration::from_secs(10)).await;
    fair::a_fair_waiter_that_gives_up_leaves_the_queue(&holder, &quitter, &redis).await;
}

#[tokio::test]
async fn a_reentrant_owner_takes_the_lock_again_with_the_same_token_until_its_last_release() {
    let redis = secured().await;
    let fair = service(&redis).await.with_client_id("alice").unwrap();
    reentrant_claims(&redis, fair.clone(), "page").await;
    reentrant_claims(&redis, fair.non_fair(), "other").await;
}

async fn reentrant_claims(redis: &Redis, svc: RedisLock, name: &str) {
    let owner = svc.clone().reentrant();
    let outer = held(&owner, name, Duration::from_secs(10)).await;
    let inner = owner
        .clone()
        .acquire(name, Duration::from_secs(10), Duration::ZERO)
        .await
        .expect("the same owner re-enters at once");
    assert_eq!(
        inner.token(),
        outer.token(),
        "the token stays while re-entered"
    );
    assert_eq!(count(redis, name).await, Some(2));
    let holder = Some(fencelock::Holder {
        client_id: "alice".into(),
        token: outer.token().unwrap(),
    });
    assert_eq!(svc.current_holder(name).await.unwrap(), holder);

    // Another owner, reentrant or not, same client id or not, is refused.
    for other in [svc.clone().reentrant(), svc.clone(), svc.clone().non_fair()] {
        let refused = other.acquire(name, Duration::from_secs(10), Duration::ZERO);
        assert_timeout(refused.await, "another owner");
    }

    let first_token = outer.token();
    inner.release().await.unwrap();
    assert_eq!(count(redis, name).await, Some(1), "one release counts down");
    assert_eq!(svc.current_holder(name).await.unwrap(), holder);
    outer.release().await.unwrap();
    assert_eq!(count(redis, name).await, None, "the last release deletes");
    assert_eq!(svc.current_holder(name).await.unwrap(), None);
    let next = held(&svc, name, Duration::from_secs(10)).await;
    assert!(next.token() > first_token, "a new grant, a new token");
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_late_release_of_an_expired_reentrant_grant_does_not_count_down_the_next_one() {
    let redis = secured().await;
    let owner = service(&redis).await.reentrant();
    let ttl = Duration::from_millis(300);
    let old = owner
        .acquire_with("page", AcquireOptions::new(ttl).auto_renew(false))
        .await
        .unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(100)).await; // the scenario: it lapses
    let new = owner
        .acquire("page", Duration::from_secs(10), Duration::ZERO)
        .await
        .expect("the lapsed grant is gone");
    assert!(new.token() > old.token(), "a new grant, not a re-entry");
    assert!(matches!(
        old.release().await,
        Err(LockError::NotHeld { .. })
    ));
    assert_eq!(count(&redis, "page").await, Some(1));
    new.release().await.unwrap();
}

#[tokio::test]
async fn holder_lookup_names_non_fair_and_reentrant_holders() {
    let redis = secured().await;
    let svc = service(&redis).await.with_client_id("bob").unwrap();
    for (i, variant) in [
        svc.clone().non_fair(),
        svc.clone().reentrant(),
        svc.clone().non_fair().reentrant(),
    ]
    .into_iter()
    .enumerate()
    {
        contract::holder_lookup_names_the_client_and_token(
            &variant,
            &svc,
            "bob",
            &format!("page-{i}"),
            true,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_handles_exclude_each_other_under_contention() {
    let (_redis, svc) = started().await;
    // One reentrant handle per task: distinct owners.
    let in_use = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut joins = vec![];
    for _ in 0..4 {
        let owner = svc.clone().reentrant();
        let in_use = in_use.clone();
        joins.push(tokio::spawn(async move {
            for _ in 0..10 {
                let outer = owner
                    .acquire("page", Duration::from_secs(10), Duration::from_secs(30))
                    .await
                    .unwrap();
                assert!(!in_use.swap(true, std::sync::atomic::Ordering::SeqCst));
                let inner = held(&owner, "page", Duration::from_secs(10)).await;
                assert_eq!(inner.token(), outer.token());
                inner.release().await.unwrap();
                tokio::task::yield_now().await;
                in_use.store(false, std::sync::atomic::Ordering::SeqCst);
                outer.release().await.unwrap();
            }
        }));
    }
    for j in joins {
        j.await.unwrap();
    }
}

/// The `count` field of `lock:{N}`; `None` when the hash is gone.
async fn count(redis: &Redis, name: &str) -> Option<i64> {
    query(
        &mut raw(&redis.url_as(ADMIN)).await,
        redis::cmd("HGET").arg(lock_key(name)).arg("count"),
    )
    .await
}

/// The lock freed while the first waiter is not looking (frozen, not yet
/// woken): it stays the first waiter's until its place lapses, and a
/// newcomer that tries without waiting is refused, be it the last holder or
/// another client.
#[tokio::test]
async fn a_free_lock_waits_for_the_first_waiter_and_a_newcomer_is_refused() {
    let (redis, holder) = started().await;
    let first = polling(&redis, Duration::from_secs(10)).await;
    let newcomers = [holder.clone(), service(&redis).await];
    fair::a_free_lock_waits_for_the_first_waiter_and_a_newcomer_is_refused(
        &holder, &first, &newcomers, &redis,
    )
    .await;
}
