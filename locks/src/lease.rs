//! One lock API, many lock services.
//!
//! A [`LockService`] grants a [`Lease`]: the lock's name, the issuer (which
//! service minted the token), the [`Fencing`] it carries, and how long it can be
//! trusted. A lease watches itself: a watchdog renews it at a third of the TTL
//! (as Redisson does) unless turned off, and its [`LostSignal`] fires as soon as
//! the grant can no longer be trusted (renewal refused, validity passed, session
//! gone). [`Lease::is_lost`] also checks the deadline itself, so a process that
//! was frozen past its validity learns it on the very first check after it
//! resumes, even before the watchdog task has had a chance to run.
//!
//! What no lease can do is make "check, then write" atomic: a pause between
//! [`Lease::is_lost`] and the write is invisible to the holder. Only the storage
//! can close that gap, by refusing tokens older than the newest it has seen.
//! That is why every backend that can mint a token mints it in the same atomic
//! step as the grant, and why a backend that cannot ([`redlock`]) says so in its
//! type ([`Fencing::Unfenced`]) instead of inventing one.

pub mod error;
pub mod lease_table;
pub mod redis;
pub mod redlock;
pub mod zookeeper;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use error::LockError;

/// What a grant carries to prove its place in the order of grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// A number from a counter that only grows, minted in the same atomic step
    /// as the grant. Storage that remembers the highest token it has seen can
    /// refuse everything older.
    Token(u64),
    /// This service cannot mint a safe token. The reason says why; a client
    /// holding such a lease cannot be fenced, so it is only safe for efficiency
    /// locks, never for correctness.
    Unfenced { reason: &'static str },
}

impl Fencing {
    pub fn token(&self) -> Option<u64> {
        match self {
            Fencing::Token(t) => Some(*t),
            Fencing::Unfenced { .. } => None,
        }
    }
}

/// How to acquire: TTL of the grant, how long to wait for it, and whether the
/// watchdog keeps renewing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireOptions {
    /// Lifetime of the grant on the service if nobody renews it. For ZooKeeper
    /// this bounds how long the holder trusts its session between heartbeats.
    pub ttl: Duration,
    /// Wait up to this long for the lock; zero tries once.
    pub wait: Duration,
    /// Renew at a third of the TTL while the lease is held.
    pub auto_renew: bool,
}

impl AcquireOptions {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            wait: Duration::ZERO,
            auto_renew: true,
        }
    }

    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// Reject what no backend can honour: an empty name, a TTL of zero or one
    /// that does not fit a millisecond counter.
    pub fn validate(&self, name: &str) -> Result<(), LockError> {
        if name.is_empty() {
            return Err(LockError::InvalidConfig("lock name is empty".into()));
        }
        if self.ttl.is_zero() {
            return Err(LockError::InvalidConfig("ttl is zero".into()));
        }
        if self.ttl.as_millis() == 0 {
            return Err(LockError::InvalidConfig("ttl below one millisecond".into()));
        }
        if self.ttl > Duration::from_secs(24 * 3600) {
            return Err(LockError::InvalidConfig("ttl above 24 hours".into()));
        }
        Ok(())
    }
}

/// A lock service: Redis, Redlock, ZooKeeper, a lease table.
pub trait LockService: Send + Sync + 'static {
    /// The name sent as `Fencing-Issuer`. Tokens of different issuers are never
    /// comparable, so the gateway refuses to mix them on one page.
    fn issuer(&self) -> &str;

    /// Acquire `name`, waiting up to `opts.wait`. Dropping the future midway
    /// leaves nothing on the service that outlives the TTL.
    fn acquire_with<'a>(
        &'a self,
        name: &'a str,
        opts: AcquireOptions,
    ) -> BoxFuture<'a, Result<Lease, LockError>>;

    /// `acquire_with` with automatic renewal on.
    fn acquire<'a>(
        &'a self,
        name: &'a str,
        ttl: Duration,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        self.acquire_with(name, AcquireOptions::new(ttl).wait(wait))
    }
}

/// The backend's side of one grant: how to renew and release exactly this grant.
pub trait Grant: Send + Sync + 'static {
    /// Extend the grant by `ttl`. Returns how long it is valid, counted from the
    /// moment the request was sent. `Err(NotHeld)` when the service refused:
    /// the grant is gone.
    fn renew(&self, ttl: Duration) -> BoxFuture<'_, Result<Duration, LockError>>;

    /// Release this grant and nobody else's. A late release by a holder whose
    /// grant expired must not free the next holder's lock.
    fn release(&self) -> BoxFuture<'_, Result<(), LockError>>;
}

