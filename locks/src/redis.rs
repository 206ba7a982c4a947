//! A lock on one Redis server, fenced by a counter that lives beside it.
//!
//! # Keys
//! For a lock named `N`:
//! - `lock:{N}` holds the current holder's owner value and expires after the
//!   TTL. It exists only while held. The value is `<token> <nonce> <client
//!   id>`: the grant's token, a random nonce that makes it unique to this
//!   grant, and the [`LockService::client_id`] of the holder, so that one `GET`
//!   tells a storage who holds the lock and with which token
//!   ([`HolderLookup`]).
//! - `fence:{N}` is the fencing counter. It never expires; every grant
//!   `INCR`s it and the new value is the grant's token.
//!
//! The braces are Redis Cluster hash tags: both keys of a lock hash to the same
//! slot, so the grant script (which touches both) would also run on a cluster.
//!
//! # Grant, renew, release
//! A grant is ONE Lua script ([`GRANT_SCRIPT`]): if `lock` does not exist,
//! `INCR fence` and `SET lock "<token> <nonce> <client>" PX ttl`. Redis runs a
//! script without interleaving any other command, so no other client can be
//! granted between the check, the `INCR` and the `SET`: the order of tokens is
//! the order of grants. Renew
//! ([`RENEW_SCRIPT`]) and release ([`RELEASE_SCRIPT`]) compare the owner value
//! first, so a holder whose grant expired can never extend or delete the next
//! holder's key.
//!
//! # Validity
//! A lease is trusted for the TTL counted from the moment the request was
//! *sent* (the server started the key's clock somewhere after that), minus a
//! small allowance for the two clocks running at different rates (1% of the TTL
//! plus 2 ms, as Redlock does).
//!
//! # Waiting
//! A waiter retries with jittered, growing delays ([`poll_until_granted`]). We do
//! not wait on keyspace notifications for the key's deletion: they need
//! `notify-keyspace-events` set in the server's configuration (off by default,
//! and often not ours to change), they are fire-and-forget pub/sub messages
//! lost on any disconnect, and an expiry is only notified when Redis gets round
//! to evicting the key, so a retry loop is still needed underneath. Jitter
//! keeps many waiters from retrying in lockstep when the holder releases.
//!
//! # Failures
//! - Connection lost during a hold: renewals fail, the lease's validity passes
//!   and its lost signal fires; the key itself expires on the server.
//! - Dropping an `acquire` future midway: at worst the server granted a key
//!   that nobody knows about. It expires after the TTL; its token is skipped.
//! - A restart WITHOUT persistence forgets `fence:{N}`: the counter restarts at
//!   1, tokens go backwards, and a storage that fences (our gateway) refuses
//!   every new holder as stale. Safe, but stuck until an operator raises the
//!   counter again; see `docs/OPERATIONS.md`. With `appendonly yes` and
//!   `appendfsync always` the counter survives restarts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, Script};
use tokio::time::Instant;

use crate::{
    default_client_id, poll_until_granted, validate_client_id, validity_for, AcquireOptions,
    Fencing, Grant, Holder, HolderLookup, Lease, LockError, LockService, NewLease, Token,
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

/// How long connecting (and the first PING) may take before we say unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Backstop for any reply; each operation also has its own shorter deadline.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// `KEYS[1]` lock key, `KEYS[2]` fence key, `ARGV[1]` `"<nonce> <client id>"`,
/// `ARGV[2]` TTL in ms. Returns the new token, or nil when the lock is held.
/// The lock's value becomes `"<token> <nonce> <client id>"`.
pub const GRANT_SCRIPT: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return token
";

/// `KEYS[1]` lock key, `ARGV[1]` owner, `ARGV[2]` TTL in ms. Returns 1 when
/// extended, 0 when the key is gone or belongs to someone else.
pub const RENEW_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// `KEYS[1]` lock key, `ARGV[1]` owner. Returns 1 when deleted, 0 when the key
/// is gone or belongs to someone else (then nothing is touched).
pub const RELEASE_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// The key holding the owner of lock `name` while it is held.
pub fn lock_key(name: &str) -> String {
    format!("lock:{{{name}}}")
}

/// The key holding lock `name`'s fencing counter (never expires).
pub fn fence_key(name: &str) -> String {
    format!("fence:{{{name}}}")
}

/// The owner value a grant writes into `lock:{N}`.
pub fn owner_value(token: Token, nonce: &str, client_id: &str) -> String {
    format!("{token} {nonce} {client_id}")
}

/// The holder an owner value names: `"<token> <nonce> <client id>"`.
pub fn parse_owner_value(value: &str) -> Option<Holder> {
    let mut parts = value.splitn(3, ' ');
    let token = parts.next()?.parse().ok()?;
    let _nonce = parts.next()?;
    let client_id = parts.next().filter(|c| !c.is_empty())?;
    Some(Holder {
        client_id: client_id.to_string(),
        token,
    })
}

/// A lock service on one Redis server. Cheap to clone; clones share one
/// multiplexed connection.
#[derive(Clone)]
pub struct RedisLock {
    inner: Arc<Inner>,
    client_id: Arc<str>,
    /// `WAIT numreplicas timeout` after every grant ([`RedisLock::with_wait`]).
    wait: Option<ReplicaWait>,
}

/// Where connections come from: one fixed server, or (feature
/// `redis-sentinel`) the master that the sentinels name at connect time.
pub(crate) enum Source {
    Fixed(Client),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(crate::redis_sentinel::Discovery),
}

/// After a grant, wait until this many replicas acknowledged it (`WAIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    pub replicas: u32,
    pub timeout: Duration,
}

