//! Who is waiting for which lock in this process, and how a notification
//! from the lock service (a Redis pub/sub message, a PostgreSQL `NOTIFY`)
//! reaches exactly the waiters it is for.
//!
//! A waiter registers under a key (the Redis channel, or the lock name for
//! PostgreSQL) with its waiter id when it waits in a fair queue, or without
//! one when any release concerns it (non-fair). A notification names a key
//! and a target: `*` wakes every waiter of the key (but a fair waiter that
//! knows somebody is ahead of it in the queue, see
//! [`Wakers::register_behind`]), a waiter id wakes that waiter (and the
//! non-fair ones, who try on every release). When the
//! connection that carries the notifications is lost, every waiter is woken,
//! since a message may have been lost with it.
//!
//! A registration counts the notifications meant for it in a `watch`
//! channel. The waiter marks the count as seen ([`Registration::arm`])
//! *before* each try, so that a release that happens between its try and
//! its wait is not missed: the wait returns at once.

// The MariaDB lease table waits on a bell, not on these registrations.
#![cfg_attr(
    not(any(feature = "redis", feature = "lease-postgres")),
    allow(dead_code)
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::{Lease, LockError, WaitStats};

/// Called with a key whose last waiter just left (Redis unsubscribes then).
type OnEmpty = Box<dyn Fn(&str) + Send + Sync>;

/// The waiters of this process, by key.
#[derive(Default)]
pub(crate) struct Wakers {
    routes: Mutex<HashMap<String, Vec<Route>>>,
    next_id: AtomicU64,
    on_empty: Option<OnEmpty>,
}

struct Route {
    id: u64,
    /// `Some` for a waiter in a fair queue: only messages naming it (or `*`)
    /// wake it. `None`: every message of the key wakes it.
    waiter: Option<Arc<str>>,
    /// Set while the fair waiter knows a live place is ahead of its own:
    /// then `*` does not wake it, only a message naming it.
    behind: Option<Behind>,
    /// Where a hand-over to this waiter leaves its token (see
    /// [`Wakers::hand_over`]).
    handed: Option<Arc<AtomicI64>>,
    tx: watch::Sender<u64>,
}

/// A fair waiter's `behind` flag, and the count of `*` messages it let pass
/// because of it: a try in flight may find the waiter first after all, and
/// a `*` that came meanwhile must then still end its next wait.
#[derive(Clone)]
struct Behind {
    flag: Arc<AtomicBool>,
    skipped: Arc<AtomicU64>,
}

impl Wakers {
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_on_empty(on_empty: OnEmpty) -> Self {
        Wakers {
            on_empty: Some(on_empty),
            ..Wakers::default()
        }
    }

