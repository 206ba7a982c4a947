//! The lock API shared by every backend: [`LockService`], [`Lease`] with its
//! watchdog and [`LostSignal`], [`Fencing`], and what a backend implements
//! ([`Grant`], [`NewLease`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::{LockError, Token};

/// What a grant carries to prove its place in the order of grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// A number from a counter that only grows, minted in the same atomic step
    /// as the grant. Storage that remembers the highest token it has seen can
    /// refuse everything older.
    Token(Token),
    /// This service cannot mint a safe token. The reason says why; a client
    /// holding such a lease cannot be fenced, so it is only safe for efficiency
    /// locks, never for correctness.
    Unfenced { reason: &'static str },
}

impl Fencing {
    pub fn token(&self) -> Option<Token> {
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

    /// Who this client is. Every grant records it on the service (in the Redis
    /// value, the ZooKeeper node's data, the lease row), so that a storage
    /// asking the service who holds a lock ([`HolderLookup`]) learns which
    /// client it is, not only which token. Set with each backend's
    /// `with_client_id`; the default is `<hostname>-<pid>`.
    fn client_id(&self) -> &str;

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

/// The current holder of a lock, as the lock service itself records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's [`LockService::client_id`].
    pub client_id: String,
    /// The token of the holder's grant.
    pub token: Token,
}

/// A lock service that a third party can ask who holds a lock right now: the
/// storage's half of Chubby's `CheckSequencer`. The gateway asks it before a
/// fenced write, so a token that is guessed, copied from another client, or
/// from the future is refused even when it is higher than the page's fence.
///
/// Implemented by the backends that mint tokens (Redis, ZooKeeper, the lease
/// tables), not by Redlock: it has no token to check.
///
/// The answer is true when the service answered it, and may be stale by the
/// time the caller acts on it (the lease can end a moment later). That is why
/// the storage still keeps its fence: the lookup refuses tokens the service
/// never granted to this client, the fence refuses grants that were
/// superseded.
pub trait HolderLookup: Send + Sync + 'static {
    /// The issuer whose locks this looks up (the same name as
    /// [`LockService::issuer`]).
    fn issuer(&self) -> &str;

    /// Who holds `name` right now, and with which token; `None` when nobody
    /// does (free, expired, released).
    fn current_holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Holder>, LockError>>;

    /// The holder and, where the backend can say so in the same answer,
    /// the highest token it has minted for `name` (Redis: its counter, read
    /// with the holder in one round trip). A storage compares the two: a
    /// holder's token above what the issuer minted was not minted by it.
    /// By default the holder alone.
    fn state<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LockState, LockError>> {
        Box::pin(async move {
            Ok(LockState {
                holder: self.current_holder(name).await?,
                minted: None,
            })
        })
    }

    /// The highest token minted for `name` so far, or an upper bound of
    /// it; `None` when the backend cannot say. What an operator checks
    /// before setting a storage's fence by hand.
    fn minted<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Token>, LockError>> {
        let _ = name;
        Box::pin(async { Ok(None) })
    }
}

/// A lock as its issuer sees it (see [`HolderLookup::state`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockState {
    /// Who holds it now; `None`: free, expired or released.
    pub holder: Option<Holder>,
    /// The highest token minted for it (or an upper bound), when the same
    /// answer says it.
    pub minted: Option<Token>,
}

/// Check a client id: 1 to 128 visible ASCII characters (what the gateway's
/// `Client-Id` header and API keys allow).
pub fn validate_client_id(id: &str) -> Result<(), LockError> {
    if (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(LockError::InvalidConfig(format!(
            "client id {id:?}: must be 1 to 128 visible ASCII characters"
        )))
    }
}

/// The default client id: `<hostname>-<pid>`.
pub fn default_client_id() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or_else(|| "localhost".into());
    format!("{host}-{}", std::process::id())
}