impl std::fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let server = match &self.inner.source {
            Source::Fixed(client) => client.get_connection_info().addr.to_string(),
            #[cfg(feature = "redis-sentinel")]
            Source::Sentinel(d) => d.to_string(),
        };
        f.debug_struct("RedisLock")
            .field("server", &server)
            .field("issuer", &self.inner.issuer)
            .field("client_id", &self.client_id)
            .finish()
    }
}

struct Scripts {
    grant: Script,
    renew: Script,
    release: Script,
}

struct Inner {
    source: Source,
    /// `redis`, or `redis-sentinel`: what every lease and error names.
    issuer: &'static str,
    config: AsyncConnectionConfig,
    /// The live connection; `None` after it broke, until the next call reconnects.
    conn: Mutex<Option<MultiplexedConnection>>,
    /// Serialises reconnects so that a broken connection is replaced once.
    reconnecting: tokio::sync::Mutex<()>,
    scripts: Scripts,
}

impl RedisLock {
    /// Connect to `url` (`redis://host:port/db`) and PING it. A malformed URL is
    /// `InvalidConfig`; a server that does not answer within 2 s is
    /// `Unavailable`, at once.
    pub async fn connect(url: &str) -> Result<RedisLock, LockError> {
        let client = Client::open(url)
            .map_err(|e| LockError::InvalidConfig(format!("redis url {url:?}: {e}")))?;
        Self::connect_source(Source::Fixed(client), ISSUER).await
    }

    /// Connect through `source` and PING; every lease and error names `issuer`.
    pub(crate) async fn connect_source(
        source: Source,
        issuer: &'static str,
    ) -> Result<RedisLock, LockError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_response_timeout(RESPONSE_TIMEOUT);
        let lock = RedisLock {
            inner: Arc::new(Inner {
                source,
                issuer,
                config,
                conn: Mutex::new(None),
                reconnecting: tokio::sync::Mutex::new(()),
                scripts: Scripts {
                    grant: Script::new(GRANT_SCRIPT),
                    renew: Script::new(RENEW_SCRIPT),
                    release: Script::new(RELEASE_SCRIPT),
                },
            }),
            client_id: default_client_id().into(),
            wait: None,
        };
        let mut conn = lock.inner.connection().await?;
        let ping = tokio::time::timeout(
            CONNECT_TIMEOUT,
            redis::cmd("PING").query_async::<String>(&mut conn),
        )
        .await
        .map_err(|_| LockError::unavailable(issuer, "PING timed out"))?;
        ping.map_err(|e| lock.inner.failed(e))?;
        Ok(lock)
    }

    /// Record `id` as this client's id in every grant (see
    /// [`LockService::client_id`]). `InvalidConfig` unless it is 1 to 128
    /// visible ASCII characters.
    pub fn with_client_id(mut self, id: impl Into<String>) -> Result<Self, LockError> {
        let id = id.into();
        validate_client_id(&id)?;
        self.client_id = id.into();
        Ok(self)
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

    /// Try once: the lease if granted now, `None` if somebody holds the lock.
    async fn try_grant(
        &self,
        name: &str,
        opts: AcquireOptions,
    ) -> Result<Option<Lease>, LockError> {
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let ttl_ms = opts.ttl.as_millis() as u64;
        let requested_at = Instant::now();
        let token: Option<i64> = self
            .inner
            .run(opts.ttl, |scripts| {
                let mut inv = scripts.grant.key(lock_key(name));
                inv.key(fence_key(name))
                    .arg(format!("{nonce} {}", self.client_id))
                    .arg(ttl_ms);
                inv
            })
            .await?;
        let Some(token) = token else {
            return Ok(None);
        };
        let issuer = self.inner.issuer;
        let token = Token::try_from(token)
            .map_err(|e| LockError::protocol(issuer, format!("counter {token}: {e}")))?;
        tracing::debug!(lock = name, %token, issuer, "redis lock granted");
        let grant = Arc::new(RedisGrant {
            lock: self.clone(),
            name: name.to_string(),
            owner: owner_value(token, &nonce, &self.client_id),
        });
        if let Some(wait) = self.wait {
            grant.wait_for_replicas(wait).await?;
        }
        Ok(Some(Lease::new(NewLease {
            name: name.to_string(),
            issuer: issuer.to_string(),
            client_id: self.client_id.to_string(),
            fencing: Fencing::Token(token),
            ttl: opts.ttl,
            requested_at,
            validity: Some(validity_for(opts.ttl)),
            auto_renew: opts.auto_renew,
            grant,
            lost_trigger: None,
        })))
    }
}