/// Fires when a lease can no longer be trusted. Cheap to clone.
#[derive(Clone)]
pub struct LostSignal {
    rx: watch::Receiver<Option<String>>,
    shared: Arc<Shared>,
}

impl LostSignal {
    /// Whether the lease is lost now: signalled, or past its validity.
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }

    /// Why the lease is lost, or `None` while it still holds.
    pub fn reason(&self) -> Option<String> {
        if let Some(r) = self.rx.borrow().clone() {
            return Some(r);
        }
        self.shared.deadline_passed()
    }

    /// Resolve when the lease is lost, with the reason.
    pub async fn lost(&mut self) -> String {
        loop {
            if let Some(r) = self.reason() {
                return r;
            }
            let deadline = self.shared.deadline();
            tokio::select! {
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        // The lease was released or dropped.
                        return self.reason().unwrap_or_else(|| "lease released".into());
                    }
                }
                _ = sleep_until_opt(deadline) => {}
            }
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// State shared by a lease, its signal and its watchdog.
struct Shared {
    /// Until when the grant can be trusted; `None` means "until signalled".
    valid_until: Mutex<Option<Instant>>,
}

impl Shared {
    fn deadline(&self) -> Option<Instant> {
        *self.valid_until.lock().expect("lease mutex")
    }

    fn deadline_passed(&self) -> Option<String> {
        match self.deadline() {
            Some(d) if Instant::now() >= d => Some("lease validity passed without renewal".into()),
            _ => None,
        }
    }

    fn extend(&self, until: Instant) {
        let mut v = self.valid_until.lock().expect("lease mutex");
        *v = Some(until);
    }
}

/// A granted lock. Release it with [`Lease::release`]; dropping it stops the
/// watchdog and leaves the grant to expire on the service.
pub struct Lease {
    name: String,
    issuer: String,
    fencing: Fencing,
    ttl: Duration,
    acquired_at: Instant,
    grant: Arc<dyn Grant>,
    shared: Arc<Shared>,
    lost_tx: Arc<watch::Sender<Option<String>>>,
    lost_rx: watch::Receiver<Option<String>>,
    watchdog: Option<JoinHandle<()>>,
}

/// Everything a backend knows when it has just been granted a lock.
pub struct NewLease {
    pub name: String,
    pub issuer: String,
    pub fencing: Fencing,
    pub ttl: Duration,
    /// When the grant request was sent (validity is counted from there).
    pub requested_at: Instant,
    /// How long the grant is valid from `requested_at`; `None` = until the
    /// backend fires the lost signal (see [`NewLease::lost_trigger`]).
    pub validity: Option<Duration>,
    pub auto_renew: bool,
    pub grant: Arc<dyn Grant>,
    /// A sender the backend keeps to fire the lost signal itself (for example
    /// when a ZooKeeper session expires). Create it with [`lost_channel`].
    pub lost_trigger: Option<LostTrigger>,
}

/// The backend's handle on a lease's lost signal.
#[derive(Clone)]
pub struct LostTrigger {
    tx: Arc<watch::Sender<Option<String>>>,
}

impl LostTrigger {
    pub fn fire(&self, reason: impl Into<String>) {
        let reason = reason.into();
        self.tx.send_if_modified(|cur| {
            if cur.is_none() {
                *cur = Some(reason);
                true
            } else {
                false
            }
        });
    }
}

/// A fresh lost-signal channel for [`NewLease::lost_trigger`].
pub fn lost_channel() -> LostTrigger {
    LostTrigger {
        tx: Arc::new(watch::channel(None).0),
    }
}

