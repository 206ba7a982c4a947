//! What the tests of every backend share: the claims every fenced lock must
//! meet (`contract`), and the steps their scenarios keep repeating, each
//! failing at the caller's line.

pub mod contract;
pub mod fair;
pub mod redis;
pub mod zookeeper;

use std::future::Future;
use std::panic::Location;
use std::time::Duration;

use fencelock::{AcquireOptions, Holder, Lease, LockError, LockService};
use tokio::task::JoinHandle;

/// An acquire of the lock `name` by `svc`, in a task of its own (as another
/// client would run it).
pub fn spawn_acquire<S>(
    svc: &S,
    name: &str,
    ttl: Duration,
    wait: Duration,
) -> JoinHandle<Result<Lease, LockError>>
where
    S: LockService + Clone + 'static,
{
    let (svc, name) = (svc.clone(), name.to_string());
    tokio::spawn(async move { svc.acquire(&name, ttl, wait).await })
}

/// The lease that `task` (a [`spawn_acquire`]) is granted within 10 s;
/// panics with `why`, at the caller's line, if it is not.
#[track_caller]
pub fn granted(
    task: JoinHandle<Result<Lease, LockError>>,
    why: &str,
) -> impl Future<Output = Lease> + '_ {
    let caller = Location::caller();
    async move {
        match tokio::time::timeout(Duration::from_secs(10), task).await {
            Ok(Ok(Ok(lease))) => lease,
            Ok(Ok(Err(e))) => panic!("{caller}: {why}: {e:?}"),
            Ok(Err(e)) => panic!("{caller}: {why}: the acquire's task failed: {e}"),
            Err(_) => panic!("{caller}: {why}: not granted within 10 s"),
        }
    }
}

/// The lease on `name` that `svc` takes at once (nobody holds it); panics
/// at the caller's line if it is refused.
#[track_caller]
pub fn held<'a, S: LockService + ?Sized>(
    svc: &'a S,
    name: &'a str,
    ttl: Duration,
) -> impl Future<Output = Lease> + 'a {
    held_with(svc, name, AcquireOptions::new(ttl))
}

/// The lease on `name` that `svc` is granted with `options`; panics at
/// the caller's line if it is not.
#[track_caller]
pub fn held_with<'a, S: LockService + ?Sized>(
    svc: &'a S,
    name: &'a str,
    options: AcquireOptions,
) -> impl Future<Output = Lease> + 'a {
    let caller = Location::caller();
    async move {
        svc.acquire_with(name, options)
            .await
            .unwrap_or_else(|e| panic!("{caller}: acquire {name}: {e:?}"))
    }
}

/// Takes the lock `name` at once and releases it; panics at the caller's
/// line if either fails.
#[track_caller]
pub fn take_and_release<'a, S: LockService + ?Sized>(
    svc: &'a S,
    name: &'a str,
    ttl: Duration,
) -> impl Future<Output = ()> + 'a {
    let caller = Location::caller();
    let lease = held(svc, name, ttl);
    async move {
        let released = lease.await.release().await;
        released.unwrap_or_else(|e| panic!("{caller}: release {name}: {e:?}"));
    }
}

/// The error of a service that cannot be reached: `Unavailable`, naming
/// `service`.
#[track_caller]
pub fn assert_unavailable<T: std::fmt::Debug>(result: Result<T, LockError>, service: &str) {
    match result {
        Err(LockError::Unavailable { service: s, .. }) if s == service => {}
        other => panic!("expected {service} unavailable, got {other:?}"),
    }
}

/// What a holder lookup answers while `lease` holds its lock: its client
/// and its token.
pub fn holder_of(lease: &Lease) -> Option<Holder> {
    Some(Holder {
        client_id: lease.client_id().to_string(),
        token: lease.token().expect("a fenced lease"),
    })
}

/// The answer of an acquire that had to give up waiting.
#[track_caller]
pub fn assert_timeout(result: Result<Lease, LockError>, what: &str) {
    match result {
        Err(LockError::Timeout { .. }) => {}
        Ok(lease) => panic!("{what}: granted ({:?}) but must wait", lease.token()),
        Err(e) => panic!("{what}: {e:?}, expected a timeout"),
    }
}
