//! [`RedisLock`]: connecting, the builder, one grant attempt, the wait for
//! a grant (fair waiters keep a place in the queue), and [`LockService`].

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use redis::{Client, Value};
use tokio::time::Instant;

use super::connection::{Server, Source, CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
use super::grant::{RedisGrant, ReplicaWait};
use super::notify::Notifier;
use super::scripts;
use crate::settings::{Configurable, Settings};
use crate::wake::{Queue, QueuePlace, SubscribedWaiter};
use crate::{
    validity_for, wait_for_grant, AcquireOptions, Fencing, Lease, LockError, LockService, NewLease,
    Token, Try, WaitCounters, WaitStats,
};

/// The issuer name sent with every token.
pub const ISSUER: &str = "redis";

/// What to tell an operator when the storage refuses a fresh Redis grant as
/// stale: the counter most likely went backwards. For the worker's error.
pub const STALE_GRANT_HINT: &str =
    "the storage has seen a higher token for this lock than Redis just \
granted: Redis most likely restarted without persistence and its fence counter went backwards. \
Every new holder will be refused (safe, but stuck) until an operator raises `fence:{<lock>}` \
above the storage's fence; see docs/OPERATIONS.md, \"The restart hazard\"";

/// A lock service on one Redis server. Cheap to clone; clones share one
/// multiplexed connection, one pub/sub connection and the wait counters.
/// Fair unless [`RedisLock::non_fair`].
#[derive(Clone)]
pub struct RedisLock {
    pub(super) server: Arc<Server>,
    notifier: Arc<Notifier>,
    counters: Arc<WaitCounters>,
    settings: Settings,
    /// `WAIT numreplicas timeout` after every grant ([`RedisLock::with_wait`]).
    wait: Option<ReplicaWait>,
    /// The owner id of a reentrant handle ([`RedisLock::reentrant`]).
    reentrant: Option<Arc<str>>,
}

impl std::fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLock")
            .field("server", &self.server.source().to_string())
            .field("issuer", &self.server.issuer)
            .field("client_id", &self.settings.client_id())
            .field("fair", &self.settings.is_fair())
            .field("reentrant", &self.reentrant.is_some())
            .finish()
    }
}

impl Configurable for RedisLock {
    fn settings_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }
}

impl RedisLock {
    /// Connect to `url` (`redis://[user:password@]host:port/db`; with a
    /// user, the connection authenticates as that ACL user) and PING it. A
    /// malformed URL is `InvalidConfig`; a server that does not answer
    /// within 2 s, or refuses the credentials, is `Unavailable`, at once.
    /// Errors never show the password. The lock is fair; see
    /// [`RedisLock::non_fair`].
    pub async fn connect(url: &str) -> Result<RedisLock, LockError> {
        let client = Client::open(url).map_err(|e| {
            LockError::InvalidConfig(format!("redis url {:?}: {e}", crate::redact_url(url)))
        })?;
        Self::connect_source(Source::Fixed(client), ISSUER).await
    }

    /// Connect through `source` and PING; every lease and error names `issuer`.
    pub(super) async fn connect_source(
        source: Source,
        issuer: &'static str,
    ) -> Result<RedisLock, LockError> {
        let server = Arc::new(Server::new(source, issuer));
        let mut conn = server.connection().await?;
        let ping = redis::cmd("PING");
        server
            .answer(
                "PING",
                CONNECT_TIMEOUT,
                ping.query_async::<String>(&mut conn),
            )
            .await?
            .map_err(|e| server.failed(e))?;
        Ok(RedisLock {
            server,
            notifier: Notifier::new(),
            counters: Arc::default(),
            settings: Settings::default(),
            wait: None,
            reentrant: None,
        })
    }

    /// Record `id` as this client's id in every grant (see
    /// [`LockService::client_id`]). `InvalidConfig` unless it is 1 to 128
    /// visible ASCII characters.
    pub fn with_client_id(self, id: impl Into<String>) -> Result<Self, LockError> {
        self.set_client_id(id)
    }

    /// The non-fair variant: whoever tries first when the lock is free gets
    /// it, ahead of any queue (see the module docs, "Fairness"). Kept for the
    /// comparison; the worker uses it with `--fair false`.
    pub fn non_fair(self) -> Self {
        self.set_fair(false)
    }

    /// The fair variant (the default): first come, first served.
    pub fn fair(self) -> Self {
        self.set_fair(true)
    }

    pub fn is_fair(&self) -> bool {
        self.settings.is_fair()
    }

    /// The longest a waiter waits for a release message before it tries
    /// again anyway (default 500 ms; at least 1 ms). A fair waiter's place in
    /// the queue lasts four of these without a renewal.
    pub fn with_poll_fallback(self, fallback: Duration) -> Self {
        self.set_poll_fallback(fallback)
    }

    /// A reentrant handle with a new owner id: while a lease of this owner
    /// holds a lock, acquiring it again through this handle or a clone is
    /// granted at once with the same token, and only the last release frees
    /// it (see the module docs, "Reentrancy"). Fair or not as before.
    pub fn reentrant(mut self) -> Self {
        self.reentrant = Some(uuid::Uuid::new_v4().simple().to_string().into());
        self
    }

