//! The claims every fenced lock backend must meet, as test bodies shared by
//! the backends' modules. Each takes a connected service and a
//! lock name nobody else uses.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::{AcquireOptions, HolderLookup, LockError, LockService};
use tokio::time::Instant;

use super::{assert_timeout, held_with, holder_of};

/// Many tasks, many acquisitions of one lock: never two holders at once.
///
/// Checked three ways: an in-use flag that must be clear on entry; a counter
/// incremented non-atomically (read, yield, write) that must end exact; and the
/// holders' intervals, from "grant answered" to "release sent" (each inside the
/// service's own view of the hold), ordered by token, must not overlap.
pub async fn mutual_exclusion_under_contention(
    svc: Arc<dyn LockService>,
    name: &str,
    tasks: usize,
    rounds: usize,
) {
    let in_use = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let holds = Arc::new(Mutex::new(Vec::<(u64, Instant, Instant)>::new()));
    let mut joins = Vec::new();
    for _ in 0..tasks {
        let (svc, in_use, counter, holds) =
            (svc.clone(), in_use.clone(), counter.clone(), holds.clone());
        let name = name.to_string();
        joins.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let lease = svc
                    .acquire(&name, Duration::from_secs(10), Duration::from_secs(30))
                    .await
                    .expect("acquire under contention");
                let start = Instant::now();
                assert!(
                    !in_use.swap(true, Ordering::SeqCst),
                    "two holders of {name} at once"
                );
                let seen = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(seen + 1, Ordering::SeqCst);
                in_use.store(false, Ordering::SeqCst);
                let token = lease.token().expect("fenced backend").get();
                let end = Instant::now();
                holds.lock().unwrap().push((token, start, end));
                lease.release().await.expect("release own lease");
            }
        }));
    }
    for j in joins {
        j.await.expect("contender task");
    }
    let total = (tasks * rounds) as u64;
    assert_eq!(counter.load(Ordering::SeqCst), total, "lost updates");
    let mut holds = holds.lock().unwrap().clone();
    assert_eq!(holds.len() as u64, total);
    holds.sort_by_key(|h| h.0);
    for pair in holds.windows(2) {
        let (t1, _, end1) = pair[0];
        let (t2, start2, _) = pair[1];
        assert!(t2 > t1, "token {t2} repeated");
        assert!(
            start2 >= end1,
            "hold with token {t2} began before hold {t1} ended"
        );
    }
}

/// Successive grants of one lock carry strictly increasing tokens.
pub async fn tokens_strictly_increase(svc: &dyn LockService, name: &str, grants: usize) -> u64 {
    let mut last = 0;
    for _ in 0..grants {
        let lease = svc
            .acquire(name, Duration::from_secs(5), Duration::ZERO)
            .await
            .expect("uncontended acquire");
        let token = lease.token().expect("fenced backend").get();
        assert!(token > last, "token {token} after {last}");
        last = token;
        lease.release().await.expect("release");
    }
    last
}

/// After a restart of its server, the service's next grant of `name`
/// carries a token above `before`, the last one before the restart. `wait`
/// gives the client the time to replace its dead connections.
pub async fn the_next_token_is_higher(
    svc: &dyn LockService,
    name: &str,
    before: u64,
    wait: Duration,
) {
    let after = svc
        .acquire(name, Duration::from_secs(5), wait)
        .await
        .expect("acquire after restart");
    assert!(after.token().unwrap().get() > before);
    after.release().await.unwrap();
}

/// A holder whose lease expired releases late: nothing happens to the next
/// holder, who still holds (a contender with wait = 0 is refused).
pub async fn late_release_is_a_no_op(svc: &dyn LockService, name: &str, ttl: Duration) {
    let first = held_with(svc, name, AcquireOptions::new(ttl).auto_renew(false)).await;
    tokio::time::sleep(ttl + Duration::from_millis(100)).await; // the scenario: overstay
    assert!(first.is_lost(), "validity passed, the lease must say so");
    let second = svc
        .acquire(name, Duration::from_secs(5), Duration::from_secs(5))
        .await
        .expect("second acquire after expiry");
    let late = first.release().await;
    assert!(
        matches!(late, Err(LockError::NotHeld { .. })),
        "late release answered {late:?}"
    );
    // The second holder still holds after the late release.
    let contender = svc.acquire(name, Duration::from_secs(5), Duration::ZERO);
    assert_timeout(contender.await, "a contender");
    assert!(!second.is_lost());
    second.release().await.expect("second releases");
}