impl Lease {
    /// Build the lease and start its watchdog. Called by backends.
    pub fn new(new: NewLease) -> Lease {
        let shared = Arc::new(Shared {
            valid_until: Mutex::new(new.validity.map(|v| new.requested_at + v)),
        });
        let trigger = new.lost_trigger.unwrap_or_else(lost_channel);
        let lost_rx = trigger.tx.subscribe();
        let mut lease = Lease {
            name: new.name,
            issuer: new.issuer,
            fencing: new.fencing,
            ttl: new.ttl,
            acquired_at: new.requested_at,
            grant: new.grant,
            shared,
            lost_tx: trigger.tx.clone(),
            lost_rx,
            watchdog: None,
        };
        lease.watchdog = Some(tokio::spawn(watchdog(
            lease.name.clone(),
            lease.ttl,
            new.auto_renew,
            lease.grant.clone(),
            lease.shared.clone(),
            trigger,
        )));
        lease
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    pub fn fencing(&self) -> Fencing {
        self.fencing
    }

    /// The fencing token, or `None` for a service that cannot mint one.
    pub fn token(&self) -> Option<u64> {
        self.fencing.token()
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// How long the lease can still be trusted; `None` while it is bounded only
    /// by the lost signal.
    pub fn remaining(&self) -> Option<Duration> {
        self.shared
            .deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// A clonable handle that fires when the lease can no longer be trusted.
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal {
            rx: self.lost_rx.clone(),
            shared: self.shared.clone(),
        }
    }

    /// Whether the lease is lost right now (checks the deadline itself).
    pub fn is_lost(&self) -> bool {
        self.lost_signal().is_lost()
    }

    /// Why the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<String> {
        self.lost_signal().reason()
    }

    /// Renew now, whatever the watchdog does. Refused renewal fires the signal.
    pub async fn renew(&self) -> Result<Duration, LockError> {
        let sent = Instant::now();
        match self.grant.renew(self.ttl).await {
            Ok(validity) => {
                self.shared.extend(sent + validity);
                Ok(validity)
            }
            Err(e) => {
                if matches!(e, LockError::NotHeld { .. }) {
                    LostTrigger {
                        tx: self.lost_tx.clone(),
                    }
                    .fire(e.to_string());
                }
                Err(e)
            }
        }
    }

    /// Stop the watchdog and release this grant on the service.
    pub async fn release(mut self) -> Result<(), LockError> {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
        self.grant.release().await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name)
            .field("issuer", &self.issuer)
            .field("fencing", &self.fencing)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .finish()
    }
}

/// Renews at a third of the TTL and fires the lost signal when the grant is
/// refused or its validity passes without a successful renewal.
async fn watchdog(
    name: String,
    ttl: Duration,
    auto_renew: bool,
    grant: Arc<dyn Grant>,
    shared: Arc<Shared>,
    trigger: LostTrigger,
) {
    let period = (ttl / 3).max(Duration::from_millis(1));
    let mut next_renew = Instant::now() + period;
    loop {
        let deadline = shared.deadline();
        tokio::select! {
            _ = sleep_until_opt(deadline) => {
                if let Some(reason) = shared.deadline_passed() {
                    tracing::warn!(lock = %name, "lease lost: {reason}");
                    trigger.fire(reason);
                    return;
                }
            }
            _ = tokio::time::sleep_until(next_renew), if auto_renew => {
                let sent = Instant::now();
                match grant.renew(ttl).await {
                    Ok(validity) => {
                        shared.extend(sent + validity);
                        next_renew = sent + period;
                    }
                    Err(e @ LockError::NotHeld { .. }) => {
                        tracing::warn!(lock = %name, "lease lost: renewal refused: {e}");
                        trigger.fire(e.to_string());
                        return;
                    }
                    Err(e) => {
                        // Keep trying until the validity passes; that check fires the signal.
                        tracing::debug!(lock = %name, "renewal failed, retrying: {e}");
                        next_renew = Instant::now() + (period / 4).max(Duration::from_millis(10));
                    }
                }
            }
            _ = trigger_fired(&trigger) => return,
        }
    }
}

async fn trigger_fired(trigger: &LostTrigger) {
    let mut rx = trigger.tx.subscribe();
    let _ = rx.wait_for(|v| v.is_some()).await;
}

/// Try `attempt` until it grants or `wait` runs out, sleeping a jittered,
/// growing delay between attempts so that waiters do not retry in lockstep
/// (no thundering herd when the holder releases).
pub async fn poll_until_granted<F, Fut>(
    name: &str,
    wait: Duration,
    mut attempt: F,
) -> Result<Lease, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<Lease>, LockError>>,
{
    let start = Instant::now();
    let deadline = start + wait;
    let mut backoff = Duration::from_millis(5);
    loop {
        if let Some(lease) = attempt().await? {
            return Ok(lease);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(LockError::Timeout {
                name: name.to_string(),
                waited: now - start,
            });
        }
        let jittered = backoff.mul_f64(rand::rng().random_range(0.5..1.5));
        tokio::time::sleep(jittered.min(deadline - now)).await;
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
}