    /// Register a waiter under `key`. It is woken from now on.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn register(self: &Arc<Self>, key: &str, waiter: Option<Arc<str>>) -> Registration {
        self.register_behind(key, waiter, None, None)
    }

    /// Register a fair waiter (`waiter` is `Some`) whose tries keep `behind`
    /// set while another live place is ahead of its own: a `*` (a release
    /// that named nobody) wakes it only while `behind` is clear, so such a
    /// release wakes the first in line, not the whole queue. A waiter that
    /// becomes first because the one ahead was granted is named by that
    /// one's release. A release that hands the lock to this waiter stores
    /// the token in `handed` before it wakes it.
    pub(crate) fn register_behind(
        self: &Arc<Self>,
        key: &str,
        waiter: Option<Arc<str>>,
        behind: Option<Arc<AtomicBool>>,
        handed: Option<Arc<AtomicI64>>,
    ) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = watch::channel(0u64);
        let behind = behind.map(|flag| Behind {
            flag,
            skipped: Arc::default(),
        });
        let registration = Registration {
            wakers: self.clone(),
            key: key.to_string(),
            id,
            rx,
            behind: behind.clone(),
            skipped_seen: 0,
        };
        self.routes
            .lock()
            .expect("wakers mutex")
            .entry(key.to_string())
            .or_default()
            .push(Route {
                id,
                waiter,
                behind,
                handed,
                tx,
            });
        registration
    }

    /// Whether anybody waits under `key` now.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn has(&self, key: &str) -> bool {
        self.routes
            .lock()
            .expect("wakers mutex")
            .get(key)
            .is_some_and(|v| !v.is_empty())
    }

    /// Whether nobody waits under any key.
    #[cfg_attr(not(feature = "lease-postgres"), allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        self.routes.lock().expect("wakers mutex").is_empty()
    }

    /// How many waiters have registered so far (under any key): a count that
    /// has not moved between two looks means nobody came in between.
    #[cfg_attr(not(feature = "lease-postgres"), allow(dead_code))]
    pub(crate) fn registrations(&self) -> u64 {
        self.next_id.load(Ordering::SeqCst)
    }

    /// A notification for `key`: wake its waiters that `target` concerns.
    pub(crate) fn notify(&self, key: &str, target: &str) {
        let routes = self.routes.lock().expect("wakers mutex");
        for route in routes.get(key).into_iter().flatten() {
            let concerned = match (&route.waiter, &route.behind) {
                (None, _) => true,
                (Some(_), Some(b)) if target == "*" => {
                    let behind = b.flag.load(Ordering::SeqCst);
                    if behind {
                        b.skipped.fetch_add(1, Ordering::SeqCst);
                    }
                    !behind
                }
                (Some(_), None) if target == "*" => true,
                (Some(w), _) => **w == *target,
            };
            if concerned {
                route.tx.send_modify(|n| *n += 1);
            }
        }
    }

    /// A release handed the lock under `key` to `waiter` with `token`: the
    /// token goes to that waiter's `handed` (before the wake, so that the
    /// woken waiter finds it), then it is woken as by a notification naming
    /// it.
    #[cfg_attr(not(feature = "lease-postgres"), allow(dead_code))]
    pub(crate) fn hand_over(&self, key: &str, waiter: &str, token: i64) {
        {
            let routes = self.routes.lock().expect("wakers mutex");
            for route in routes.get(key).into_iter().flatten() {
                if let (Some(w), Some(h)) = (&route.waiter, &route.handed) {
                    if **w == *waiter {
                        h.store(token, Ordering::SeqCst);
                    }
                }
            }
        }
        self.notify(key, waiter);
    }

    /// The notifications may have been lost: wake everybody.
    pub(crate) fn notify_all(&self) {
        let routes = self.routes.lock().expect("wakers mutex");
        for route in routes.values().flatten() {
            route.tx.send_modify(|n| *n += 1);
        }
    }

    fn remove(&self, key: &str, id: u64) {
        let emptied = {
            let mut routes = self.routes.lock().expect("wakers mutex");
            let Some(list) = routes.get_mut(key) else {
                return;
            };
            list.retain(|r| r.id != id);
            let empty = list.is_empty();
            if empty {
                routes.remove(key);
            }
            empty
        };
        if emptied {
            if let Some(f) = &self.on_empty {
                f(key);
            }
        }
    }
}

/// One waiter's registration; dropping it unregisters.
pub(crate) struct Registration {
    wakers: Arc<Wakers>,
    key: String,
    id: u64,
    rx: watch::Receiver<u64>,
    behind: Option<Behind>,
    /// `behind.skipped` at the last [`arm`](Self::arm).
    skipped_seen: u64,
}

impl Registration {
    /// Mark every notification so far as seen. Call before each try.
    pub(crate) fn arm(&mut self) {
        self.rx.borrow_and_update();
        if let Some(b) = &self.behind {
            self.skipped_seen = b.skipped.load(Ordering::SeqCst);
        }
    }

    /// Wait for a notification after the last [`arm`](Self::arm), or for
    /// `bound`. True when a notification came, including a `*` that was
    /// let pass while the waiter counted itself behind if its last try
    /// found it first.
    pub(crate) async fn wait(&mut self, bound: Duration) -> bool {
        if let Some(b) = &self.behind {
            if !b.flag.load(Ordering::SeqCst)
                && b.skipped.load(Ordering::SeqCst) != self.skipped_seen
            {
                return true;
            }
        }
        tokio::select! {
            changed = self.rx.changed() => changed.is_ok(),
            _ = tokio::time::sleep(bound) => false,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.wakers.remove(&self.key, self.id);
    }
}

/// The counters behind [`WaitStats`].
#[derive(Debug, Default)]
pub(crate) struct WaitCounters {
    tries: std::sync::atomic::AtomicU64,
    notified: std::sync::atomic::AtomicU64,
    timed_out: std::sync::atomic::AtomicU64,
}

impl WaitCounters {
    pub(crate) fn snapshot(&self) -> WaitStats {
        use std::sync::atomic::Ordering::Relaxed;
        WaitStats {
            tries: self.tries.load(Relaxed),
            notified: self.notified.load(Relaxed),
            timed_out: self.timed_out.load(Relaxed),
        }
    }