impl Inner {
    /// The live connection, reconnecting (once for all callers) if it broke.
    async fn connection(&self) -> Result<MultiplexedConnection, LockError> {
        if let Some(c) = self.conn.lock().expect("redis conn mutex").clone() {
            return Ok(c);
        }
        let _one_at_a_time = self.reconnecting.lock().await;
        if let Some(c) = self.conn.lock().expect("redis conn mutex").clone() {
            return Ok(c);
        }
        let fresh = match &self.source {
            Source::Fixed(client) => tokio::time::timeout(
                CONNECT_TIMEOUT,
                client.get_multiplexed_async_connection_with_config(&self.config),
            )
            .await
            .map_err(|_| LockError::unavailable(self.issuer, "connect timed out"))?
            .map_err(|e| LockError::unavailable(self.issuer, e))?,
            #[cfg(feature = "redis-sentinel")]
            Source::Sentinel(discovery) => discovery.master_connection(&self.config).await?,
        };
        *self.conn.lock().expect("redis conn mutex") = Some(fresh.clone());
        Ok(fresh)
    }

    /// Map a driver error, forgetting the connection if it is broken, timed
    /// out, or leads to a server that is no longer the master (`READONLY`:
    /// demoted by a failover): the next call reconnects, through the
    /// sentinels when there are any.
    fn failed(&self, e: RedisError) -> LockError {
        let demoted = e.kind() == ErrorKind::ReadOnly;
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_unrecoverable_error()
            || e.is_timeout()
            || demoted
        {
            self.forget();
        }
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.is_unrecoverable_error()
            || demoted
        {
            LockError::unavailable(self.issuer, e)
        } else {
            LockError::protocol(self.issuer, e)
        }
    }

    /// Drop the connection; the next call opens a new one.
    fn forget(&self) {
        *self.conn.lock().expect("redis conn mutex") = None;
    }

    /// Run one script within `limit` (at least 100 ms): a reply later than the
    /// TTL is useless anyway, and the watchdog must get control back.
    async fn run<T: redis::FromRedisValue>(
        &self,
        limit: Duration,
        build: impl FnOnce(&Scripts) -> redis::ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        let mut conn = self.connection().await?;
        let inv = build(&self.scripts);
        let limit = limit.max(Duration::from_millis(100));
        match tokio::time::timeout(limit, inv.invoke_async(&mut conn)).await {
            Err(_) => {
                // A server that stopped answering (frozen, partitioned) keeps
                // the socket open: reconnect next time instead of waiting on it.
                self.forget();
                Err(LockError::unavailable(
                    self.issuer,
                    format!("no reply within {limit:?}"),
                ))
            }
            Ok(Err(e)) => Err(self.failed(e)),
            Ok(Ok(v)) => Ok(v),
        }
    }
}

impl LockService for RedisLock {
    fn issuer(&self) -> &str {
        self.inner.issuer
    }

    fn client_id(&self) -> &str {
        &self.client_id
    }

    fn acquire_with<'a>(
        &'a self,
        name: &'a str,
        opts: AcquireOptions,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        async move {
            opts.validate(name)?;
            poll_until_granted(name, opts.wait, || self.try_grant(name, opts)).await
        }
        .boxed()
    }
}