/// The allowance for two clocks running at different rates over `ttl`: 1 % of
/// it plus 2 ms, as the Redlock algorithm specifies. Every backend whose grant
/// is judged by the server's clock trusts a lease for `ttl` minus this,
/// counted from when the request was sent ([`validity_for`]).
pub fn drift_allowance(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How long a grant of `ttl` is trusted, counted from when its request was
/// sent: `ttl` less [`drift_allowance`].
pub fn validity_for(ttl: Duration) -> Duration {
    ttl.saturating_sub(drift_allowance(ttl))
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

/// A granted lock.
///
/// Release it with [`Lease::release`], which tells you whether the release
/// took effect (`Err(NotHeld)`: your lease had already ended, so your critical
/// section outlived it). Dropping a lease without releasing it stops the
/// watchdog and releases it in the background, on the same compare-owner
/// path, on every backend (best effort: it needs a tokio runtime still
/// running, and its outcome is only logged). A process that dies without
/// either leaves the grant on the service until it expires: the TTL for Redis,
/// Redlock and the lease tables, the session timeout for ZooKeeper.
pub struct Lease {
    name: String,
    issuer: String,
    client_id: String,
    fencing: Fencing,
    ttl: Duration,
    validity: Option<Duration>,
    acquired_at: Instant,
    released: bool,
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
    /// The client id recorded with the grant on the service.
    pub client_id: String,
    pub fencing: Fencing,
    /// The TTL asked for.
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
            client_id: new.client_id,
            fencing: new.fencing,
            ttl: new.ttl,
            validity: new.validity,
            acquired_at: new.requested_at,
            released: false,
            grant: new.grant,
            shared,
            lost_tx: trigger.tx.clone(),
            lost_rx,
            watchdog: None,
        };
        lease.watchdog = Some(tokio::spawn(watchdog(
            lease.name.clone(),
            lease.ttl,
            lease.renew_period(),
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

    /// The client id the service recorded with this grant.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    pub fn fencing(&self) -> Fencing {
        self.fencing
    }

    /// The fencing token, or `None` for a service that cannot mint one.
    pub fn token(&self) -> Option<Token> {
        self.fencing.token()
    }

    /// The TTL asked for at acquire time (what each renewal asks for again).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How long one grant or renewal is trusted, counted from when its request
    /// was sent: the TTL less a clock-drift allowance for Redis, Redlock and
    /// the lease tables; for ZooKeeper `min(ttl, 3/4 of the session timeout)`.
    /// `None` when only the backend's lost signal bounds the lease.
    pub fn validity(&self) -> Option<Duration> {
        self.validity
    }

    /// The watchdog renews at a third of the trust window, so that two
    /// renewals can fail before the lease is lost.
    fn renew_period(&self) -> Duration {
        (self.validity.unwrap_or(self.ttl).min(self.ttl) / 3).max(Duration::from_millis(1))
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
        self.released = true;
        self.grant.release().await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
        if self.released {
            return;
        }
        // Dropped without a release: release in the background, so that the
        // lock does not stay held until it expires. The same compare-owner
        // release as `release()`: it never frees a later holder's grant.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let grant = self.grant.clone();
            let name = self.name.clone();
            rt.spawn(async move {
                if let Err(e) = grant.release().await {
                    tracing::debug!(lock = %name, "background release of a dropped lease: {e}");
                }
            });
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name)
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
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
    period: Duration,
    auto_renew: bool,
    grant: Arc<dyn Grant>,
    shared: Arc<Shared>,
    trigger: LostTrigger,
) {
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

/// How the waiters of a notified lock (Redis, the lease tables) waited, since
/// the service was connected: counters shared by its clones. For tests and
/// the benchmarks, which use them to show what woke a waiter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Grant attempts sent to the service (every acquire sends at least
    /// one). The grant of a fair PostgreSQL waiter that a release handed the
    /// lock to, which it learns from the notification, sends nothing and is
    /// not counted. A fair MariaDB acquire that takes its place before trying (its
    /// lock was handed round, see `lease_table`) counts that statement, the
    /// place, as its first.
    pub tries: u64,
    /// Waits that a notification ended (a release woke the waiter).
    pub notified: u64,
    /// Waits that their bound ended with no notification: the holder's
    /// lease was due to lapse, a notification was lost, or the fallback poll.
    pub timed_out: u64,
}