    fn count(counter: &std::sync::atomic::AtomicU64) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Count a try's answer as a try unless nothing was sent for it (a
    /// hand-over); the lease, or how long to wait after the refusal.
    fn sent(&self, answer: Try) -> Result<Lease, Duration> {
        match answer {
            Try::Handed(lease) => Ok(lease),
            Try::Granted(lease) => {
                Self::count(&self.tries);
                Ok(lease)
            }
            Try::Refused(bound) => {
                Self::count(&self.tries);
                Err(bound)
            }
        }
    }
}

/// What one grant attempt of a notified lock answered.
pub(crate) enum Try {
    Granted(Lease),
    /// Granted by a release that handed the lock to this waiter and said so
    /// in its notification (the fair PostgreSQL lock): nothing was sent, so
    /// it is not counted as a try.
    #[cfg_attr(not(feature = "lease-postgres"), allow(dead_code))]
    Handed(Lease),
    /// Refused. The service said how long at most to wait before trying
    /// again if no notification comes (the holder's remaining lease, or the
    /// place of the waiter ahead; the backend caps it at its fallback poll).
    Refused(Duration),
}

/// How a waiter of a notified lock waits between tries.
pub(crate) trait Waiter: Send {
    /// Whether to try once more right after [`wait_for_grant`] set the waiter
    /// up: true when setting up is a subscription, which must come before the
    /// try whose refusal a wait follows, or a release between that try and
    /// the subscription would be missed.
    const TRY_AFTER_SETUP: bool;

    /// Mark the notifications so far as seen; called right before each try.
    fn arm(&mut self);

    /// Wait for a notification, or `bound`. True when notified.
    fn wait(
        &mut self,
        bound: Duration,
    ) -> impl std::future::Future<Output = Result<bool, LockError>> + Send;
}

/// A waiter subscribed after its first refusal (a Redis channel, a
/// PostgreSQL `LISTEN`), or `None` when notifications are unavailable: then
/// it polls at the bound. Subscribed after a refusal, it tries once more
/// before it waits.
pub(crate) struct SubscribedWaiter(pub(crate) Option<Registration>);

impl Waiter for SubscribedWaiter {
    const TRY_AFTER_SETUP: bool = true;

    fn arm(&mut self) {
        if let Some(r) = &mut self.0 {
            r.arm();
        }
    }

    async fn wait(&mut self, bound: Duration) -> Result<bool, LockError> {
        Ok(match &mut self.0 {
            Some(r) => r.wait(bound).await,
            None => {
                tokio::time::sleep(bound).await;
                false
            }
        })
    }
}

/// The loop of a notified lock, as Redisson's `RedissonLock.lock` runs it:
/// try; on a refusal set the waiter up (subscribe) and try again; then wait
/// for a notification or the bound the refusal gave, and try again; until
/// granted or `wait` runs out. The first try goes out before any setup, so an
/// uncontended acquire costs one round trip.
pub(crate) async fn wait_for_grant<W, T, TF, S, SF>(
    name: &str,
    wait: Duration,
    counters: &WaitCounters,
    mut attempt: T,
    setup: S,
) -> Result<Lease, LockError>
where
    W: Waiter,
    T: FnMut() -> TF,
    TF: std::future::Future<Output = Result<Try, LockError>>,
    S: FnOnce() -> SF,
    SF: std::future::Future<Output = W>,
{
    let start = Instant::now();
    let deadline = start + wait;
    let timeout = |now: Instant| LockError::Timeout {
        name: name.to_string(),
        waited: now - start,
    };
    let mut bound = match counters.sent(attempt().await?) {
        Ok(lease) => return Ok(lease),
        Err(bound) => bound,
    };
    if Instant::now() >= deadline {
        return Err(timeout(Instant::now()));
    }
    let mut waiter = setup().await;
    let mut try_now = W::TRY_AFTER_SETUP;
    loop {
        if try_now {
            waiter.arm();
            match counters.sent(attempt().await?) {
                Ok(lease) => return Ok(lease),
                Err(b) => bound = b,
            }
        }
        try_now = true;
        let now = Instant::now();
        if now >= deadline {
            return Err(timeout(now));
        }
        let bound = bound.max(Duration::from_millis(1)).min(deadline - now);
        if waiter.wait(bound).await? {
            WaitCounters::count(&counters.notified);
        } else {
            WaitCounters::count(&counters.timed_out);
        }
    }
}

/// Where a fair waiter keeps its place: how to give the place up.
pub(crate) trait Queue: Send + Sync + 'static {
    /// Give up `waiter`'s place in lock `name`'s queue (best effort: a
    /// place that is not given up lapses).
    fn leave(&self, name: &str, waiter: &str) -> impl std::future::Future<Output = ()> + Send;
}

/// A fair waiter's place in the lock service's queue, from its first
/// refused try until [`QueuePlace::settle`]. Dropped before that (the
/// acquire future was dropped), it is given up in the background.
pub(crate) struct QueuePlace<Q: Queue> {
    /// `None`: no place to give up (granted, non-fair, or a try-lock).
    queue: Option<Q>,
    name: String,
    waiter: Arc<str>,
}

impl<Q: Queue> QueuePlace<Q> {
    /// The place of `waiter` in `queue`, if it takes one.
    pub(crate) fn new(queue: Option<Q>, name: &str, waiter: Arc<str>) -> Self {
        QueuePlace {
            queue,
            name: name.to_string(),
            waiter,
        }
    }