/// When a holder stops renewing, the lock expires and the next holder gets
/// it with a higher token, without anybody releasing.
pub async fn expiry_lets_next_holder_in_with_higher_token(
    svc: &dyn LockService,
    name: &str,
    ttl: Duration,
) {
    let first = held_with(svc, name, AcquireOptions::new(ttl).auto_renew(false)).await;
    let t1 = first.token().unwrap().get();
    let started = Instant::now();
    let second = svc
        .acquire(name, Duration::from_secs(5), ttl * 10)
        .await
        .expect("next holder gets the lock after expiry");
    assert!(
        started.elapsed() >= ttl / 2,
        "granted after {:?}, before the first lease could have expired",
        started.elapsed()
    );
    assert!(second.token().unwrap().get() > t1);
    assert!(first.is_lost());
    second.release().await.expect("release");
    drop(first);
}

/// The watchdog keeps a lease alive far past its TTL: a contender that tries
/// without waiting is refused throughout, and the lease never reports lost.
///
/// The TTL is 600 ms rather than less: renewals at a third of it must get
/// through on a shared, loaded 2-core machine.
pub async fn renewal_keeps_lease_past_ttl(svc: &dyn LockService, name: &str) {
    let ttl = Duration::from_millis(600);
    let lease = svc
        .acquire(name, ttl, Duration::ZERO)
        .await
        .expect("acquire");
    let until = Instant::now() + ttl * 4;
    let mut tries = 0;
    while Instant::now() < until {
        let contender = svc.acquire(name, ttl, Duration::ZERO).await;
        assert!(
            matches!(contender, Err(LockError::Timeout { .. })),
            "contender got {contender:?} after {tries} refusals"
        );
        assert!(!lease.is_lost(), "lease lost: {:?}", lease.lost_reason());
        tries += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(tries >= 10);
    lease.release().await.expect("release after long hold");
}

/// Zero TTL and empty names are refused before anything is sent.
pub async fn bad_requests_are_invalid_config(svc: &dyn LockService) {
    assert_eq!(
        svc.acquire("x", Duration::ZERO, Duration::ZERO)
            .await
            .unwrap_err(),
        LockError::InvalidConfig("ttl is zero".into())
    );
    assert_eq!(
        svc.acquire("", Duration::from_secs(1), Duration::ZERO)
            .await
            .unwrap_err(),
        LockError::InvalidConfig("lock name is empty".into())
    );
}

/// Acquire with a short TTL and watchdog on, then let `kill` take the server
/// away: the lost signal must fire within about a TTL.
pub async fn lost_signal_fires_within(
    svc: &dyn LockService,
    name: &str,
    ttl: Duration,
    kill: impl FnOnce(),
    bound: Duration,
) {
    let lease = svc
        .acquire(name, ttl, Duration::ZERO)
        .await
        .expect("acquire");
    let mut signal = lease.lost_signal();
    assert!(!signal.is_lost());
    kill();
    let killed = Instant::now();
    let reason = tokio::time::timeout(bound, signal.lost())
        .await
        .unwrap_or_else(|_| panic!("lost signal did not fire within {bound:?} of the kill"));
    assert!(lease.is_lost());
    eprintln!("lost after {:?}: {reason}", killed.elapsed());
}

/// Who holds the lock, as the service itself answers a third party: nobody,
/// then exactly the grant's client and token, then nobody after the release;
/// with `expires`, also nobody once a lease that was not renewed lapsed.
/// `svc` must have been built with client id `client`.
pub async fn holder_lookup_names_the_client_and_token(
    svc: &dyn LockService,
    lookup: &dyn HolderLookup,
    client: &str,
    name: &str,
    expires: bool,
) {
    assert_eq!(lookup.issuer(), svc.issuer());
    assert_eq!(svc.client_id(), client);
    assert_eq!(lookup.current_holder(name).await.unwrap(), None);

    let lease = svc
        .acquire(name, Duration::from_secs(10), Duration::ZERO)
        .await
        .expect("acquire");
    assert_eq!(lease.client_id(), client);
    assert_eq!(
        lookup.current_holder(name).await.unwrap(),
        holder_of(&lease)
    );
    lease.release().await.expect("release");
    assert_eq!(lookup.current_holder(name).await.unwrap(), None);

    if expires {
        let ttl = Duration::from_millis(300);
        let lease = held_with(svc, name, AcquireOptions::new(ttl).auto_renew(false)).await;
        assert!(lookup.current_holder(name).await.unwrap().is_some());
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        assert_eq!(
            lookup.current_holder(name).await.unwrap(),
            None,
            "a lapsed lease still reported as held"
        );
        drop(lease);
    }
}

/// Dropping a lease releases it in the background: another client gets the
/// lock long before the lease's 30 s TTL would have let it in.
pub async fn dropped_lease_is_released_in_the_background(svc: &dyn LockService, name: &str) {
    let lease = svc
        .acquire(name, Duration::from_secs(30), Duration::ZERO)
        .await
        .expect("acquire");
    let t1 = lease.token().expect("fenced backend");
    drop(lease);
    let next = svc
        .acquire(name, Duration::from_secs(30), Duration::from_secs(10))
        .await
        .expect("the dropped lease was released, not left to its TTL");
    assert!(next.token().unwrap() > t1);
    next.release().await.unwrap();
}
