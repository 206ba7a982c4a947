//! The generic lease logic in `fencelock` (watchdog, lost signal, retry
//! loop), on paused tokio time. The backend side is a scripted [`Grant`] that
//! answers renewals as the test says: this tests `Lease` itself, not a service
//! (the backends' own tests run against real servers).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::{
    lost_channel, poll_until_granted, AcquireOptions, Fencing, Grant, Lease, LockError, NewLease,
    Token,
};
use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::time::Instant;

#[derive(Clone, Copy, PartialEq)]
enum Answer {
    Renewed,
    Refused,
    Unreachable,
}

/// A grant whose renewals answer `answer`, recording when each was asked.
struct Scripted {
    answer: Mutex<Answer>,
    renewals: Mutex<Vec<Instant>>,
    released: AtomicBool,
}

impl Scripted {
    fn new(answer: Answer) -> Arc<Self> {
        Arc::new(Scripted {
            answer: Mutex::new(answer),
            renewals: Mutex::new(Vec::new()),
            released: AtomicBool::new(false),
        })
    }

    fn renewals(&self) -> Vec<Instant> {
        self.renewals.lock().unwrap().clone()
    }

    fn set(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }
}

impl Grant for Scripted {
    fn renew(&self, ttl: Duration) -> BoxFuture<'_, Result<Duration, LockError>> {
        self.renewals.lock().unwrap().push(Instant::now());
        let answer = *self.answer.lock().unwrap();
        async move {
            match answer {
                Answer::Renewed => Ok(ttl),
                Answer::Refused => Err(LockError::NotHeld {
                    name: "page".into(),
                    reason: "refused by the test".into(),
                }),
                Answer::Unreachable => Err(LockError::unavailable("test", "unreachable")),
            }
        }
        .boxed()
    }

    fn release(&self) -> BoxFuture<'_, Result<(), LockError>> {
        self.released.store(true, Ordering::SeqCst);
        async { Ok(()) }.boxed()
    }
}

/// A lease of lock `page` with token 7, granted now for `ttl`, renewed by
/// `grant`.
fn new_lease(grant: Arc<Scripted>, ttl: Duration) -> NewLease {
    NewLease {
        name: "page".into(),
        issuer: "test".into(),
        client_id: "test-client".into(),
        fencing: Fencing::Token(Token::new(7).unwrap()),
        ttl,
        requested_at: Instant::now(),
        validity: Some(ttl),
        auto_renew: true,
        grant,
        lost_trigger: None,
    }
}

fn lease(grant: Arc<Scripted>, ttl: Duration, auto_renew: bool) -> Lease {
    Lease::new(NewLease {
        auto_renew,
        ..new_lease(grant, ttl)
    })
}

const TTL: Duration = Duration::from_secs(3);

#[tokio::test(start_paused = true)]
async fn watchdog_renews_at_a_third_of_the_ttl_and_keeps_the_lease() {
    let grant = Scripted::new(Answer::Renewed);
    let start = Instant::now();
    let lease = lease(grant.clone(), TTL, true);
    tokio::time::sleep(TTL * 4 + Duration::from_millis(10)).await;
    assert!(!lease.is_lost(), "{:?}", lease.lost_reason());
    let renewals = grant.renewals();
    assert_eq!(renewals.len(), 12, "one renewal per ttl/3 over 4 ttls");
    for (i, at) in renewals.iter().enumerate() {
        assert_eq!(*at - start, TTL / 3 * (i as u32 + 1));
    }
    assert!(lease.remaining().unwrap() > TTL / 2);
}