    /// After the acquire. Unless the place is `gone` already (it went with
    /// the grant, or the waiter gave it up otherwise), leave the queue now,
    /// not in the background, so that a process that exits right after
    /// still leaves no place for others to wait behind.
    pub(crate) async fn settle(mut self, gone: bool) {
        match self.queue.take() {
            Some(queue) if !gone => queue.leave(&self.name, &self.waiter).await,
            _ => {}
        }
    }
}

impl<Q: Queue> Drop for QueuePlace<Q> {
    fn drop(&mut self) {
        let Some(queue) = self.queue.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (name, waiter) = (std::mem::take(&mut self.name), self.waiter.clone());
        rt.spawn(async move { queue.leave(&name, &waiter).await });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_targeted_message_wakes_only_its_waiter_and_the_non_fair_ones() {
        let wakers = Arc::new(Wakers::default());
        let mut a = wakers.register("k", Some("a".into()));
        let mut b = wakers.register("k", Some("b".into()));
        let mut any = wakers.register("k", None);
        let mut other = wakers.register("other", None);
        for r in [&mut a, &mut b, &mut any, &mut other] {
            r.arm();
        }
        wakers.notify("k", "a");
        let bound = Duration::from_millis(10);
        assert!(a.wait(bound).await);
        assert!(!b.wait(bound).await);
        assert!(any.wait(bound).await);
        assert!(!other.wait(bound).await);
        wakers.notify("k", "*");
        assert!(b.wait(bound).await);
        wakers.notify_all();
        assert!(other.wait(bound).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_naming_nobody_skips_a_fair_waiter_that_is_behind() {
        let wakers = Arc::new(Wakers::default());
        let behind = Arc::new(AtomicBool::new(true));
        let mut first = wakers.register_behind("k", Some("a".into()), Some(Arc::default()), None);
        let mut second = wakers.register_behind("k", Some("b".into()), Some(behind.clone()), None);
        let mut any = wakers.register("k", None);
        for r in [&mut first, &mut second, &mut any] {
            r.arm();
        }
        wakers.notify("k", "*");
        let bound = Duration::from_millis(10);
        assert!(first.wait(bound).await);
        assert!(!second.wait(bound).await, "behind: not woken by `*`");
        assert!(any.wait(bound).await);
        wakers.notify("k", "b");
        assert!(second.wait(bound).await, "named: woken though behind");
        behind.store(false, Ordering::SeqCst);
        wakers.notify("k", "*");
        assert!(second.wait(bound).await, "first in line now");
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_naming_nobody_during_a_try_that_finds_the_waiter_first_is_not_missed() {
        let wakers = Arc::new(Wakers::default());
        let behind = Arc::new(AtomicBool::new(true));
        let mut r = wakers.register_behind("k", Some("a".into()), Some(behind.clone()), None);
        r.arm(); // the try goes out, still counted behind
        wakers.notify("k", "*"); // a release while it is in flight
        behind.store(false, Ordering::SeqCst); // the try: first after all
        assert!(r.wait(Duration::from_secs(3600)).await);
        r.arm();
        assert!(!r.wait(Duration::from_millis(1)).await, "seen once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hand_over_leaves_the_token_with_its_waiter_only_and_wakes_it() {
        let wakers = Arc::new(Wakers::default());
        let (ha, hb) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
        let mut a = wakers.register_behind("k", Some("a".into()), None, Some(ha.clone()));
        let mut b = wakers.register_behind("k", Some("b".into()), None, Some(hb.clone()));
        a.arm();
        b.arm();
        wakers.hand_over("k", "a", 42);
        assert!(
            a.wait(Duration::from_secs(1)).await,
            "the waiter handed the lock is woken"
        );
        assert_eq!(ha.load(Ordering::SeqCst), 42);
        assert!(
            !b.wait(Duration::from_secs(1)).await,
            "another fair waiter is not"
        );
        assert_eq!(hb.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_between_arm_and_wait_is_not_missed() {
        let wakers = Arc::new(Wakers::default());
        let mut a = wakers.register("k", None);
        a.arm();
        wakers.notify("k", "*"); // while the waiter was trying
        assert!(a.wait(Duration::from_secs(3600)).await);
        a.arm();
        assert!(!a.wait(Duration::from_millis(1)).await, "seen once");
    }

    #[test]
    fn the_last_waiter_leaving_calls_on_empty() {
        let left = Arc::new(Mutex::new(vec![]));
        let wakers = Arc::new(Wakers::with_on_empty(Box::new({
            let left = left.clone();
            move |k: &str| left.lock().unwrap().push(k.to_string())
        })));
        let a = wakers.register("k", None);
        let b = wakers.register("k", None);
        drop(a);
        assert!(wakers.has("k"));
        drop(b);
        assert!(!wakers.has("k"));
        assert_eq!(*left.lock().unwrap(), vec!["k".to_string()]);
    }
}
