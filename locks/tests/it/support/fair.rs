//! The claims of a fair lock whose queue lives in its server (Redis's list,
//! the lease tables' queue table), as test bodies shared by `redis_lock.rs`
//! and `lease_table/`. Each uses the lock `page`, which nobody else uses.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::lease_table::LeaseTable;
use fencelock::redis::RedisLock;
use fencelock::{LockService, Token, WaitStats};
use tokio::time::Instant;

use super::{assert_timeout, granted, held, spawn_acquire};

/// A look at the queue in the server.
pub trait Queue {
    /// Wait (bounded) until the queue of lock `name` holds `n` waiters.
    fn wait_queued(&self, name: &str, n: i64) -> impl Future<Output = ()>;

    /// Wait (bounded) until `n` of this test's waiters block in the server,
    /// where waiters block there (MariaDB); at once elsewhere.
    fn wait_blocked(&self, _n: i64) -> impl Future<Output = ()> {
        async {}
    }
}

/// A fair lock service that counts how its waiters waited.
pub trait Fair: LockService + Clone + 'static {
    fn stats(&self) -> WaitStats;
}

impl Fair for RedisLock {
    fn stats(&self) -> WaitStats {
        self.wait_stats()
    }
}

impl Fair for LeaseTable {
    fn stats(&self) -> WaitStats {
        self.wait_stats()
    }
}

const TTL: Duration = Duration::from_secs(30);

/// Waiters queued one after the other behind `holder` are granted in that
/// order, with increasing tokens, and leave an empty queue.
pub async fn fair_waiters_are_granted_in_the_order_they_queued<S: Fair>(
    holder: &S,
    waiters: Vec<S>,
    queue: &impl Queue,
) {
    let lease = held(holder, "page", TTL).await;
    let order = Arc::new(Mutex::new(vec![]));
    let mut joins = vec![];
    for (i, svc) in (0..).zip(waiters) {
        let order = order.clone();
        joins.push(tokio::spawn(async move {
            let lease = svc
                .acquire("page", TTL, Duration::from_secs(30))
                .await
                .expect("granted in turn");
            order
                .lock()
                .unwrap()
                .push((i, lease.token().unwrap().get()));
            lease.release().await.unwrap();
        }));
        queue.wait_queued("page", i + 1).await;
    }
    lease.release().await.unwrap();
    for j in joins {
        j.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let who: Vec<i64> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(who, vec![0, 1, 2, 3], "first come, first served");
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "{order:?}");
    queue.wait_queued("page", 0).await;
}

/// What starved the waiters of the polled lock: the holder releases and
/// asks again at once. Fair, it queues behind the waiter that was there.
pub async fn a_fair_holder_that_asks_again_at_once_queues_behind_the_waiter<S: Fair>(
    holder: &S,
    waiter: &S,
    queue: &impl Queue,
) {
    let lease = held(holder, "page", TTL).await;
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let lease = waiter
                .acquire("page", TTL, Duration::from_secs(30))
                .await
                .unwrap();
            let token = lease.token();
            lease.release().await.unwrap();
            token
        }
    });
    queue.wait_queued("page", 1).await;
    lease.release().await.unwrap();
    let again = holder
        .acquire("page", TTL, Duration::from_secs(30))
        .await
        .unwrap();
    let waiter_token = waiting.await.unwrap();
    assert!(
        waiter_token < again.token(),
        "the waiter ({waiter_token:?}) was granted before the holder's second grant ({:?})",
        again.token()
    );
    again.release().await.unwrap();
}

/// The lock freed while its first waiter is not looking (frozen, not yet
/// woken): it stays the first waiter's until its place lapses, and the
/// `newcomers`, trying without waiting, are refused.
pub async fn a_free_lock_waits_for_the_first_waiter_and_a_newcomer_is_refused<S: Fair>(
    holder: &S,
    first: &S,
    newcomers: &[S],
    queue: &impl Queue,
) {
    let lease = held(holder, "page", TTL).await;
    let mut waiting = Box::pin(first.acquire("page", TTL, Duration::from_secs(60)));
    tokio::select! {
        r = &mut waiting => panic!("granted while held: {r:?}"),
        () = async { queue.wait_queued("page", 1).await; queue.wait_blocked(1).await } => {}
    }
    lease.release().await.unwrap();
    for newcomer in newcomers {
        let refused = newcomer.acquire("page", TTL, Duration::ZERO).await;
        assert_timeout(refused, "a newcomer while the first waiter is not looking");
    }
    // The first waiter, polled again, finds the release's wake and takes it.
    let granted = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the first waiter is granted at once")
        .unwrap();
    granted.release().await.unwrap();
}

/// A fair waiter that gives up (its place would last 40 s: `quitter`'s
/// fallback poll is 10 s) leaves the queue: only leaving explains an empty
/// queue.
pub async fn a_fair_waiter_that_gives_up_leaves_the_queue<S: Fair>(
    holder: &S,
    quitter: &S,
    queue: &impl Queue,
) {
    let lease = held(holder, "page", TTL).await;
    let gave_up = quitter
        .acquire("page", TTL, Duration::from_millis(300))
        .await;
    assert_timeout(gave_up, "a waiter that gives up");
    queue.wait_queued("page", 0).await;
    lease.release().await.unwrap();
}

/// A waiter whose fallback poll (60 s) and holder's TTL (30 s) are far
/// beyond the test's bound: a prompt grant after the release can only come
/// from the release's wake. `waiter` has sent `tries_before_waiting` tries
/// (as its counters say) once it waits.
pub async fn waiter_is_woken_by_the_release<S: Fair>(
    holder: &S,
    waiter: &S,
    tries_before_waiting: u64,
    queue: &impl Queue,
) {
    let lease = held(holder, "page", TTL).await;
    assert_eq!(holder.stats().tries, 1, "uncontended: one try");
    let waiting = spawn_acquire(waiter, "page", TTL, Duration::from_secs(50));
    harness::wait_until(Duration::from_secs(10), || async {
        match waiter.stats().tries {
            n if n >= tries_before_waiting => Ok(()),
            n => Err(n),
        }
    })
    .await
    .unwrap();
    queue.wait_blocked(1).await;
    let released = Instant::now();
    lease.release().await.unwrap();
    let granted = granted(
        waiting,
        "granted long before the fallback poll or the holder's TTL",
    )
    .await;
    eprintln!("granted {:?} after the release", released.elapsed());
    let stats = waiter.stats();
    assert_eq!(stats.notified, 1, "{stats:?}");
    assert_eq!(stats.timed_out, 0, "{stats:?}");
    assert_eq!(stats.tries, tries_before_waiting + 1, "{stats:?}");
    assert!(granted.token() > Some(Token::MIN));
    granted.release().await.unwrap();
}
