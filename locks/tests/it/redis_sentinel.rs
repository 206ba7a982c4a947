//! The Sentinel backend against a real group: a master, its replica and three
//! sentinels (harness::SentinelGroup), with ACL users everywhere: the replica
//! and the sentinels authenticate, the locks log in as the lock client's
//! user (`worker`) on the sentinels and the master, the tests as `admin`.

use std::time::Duration;

use fencelock::redis::lock_key;
use fencelock::redis_sentinel::{RedisSentinelLock, ISSUER};
use fencelock::{AcquireOptions, HolderLookup, Lease, LockError, LockService};
use harness::SentinelGroup;

use crate::support::holder_of;
use crate::support::redis::{connections_received, query, raw, ADMIN, WORKER};

const FAILOVER: Duration = Duration::from_secs(30);

async fn client(group: &SentinelGroup, id: &str) -> RedisSentinelLock {
    RedisSentinelLock::connect(&group.sentinel_addrs_as(WORKER), group.master_name())
        .await
        .expect("connect through the sentinels")
        .with_client_id(id)
        .unwrap()
}

fn held(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new(ttl).auto_renew(false)
}

/// Client `id`, connected now, takes lock `name` for 30 s (no watchdog),
/// waiting up to 10 s.
async fn granted_to(group: &SentinelGroup, id: &str, name: &str) -> (RedisSentinelLock, Lease) {
    let svc = client(group, id).await;
    let options = held(Duration::from_secs(30)).wait(Duration::from_secs(10));
    let lease = svc
        .acquire_with(name, options)
        .await
        .unwrap_or_else(|e| panic!("{name} granted to {id}: {e:?}"));
    (svc, lease)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_loses_a_grant_hands_the_lock_and_its_token_to_a_second_client() {
    let mut group = SentinelGroup::start_with_acl().await;
    let a = client(&group, "a").await;
    // A storage's lookup, connected before the failover (as a gateway's is).
    let storage = client(&group, "storage").await;
    // One grant that does reach the replica: the counter there is 1.
    let first = a
        .acquire_with("x", held(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(first.issuer(), ISSUER);
    assert_eq!(first.token().unwrap().get(), 1);
    first.release().await.unwrap();
    group.wait_in_sync(0, 1, FAILOVER).await.unwrap();

    // The replica stops taking the stream; a's next grant lives on the master only.
    group.detach_replica(1, 0).await.unwrap();
    let lost = a
        .acquire_with("x", held(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(lost.token().unwrap().get(), 2);
    assert_eq!(storage.current_holder("x").await.unwrap(), holder_of(&lost));
    group.freeze(0);
    group.thaw(1);
    group.wait_master(1, FAILOVER).await.unwrap();

    // b connects after the failover: the sentinels name the promoted replica,
    // where the lock is free and the counter still says 1.
    // (The promoted replica grants the lock a still holds.)
    let (b, second) = granted_to(&group, "b", "x").await;
    assert_eq!(
        second.token(),
        lost.token(),
        "the promoted replica re-mints the token of the grant it never saw"
    );
    assert!(!lost.is_lost(), "a still trusts its lease: two holders");
    assert_eq!(b.current_holder("x").await.unwrap(), holder_of(&second));
    // a's own client follows the failover too: its renewal is refused there.
    let renewed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match lost.renew().await {
                Err(LockError::NotHeld { .. }) => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                Ok(_) => panic!("a renewed a grant the new master never had"),
            }
        }
    })
    .await;
    assert!(renewed.is_ok(), "a's renewal never reached the new master");
    // The old master comes back, still holding a's grant until the sentinels
    // demote it and it resyncs: the storage's lookup, whose connection went
    // there, must ask the master the sentinels name now, and name b.
    group.thaw(0);
    assert_eq!(
        storage.current_holder("x").await.unwrap(),
        holder_of(&second),
        "the lookup read the old master"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_refuses_and_releases_a_grant_that_no_replica_acknowledged() {
    let mut group = SentinelGroup::start_with_acl().await;
    // 2 s: long enough for an in-sync replica's acknowledgement on a loaded
    // machine (200 ms was not, in CI, with the other tests' groups
    // starting), and the frozen replica's refusal still comes within it.
    let waiting = client(&group, "w")
        .await
        .with_wait(1, Duration::from_secs(2));
    // With the replica in sync, WAIT 1 passes.
    let lease = waiting
        .acquire_with("y", held(Duration::from_secs(5)))
        .await
        .unwrap();
    lease.release().await.unwrap();

    group.freeze(1);
    let refused = waiting
        .acquire_with("y", held(Duration::from_secs(5)))
        .await
        .unwrap_err();
    match &refused {
        LockError::Unavailable { service, detail } => {
            assert_eq!(service, ISSUER);
            assert!(detail.contains("reached 0 of 1 replica"), "{detail}");
            assert!(detail.contains("released"), "{detail}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // Nothing is left on the master: the next client is not blocked.
    let mut on_master = raw(&group.node_url_as(0, ADMIN)).await;
    let key: Option<String> = query(&mut on_master, redis::cmd("GET").arg(lock_key("y"))).await;
    assert_eq!(key, None);
    group.thaw(1);
    group.wait_in_sync(0, 1, FAILOVER).await.unwrap();
    waiting
        .acquire_with("y", held(Duration::from_secs(5)))
        .await
        .expect("granted once the replica acknowledges again")
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn no_sentinel_answering_is_unavailable_at_once_and_a_bad_list_is_invalid() {
    let port = harness::free_port();
    let err = RedisSentinelLock::connect(&[format!("127.0.0.1:{port}")], "mymaster")
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err:?}");
    let err = RedisSentinelLock::connect(&["redis://nope".into()], "mymaster")
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");
    let err = RedisSentinelLock::connect(&["127.0.0.1:1".into()], " ")
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");
}

/// The gateway gives an issuer at most 500 ms and then drops the lookup. A
/// lookup dropped before its answer (the master frozen under it, for less
/// than the sentinels' 1 s down-after, so no failover) forgets its cached
/// connection: the next lookup connects to the master anew instead of
/// asking again on the connection that stopped answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_abandoned_by_its_caller_does_not_keep_a_silent_connection() {
    let mut group = SentinelGroup::start_with_acl().await;
    let storage = client(&group, "storage").await;
    let mut admin = raw(&group.node_url_as(0, ADMIN)).await;
    assert_eq!(storage.current_holder("page").await, Ok(None));
    group.freeze(0);
    let abandoned =
        tokio::time::timeout(Duration::from_millis(200), storage.current_holder("page")).await;
    group.thaw(0);
    assert!(abandoned.is_err(), "the frozen master answers nothing");
    let before = connections_received(&mut admin).await;
    assert_eq!(storage.current_holder("page").await, Ok(None));
    assert_eq!(
        connections_received(&mut admin).await - before,
        1,
        "the next lookup opened a new connection to the master"
    );
}

/// A storage's lookup right after a failover, while a sentinel listed first
/// has not heard of it: the lookup follows the sentinel with the newest
/// `config-epoch`, not the first that answers. The stale sentinel is one of
/// a second group's (same master name, no failover, so epoch 0): it names a
/// server that is a master and knows nothing of the lock, which is what a
/// sentinel that missed the failover names too (the old master), and which a
/// lookup asking only the first answering sentinel reads (the holder: none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_follows_the_sentinel_that_knows_the_latest_failover() {
    let group = SentinelGroup::start_with_acl().await;
    let stale = SentinelGroup::start_with_acl().await;
    // A failover in `group` (its epoch becomes 1), asked of one sentinel.
    let admin = &group.sentinel_addrs_as(ADMIN)[0];
    let mut sentinel = raw(&format!("redis://{admin}/")).await;
    let failover = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(group.master_name())
        .clone();
    let _: String = query(&mut sentinel, &failover).await;
    group.wait_master(1, FAILOVER).await.unwrap();

    let (_b, lease) = granted_to(&group, "b", "x").await;
    let mut list = vec![stale.sentinel_addrs_as(WORKER)[0].clone()];
    list.extend(group.sentinel_addrs_as(WORKER));
    let storage = RedisSentinelLock::connect(&list, group.master_name())
        .await
        .unwrap();
    assert_eq!(
        storage.current_holder("x").await.unwrap(),
        holder_of(&lease),
        "the lookup followed the sentinel listed first, which missed the failover"
    );
    lease.release().await.unwrap();
}

/// Every holder lookup asks every sentinel; a new connection each time
/// (name resolution, TCP, `AUTH`) once took longer than a storage's 500 ms
/// on a loaded machine. The lookups keep one connection per sentinel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_lookups_keep_one_connection_per_sentinel() {
    let group = SentinelGroup::start_with_acl().await;
    let storage = client(&group, "storage").await;
    assert_eq!(storage.current_holder("page").await, Ok(None));
    let mut sentinels = Vec::new();
    for admin in group.sentinel_addrs_as(ADMIN) {
        sentinels.push(raw(&format!("redis://{admin}/")).await);
    }
    let mut before = Vec::new();
    for s in &mut sentinels {
        before.push(connections_received(s).await);
    }
    for _ in 0..20 {
        assert_eq!(storage.current_holder("page").await, Ok(None));
    }
    for (i, s) in sentinels.iter_mut().enumerate() {
        assert_eq!(
            connections_received(s).await - before[i],
            0,
            "sentinel {i} was connected to anew by 20 lookups"
        );
    }
}