impl HolderLookup for RedisLock {
    fn issuer(&self) -> &str {
        self.inner.issuer
    }

    /// One `GET` of `lock:{N}`: the key exists exactly while the lock is held
    /// (Redis expires it), and its value names the holder and its token.
    fn current_holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Holder>, LockError>> {
        async move {
            let mut conn = self.inner.connection().await?;
            let get = redis::cmd("GET").arg(lock_key(name)).to_owned();
            let value: Option<String> =
                match tokio::time::timeout(RESPONSE_TIMEOUT, get.query_async(&mut conn)).await {
                    Err(_) => {
                        self.inner.forget();
                        return Err(LockError::unavailable(self.inner.issuer, "GET timed out"));
                    }
                    Ok(r) => r.map_err(|e| self.inner.failed(e))?,
                };
            match value {
                None => Ok(None),
                Some(v) => parse_owner_value(&v).map(Some).ok_or_else(|| {
                    LockError::protocol(
                        self.inner.issuer,
                        format!("lock value {v:?} names no holder"),
                    )
                }),
            }
        }
        .boxed()
    }
}

/// One grant: the owner value that proves it is ours.
struct RedisGrant {
    lock: RedisLock,
    name: String,
    owner: String,
}

impl RedisGrant {
    /// `WAIT replicas timeout` on the connection that carried the grant (it
    /// counts the replicas that acknowledged every write of this connection
    /// so far). Too few: release the grant and refuse it, so that nobody acts
    /// on a grant that a failover would lose.
    async fn wait_for_replicas(&self, wait: ReplicaWait) -> Result<(), LockError> {
        let inner = &self.lock.inner;
        let mut conn = inner.connection().await?;
        let cmd = redis::cmd("WAIT")
            .arg(wait.replicas)
            .arg(wait.timeout.as_millis() as u64)
            .to_owned();
        let limit = wait.timeout + RESPONSE_TIMEOUT;
        let acked: Result<u32, LockError> =
            match tokio::time::timeout(limit, cmd.query_async(&mut conn)).await {
                Err(_) => {
                    inner.forget();
                    Err(LockError::unavailable(inner.issuer, "WAIT got no reply"))
                }
                Ok(r) => r.map_err(|e| inner.failed(e)),
            };
        let acked = match acked {
            Ok(n) if n >= wait.replicas => return Ok(()),
            Ok(n) => n,
            Err(e) => {
                let _ = self.release().await;
                return Err(e);
            }
        };
        let released = match self.release().await {
            Ok(()) => "released".to_string(),
            Err(e) => format!("release failed ({e}); it expires with its TTL"),
        };
        tracing::warn!(lock = %self.name, acked, wanted = wait.replicas, "grant not replicated in time");
        Err(LockError::unavailable(
            inner.issuer,
            format!(
                "the grant of {:?} reached {acked} of {} replica(s) within {:?} (WAIT); {released}",
                self.name, wait.replicas, wait.timeout
            ),
        ))
    }
}

impl Grant for RedisGrant {
    fn renew(&self, ttl: Duration) -> BoxFuture<'_, Result<Duration, LockError>> {
        async move {
            let extended: i64 = self
                .lock
                .inner
                .run(ttl, |scripts| {
                    let mut inv = scripts.renew.key(lock_key(&self.name));
                    inv.arg(&self.owner).arg(ttl.as_millis() as u64);
                    inv
                })
                .await?;
            if extended == 1 {
                Ok(validity_for(ttl))
            } else {
                Err(LockError::NotHeld {
                    name: self.name.clone(),
                    reason: "redis key expired or taken by another holder".into(),
                })
            }
        }
        .boxed()
    }

    /// Deletes the key only if it still holds our owner value. When it does
    /// not (our grant expired, maybe somebody else holds it now) nothing is
    /// touched and the answer is `NotHeld`, so the caller learns that its
    /// critical section outlived its lease.
    fn release(&self) -> BoxFuture<'_, Result<(), LockError>> {
        async move {
            let deleted: i64 = self
                .lock
                .inner
                .run(RESPONSE_TIMEOUT, |scripts| {
                    let mut inv = scripts.release.key(lock_key(&self.name));
                    inv.arg(&self.owner);
                    inv
                })
                .await?;
            if deleted == 1 {
                Ok(())
            } else {
                Err(LockError::NotHeld {
                    name: self.name.clone(),
                    reason: "redis key had already expired or been taken over at release".into(),
                })
            }
        }
        .boxed()
    }
}