#[tokio::test(start_paused = true)]
async fn refused_renewal_fires_the_lost_signal_at_once() {
    let grant = Scripted::new(Answer::Refused);
    let start = Instant::now();
    let lease = lease(grant, TTL, true);
    let reason = lease.lost_signal().lost().await;
    assert_eq!(start.elapsed(), TTL / 3, "lost at the first renewal");
    assert!(reason.contains("refused by the test"), "{reason}");
    assert!(lease.is_lost());
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_fire_the_lost_signal_when_validity_passes() {
    let grant = Scripted::new(Answer::Unreachable);
    let start = Instant::now();
    let lease = lease(grant.clone(), TTL, true);
    let reason = lease.lost_signal().lost().await;
    assert_eq!(
        start.elapsed(),
        TTL,
        "not before the validity passes, not after"
    );
    assert!(reason.contains("validity passed"), "{reason}");
    assert!(grant.renewals().len() > 2, "the watchdog kept retrying");
}

#[tokio::test(start_paused = true)]
async fn a_lease_recovers_when_renewals_succeed_again_in_time() {
    let grant = Scripted::new(Answer::Unreachable);
    let lease = lease(grant.clone(), TTL, true);
    tokio::time::sleep(TTL / 2).await;
    grant.set(Answer::Renewed);
    tokio::time::sleep(TTL * 2).await;
    assert!(!lease.is_lost(), "{:?}", lease.lost_reason());
}

#[tokio::test(start_paused = true)]
async fn without_auto_renew_the_lease_is_lost_at_its_validity() {
    let grant = Scripted::new(Answer::Renewed);
    let start = Instant::now();
    let lease = lease(grant.clone(), TTL, false);
    tokio::time::sleep(TTL - Duration::from_millis(1)).await;
    assert!(!lease.is_lost());
    let reason = lease.lost_signal().lost().await;
    assert_eq!(start.elapsed(), TTL);
    assert!(reason.contains("validity passed"), "{reason}");
    assert!(grant.renewals().is_empty());
}

#[tokio::test(start_paused = true)]
async fn manual_renew_extends_validity_from_when_it_was_sent() {
    let grant = Scripted::new(Answer::Renewed);
    let lease = lease(grant, TTL, false);
    tokio::time::sleep(TTL / 2).await;
    let sent = Instant::now();
    assert_eq!(lease.renew().await, Ok(TTL));
    assert_eq!(lease.remaining(), Some(TTL - (Instant::now() - sent)));
}

/// A process frozen past its validity learns it on the first check, before
/// the watchdog task has run.
#[tokio::test(start_paused = true)]
async fn is_lost_checks_the_deadline_itself() {
    let grant = Scripted::new(Answer::Renewed);
    let lease = Lease::new(NewLease {
        fencing: Fencing::Token(Token::new(1).unwrap()),
        requested_at: Instant::now() - TTL * 2,
        ..new_lease(grant, TTL)
    });
    assert!(lease.is_lost());
}

#[tokio::test(start_paused = true)]
async fn backend_trigger_fires_the_lost_signal() {
    let trigger = lost_channel();
    let lease = Lease::new(NewLease {
        fencing: Fencing::Token(Token::new(1).unwrap()),
        validity: None,
        auto_renew: false,
        lost_trigger: Some(trigger.clone()),
        ..new_lease(Scripted::new(Answer::Renewed), TTL)
    });
    tokio::time::sleep(TTL * 10).await;
    assert!(!lease.is_lost(), "no deadline: held until signalled");
    trigger.fire("session expired");
    trigger.fire("second reason is ignored");
    assert_eq!(lease.lost_signal().lost().await, "session expired");
}

#[tokio::test(start_paused = true)]
async fn release_stops_the_watchdog() {
    let grant = Scripted::new(Answer::Renewed);
    let lease = lease(grant.clone(), TTL, true);
    tokio::time::sleep(TTL / 3 + Duration::from_millis(1)).await;
    assert_eq!(grant.renewals().len(), 1);
    lease.release().await.unwrap();
    assert!(grant.released.load(Ordering::SeqCst));
    tokio::time::sleep(TTL * 3).await;
    assert_eq!(grant.renewals().len(), 1, "no renewal after release");
}

#[tokio::test(start_paused = true)]
async fn poll_until_granted_retries_until_granted() {
    let attempts = AtomicUsize::new(0);
    let lease = poll_until_granted("page", Duration::from_secs(10), || {
        let n = attempts.fetch_add(1, Ordering::SeqCst);
        async move { Ok((n == 4).then(|| lease(Scripted::new(Answer::Renewed), TTL, false))) }
    })
    .await
    .expect("granted on the fifth attempt");
    assert_eq!(lease.token(), Token::new(7));
    assert_eq!(attempts.load(Ordering::SeqCst), 5);
}

#[tokio::test(start_paused = true)]
async fn poll_until_granted_times_out_after_wait_and_zero_wait_tries_once() {
    let attempts = AtomicUsize::new(0);
    let start = Instant::now();
    let err = poll_until_granted("page", Duration::from_secs(1), || {
        attempts.fetch_add(1, Ordering::SeqCst);
        async { Ok(None) }
    })
    .await
    .unwrap_err();
    assert!(matches!(err, LockError::Timeout { ref name, .. } if name == "page"));
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(1),
        "waits exactly the wait"
    );
    assert!(attempts.load(Ordering::SeqCst) > 3);

    let attempts = AtomicUsize::new(0);
    let err = poll_until_granted("page", Duration::ZERO, || {
        attempts.fetch_add(1, Ordering::SeqCst);
        async { Ok(None) }
    })
    .await
    .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn poll_until_granted_stops_at_the_first_error() {
    let err = poll_until_granted("page", Duration::from_secs(10), || async {
        Err(LockError::unavailable("test", "down"))
    })
    .await
    .unwrap_err();
    assert_eq!(err, LockError::unavailable("test", "down"));
}

#[test]
fn bad_options_are_invalid_config() {
    let ok = AcquireOptions::new(Duration::from_secs(1));
    assert_eq!(ok.validate("page"), Ok(()));
    assert_eq!(
        ok.validate(""),
        Err(LockError::InvalidConfig("lock name is empty".into()))
    );
    assert_eq!(
        AcquireOptions::new(Duration::ZERO).validate("page"),
        Err(LockError::InvalidConfig("ttl is zero".into()))
    );
    assert_eq!(
        AcquireOptions::new(Duration::from_micros(10)).validate("page"),
        Err(LockError::InvalidConfig("ttl below one millisecond".into()))
    );
}