    /// Whether this handle is reentrant ([`RedisLock::reentrant`]).
    pub fn is_reentrant(&self) -> bool {
        self.reentrant.is_some()
    }

    /// How this service's waiters waited so far (shared by its clones).
    pub fn wait_stats(&self) -> WaitStats {
        self.counters.snapshot()
    }

    /// After every grant, send `WAIT replicas timeout` and keep the grant only
    /// if at least `replicas` replicas acknowledged it; otherwise release it
    /// (compare-owner) and answer `Unavailable`. This narrows, and does not
    /// close, the window in which a failover loses a grant: see
    /// [`crate::redis_sentinel`].
    pub fn with_wait(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait = Some(ReplicaWait { replicas, timeout });
        self
    }

    /// One grant attempt. `waiter`: the fair waiter id; `queue`: whether a
    /// refused fair attempt takes a place in the queue.
    async fn try_grant(
        &self,
        name: &str,
        opts: AcquireOptions,
        owner: &str,
        waiter: &str,
        queue: bool,
    ) -> Result<Try, LockError> {
        let settings = &self.settings;
        let script = if settings.is_fair() {
            let place = if queue {
                settings.place()
            } else {
                Duration::ZERO
            };
            scripts::fair_grant(name, owner, opts.ttl, waiter, place)
        } else {
            scripts::grant(name, owner, opts.ttl)
        };
        let requested_at = Instant::now();
        let answer: Vec<Value> = self.server.run(opts.ttl, script).await?;
        let issuer = self.server.issuer;
        let (granted, value) = match answer.as_slice() {
            [flag, value] => (redis::from_redis_value::<i64>(flag), value),
            _ => {
                return Err(LockError::protocol(
                    issuer,
                    format!("grant answered {answer:?}"),
                ))
            }
        };
        let number = redis::from_redis_value::<i64>(value)
            .map_err(|e| LockError::protocol(issuer, format!("grant answered {answer:?}: {e}")))?;
        if granted != Ok(1) {
            // The holder's PTTL (or the first waiter's place); -1/-2 when the
            // key just went: try again soon.
            let ms = u64::try_from(number).unwrap_or(1).max(1);
            return Ok(Try::Refused(
                Duration::from_millis(ms).min(settings.poll_fallback()),
            ));
        }
        let token = Token::try_from(number)
            .map_err(|e| LockError::protocol(issuer, format!("counter {number}: {e}")))?;
        tracing::debug!(lock = name, %token, issuer, fair = settings.is_fair(), "redis lock granted");
        let grant = Arc::new(RedisGrant {
            server: self.server.clone(),
            name: name.to_string(),
            owner: owner.to_string(),
            token,
        });
        if let Some(wait) = self.wait {
            grant.wait_for_replicas(wait).await?;
        }
        Ok(Try::Granted(Lease::new(NewLease {
            name: name.to_string(),
            issuer: issuer.to_string(),
            client_id: settings.client_id().to_string(),
            fencing: Fencing::Token(token),
            ttl: opts.ttl,
            requested_at,
            validity: Some(validity_for(opts.ttl)),
            auto_renew: opts.auto_renew,
            grant,
            lost_trigger: None,
        })))
    }

    async fn acquire_waiting(&self, name: &str, opts: AcquireOptions) -> Result<Lease, LockError> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let client_id = self.settings.client_id();
        let owner = match &self.reentrant {
            Some(owner_id) => format!("{owner_id} {client_id}"),
            None => format!("{id} {client_id}"),
        };
        let waiter: Arc<str> = id.into();
        let queue = !opts.wait.is_zero();
        let fair = self.settings.is_fair();
        // A fair waiter that leaves without its grant gives its place up.
        let place = QueuePlace::new(
            (fair && queue).then(|| self.server.clone()),
            name,
            waiter.clone(),
        );
        let result = wait_for_grant(
            name,
            opts.wait,
            &self.counters,
            || self.try_grant(name, opts, &owner, &waiter, queue),
            || async {
                let filter = fair.then(|| waiter.clone());
                SubscribedWaiter(self.notifier.subscribe(&self.server, name, filter).await)
            },
        )
        .await;
        place.settle(result.is_ok()).await;
        result
    }
}

/// The fair queue's places are given up through the kept connection.
impl Queue for Arc<Server> {
    async fn leave(&self, name: &str, waiter: &str) {
        let left: Result<i64, LockError> = self
            .run(RESPONSE_TIMEOUT, scripts::leave(name, waiter))
            .await;
        if let Err(e) = left {
            tracing::debug!(lock = %name, "leaving the queue failed (the place lapses): {e}");
        }
    }
}

impl LockService for RedisLock {
    fn issuer(&self) -> &str {
        self.server.issuer
    }

    fn client_id(&self) -> &str {
        self.settings.client_id()
    }

    fn acquire_with<'a>(
        &'a self,
        name: &'a str,
        opts: AcquireOptions,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        async move {
            opts.validate(name)?;
            self.acquire_waiting(name, opts).await
        }
        .boxed()
    }
}
