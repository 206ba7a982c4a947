//! A lock on one Redis server, fenced by a counter that lives beside it;
//! fair (a FIFO queue of waiters) by default, non-fair on request, reentrant
//! on request; waiters are woken by a message on release, not by polling.
//!
//! # Keys
//! For a lock named `N` (the braces are Redis Cluster hash tags: every key of
//! a lock hashes to the same slot, so each script, which touches several,
//! would also run on a cluster):
//! - `lock:{N}`, a hash that exists only while the lock is held and expires
//!   after the TTL: `token` (the grant's token), `owner` (`<id> <client id>`:
//!   a random id of the grant, or the owner id of a reentrant handle, then
//!   the holder's [`LockService::client_id`]) and `count` (how many times the
//!   owner holds it: 1, more when a reentrant owner took it again). One
//!   `HMGET` tells a storage who holds the lock and with which token
//!   ([`HolderLookup`]).
//! - `fence:{N}`, the fencing counter. It never expires; every first grant
//!   `INCR`s it and the new value is the grant's token.
//! - `queue:{N}` (a list of waiter ids, oldest first) and `deadlines:{N}` (a
//!   sorted set: each waiter's id, scored with the time, by the Redis
//!   server's clock, at which its place lapses): the fair queue, as
//!   Redisson's `RFairLock` keeps it (`redisson_lock_queue:{N}`,
//!   `redisson_lock_timeout:{N}`). Both exist only while somebody waits.
//! - The channel `released:{N}`: every release publishes on it the id of
//!   the first waiter in the queue, or `*` when nobody queues.
//!
//! # Grant, renew, release
//! A grant is ONE Lua script ([`GRANT_SCRIPT`], or [`FAIR_GRANT_SCRIPT`]):
//! if `lock:{N}` does not exist (and, fair, the caller is first in the queue
//! or nobody queues), `INCR fence:{N}` and create `lock:{N}` with the new
//! token and a TTL. Redis runs a script without interleaving any other
//! command, so no other client can be granted between the check, the `INCR`
//! and the write: the order of tokens is the order of grants. Renew
//! ([`RENEW_SCRIPT`]) and release ([`RELEASE_SCRIPT`]) compare the owner and
//! the token first, so a holder whose grant expired can never extend or
//! delete the next holder's hash. A refused grant answers how long the
//! holder's key still lives (its `PTTL`).
//!
//! # Waiting: woken by the release, bounded by the holder's TTL
//! As Redisson's `RLock` does: a refused waiter subscribes to
//! `released:{N}`, then tries again (a release between its first try and the
//! subscription is not missed: the second try sees the lock free), then
//! waits for a message, at most until the holder's key would expire (the
//! `PTTL` the refusal returned; an expiry publishes nothing, so this bound is
//! what catches it) and at most the fallback poll (500 ms unless
//! [`RedisLock::with_poll_fallback`] says otherwise; it also bounds what a
//! lost message costs), then tries again. The release script publishes in
//! the same atomic step as the delete. One pub/sub connection per
//! [`RedisLock`] (shared by its clones) carries the subscriptions of all its
//! waiters; it is opened at the first contended acquire. If it cannot be
//! opened, waiters poll at the fallback bound; when it breaks, every waiter
//! is woken and tries again (a message may have been lost).
//!
//! An uncontended acquire is still one round trip: the subscription happens
//! only after a refusal. We do not use keyspace notifications: they need
//! `notify-keyspace-events` in the server's configuration (off by default,
//! often not ours to change), and would wake every waiter on every write.
//!
//! # Fairness
//! Fair (the default): first come, first served among fair clients. A
//! refused fair waiter takes a place at the tail of `queue:{N}`, which lasts
//! four fallback polls (2 s by default) by the Redis server's clock and is
//! renewed by each of its tries (at least every fallback poll). The grant
//! goes only to the first live waiter; a waiter that stopped renewing its
//! place (its process died, froze, or lost its connection) is dropped from
//! the queue by the next script that looks, so a dead waiter delays the
//! others by at most the life of its place. The release wakes only the first
//! waiter (the message names it). A fair client that re-takes the lock right
//! after releasing it is refused while others wait: it queues behind them.
//! That is what makes three workers on one page take turns. A waiter that
//! gives up (its `wait` ran out, or its future was dropped) leaves the queue
//! and wakes the next one.
//!
//! Non-fair ([`RedisLock::non_fair`]): whoever tries first when the lock is
//! free gets it, queue or not; every release wakes every non-fair waiter.
//! The client that just released usually wins again (it is already awake).
//! Fair and non-fair clients on the same name exclude each other (one
//! `lock:{N}`); a non-fair one can overtake the fair queue.
//!
//! # Reentrancy
//! [`RedisLock::reentrant`] gives a handle with its own owner id (random,
//! minted by that call; clones share it). The same owner is the same client
//! id AND the same owner id: while a lease of that owner holds the lock, a
//! further acquire through the handle (or a clone) is granted at once,
//! without queueing, with the SAME token (`count` goes up); each release
//! counts down, and the last one deletes the key and wakes the next waiter.
//! So never share a reentrant handle between tasks that must exclude each
//! other: call [`RedisLock::reentrant`] once per task (or per call chain)
//! that may re-enter. Each nested lease renews the shared key on its own; a
//! re-entry or renewal never shortens the key's TTL.
//!
//! # Validity
//! A lease is trusted for the TTL counted from the moment the request was
//! *sent* (the server started the key's clock somewhere after that), minus a
//! small allowance for the two clocks running at different rates (1% of the
//! TTL plus 2 ms, as Redlock does).
//!
//! # Failures
//! - Connection lost during a hold: renewals fail, the lease's validity passes
//!   and its lost signal fires; the key itself expires on the server.
//! - Dropping an `acquire` future midway: at worst the server granted a key
//!   that nobody knows about. It expires after the TTL; its token is skipped.
//!   A fair waiter dropped midway leaves the queue in the background (or its
//!   place lapses).
//! - A restart WITHOUT persistence forgets `fence:{N}`: the counter restarts at
//!   1, tokens go backwards, and a storage that fences (our gateway) refuses
//!   every new holder as stale. Safe, but stuck until an operator raises the
//!   counter again; see `docs/OPERATIONS.md`. With `appendonly yes` and
//!   `appendfsync always` the counter survives restarts.
//! - A key `lock:{N}` written by an older version of this crate (a string,
//!   not a hash) makes the scripts fail with `WRONGTYPE` (a protocol error)
//!   until it expires: do not mix versions on one Redis.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use redis::aio::{MultiplexedConnection, PubSubSink};
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, Script, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::wake::{Registration, SubscribedWaiter, Wakers};
use crate::{
    default_client_id, validate_client_id, validity_for, wait_for_grant, AcquireOptions, Fencing,
    Grant, Holder, HolderLookup, Lease, LockError, LockService, NewLease, Token, Try, WaitCounters,
    WaitStats,
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
/// The longest a waiter waits for a message before trying again anyway,
/// unless [`RedisLock::with_poll_fallback`] says otherwise.
pub const DEFAULT_POLL_FALLBACK: Duration = Duration::from_millis(500);
/// A fair waiter's place lasts this many fallback polls without a renewal.
const PLACE_POLLS: u32 = 4;
/// After the pub/sub connection failed to open, waiters poll for this long
/// before it is tried again.
const PUBSUB_RETRY: Duration = Duration::from_secs(1);

/// `KEYS[1]` lock, `KEYS[2]` fence; `ARGV[1]` owner (`<id> <client id>`),
/// `ARGV[2]` TTL in ms. The non-fair grant: `{1, token}` when granted (or
/// re-entered by the same owner, with the same token), `{0, pttl}` when
/// somebody else holds the lock.
pub const GRANT_SCRIPT: &str = r"
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == false then
  redis.call('INCR', KEYS[2])
  local token = redis.call('GET', KEYS[2])
  redis.call('HSET', KEYS[1], 'token', token, 'owner', ARGV[1], 'count', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, token}
end
if owner == ARGV[1] then
  redis.call('HINCRBY', KEYS[1], 'count', 1)
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {1, redis.call('HGET', KEYS[1], 'token')}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// `KEYS[1]` lock, `KEYS[2]` fence, `KEYS[3]` queue, `KEYS[4]` deadlines;
/// `ARGV[1]` owner, `ARGV[2]` TTL in ms, `ARGV[3]` waiter id, `ARGV[4]` how
/// long the waiter's place lasts in ms (0: do not queue, a try-lock). The
/// fair grant: re-entry by the owner first (no queueing); a free lock with no
/// queue is granted at once (the uncontended path: one `EXISTS` more than the
/// non-fair grant); else drop the waiters whose place lapsed (server clock),
/// then grant only if the lock is free and the caller is the first waiter. Refused: the
/// caller takes (or renews) its place at the tail, and the answer is
/// `{0, ms}`: the holder's `PTTL`, or, when the lock is free but another
/// waiter is first, how long that waiter's place still lasts.
pub const FAIR_GRANT_SCRIPT: &str = r"
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner ~= false and owner == ARGV[1] then
  redis.call('HINCRBY', KEYS[1], 'count', 1)
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {1, redis.call('HGET', KEYS[1], 'token')}
end
if owner == false and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('INCR', KEYS[2])
  local token = redis.call('GET', KEYS[2])
  redis.call('HSET', KEYS[1], 'token', token, 'owner', ARGV[1], 'count', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, token}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for i = 1, #dead do
  redis.call('LREM', KEYS[3], 0, dead[i])
  redis.call('ZREM', KEYS[4], dead[i])
end
local head = redis.call('LINDEX', KEYS[3], 0)
while head and not redis.call('ZSCORE', KEYS[4], head) do
  redis.call('LPOP', KEYS[3])
  head = redis.call('LINDEX', KEYS[3], 0)
end
if owner == false and (head == false or head == ARGV[3]) then
  if head then
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], ARGV[3])
  end
  redis.call('INCR', KEYS[2])
  local token = redis.call('GET', KEYS[2])
  redis.call('HSET', KEYS[1], 'token', token, 'owner', ARGV[1], 'count', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, token}
end
local place = tonumber(ARGV[4])
if place > 0 then
  if redis.call('ZADD', KEYS[4], now + place, ARGV[3]) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[3])
  end
  for k = 3, 4 do
    if redis.call('PTTL', KEYS[k]) < place then
      redis.call('PEXPIRE', KEYS[k], place)
    end
  end
  if head == false then
    head = ARGV[3]
  end
end
if owner ~= false then
  return {0, redis.call('PTTL', KEYS[1])}
end
return {0, tonumber(redis.call('ZSCORE', KEYS[4], head)) - now}
";

/// `KEYS[1]` lock; `ARGV[1]` owner, `ARGV[2]` token, `ARGV[3]` TTL in ms.
/// Returns 1 when extended (never shortened), 0 when the hash is gone or
/// belongs to another grant.
pub const RENEW_SCRIPT: &str = r"
local v = redis.call('HMGET', KEYS[1], 'owner', 'token')
if v[1] == ARGV[1] and v[2] == ARGV[2] then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  return 1
end
return 0
";

/// `KEYS[1]` lock, `KEYS[2]` queue, `KEYS[3]` deadlines; `ARGV[1]` owner,
/// `ARGV[2]` token, `ARGV[3]` the channel. Returns 0 when the hash is gone or
/// belongs to another grant (nothing is touched), 2 when the owner still
/// holds it (a reentrant count went down), 1 when released: the hash is
/// deleted and the channel told, in the same step, who is first in the queue
/// (`*` when nobody waits there).
pub const RELEASE_SCRIPT: &str = r"
local v = redis.call('HMGET', KEYS[1], 'owner', 'token')
if v[1] ~= ARGV[1] or v[2] ~= ARGV[2] then
  return 0
end
if redis.call('HINCRBY', KEYS[1], 'count', -1) > 0 then
  return 2
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('PUBLISH', ARGV[3], '*')
  return 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for i = 1, #dead do
  redis.call('LREM', KEYS[2], 0, dead[i])
  redis.call('ZREM', KEYS[3], dead[i])
end
local head = redis.call('LINDEX', KEYS[2], 0)
if head == false then
  head = '*'
end
redis.call('PUBLISH', ARGV[3], head)
return 1
";

/// `KEYS[1]` lock, `KEYS[2]` queue, `KEYS[3]` deadlines; `ARGV[1]` waiter
/// id, `ARGV[2]` channel. A fair waiter that gives up leaves the queue; if it
/// was first and the lock is free, the next waiter is told.
pub const LEAVE_SCRIPT: &str = r"
local head = redis.call('LINDEX', KEYS[2], 0)
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if head == ARGV[1] and redis.call('EXISTS', KEYS[1]) == 0 then
  local next = redis.call('LINDEX', KEYS[2], 0)
  if next then
    redis.call('PUBLISH', ARGV[2], next)
  end
end
return 1
";

/// The hash holding lock `name`'s holder while it is held.
pub fn lock_key(name: &str) -> String {
    format!("lock:{{{name}}}")
}

/// The key holding lock `name`'s fencing counter (never expires).
pub fn fence_key(name: &str) -> String {
    format!("fence:{{{name}}}")
}

/// The list of fair waiters of lock `name`, first in line first.
pub fn queue_key(name: &str) -> String {
    format!("queue:{{{name}}}")
}

/// The sorted set of fair waiters' place deadlines (server ms).
pub fn deadlines_key(name: &str) -> String {
    format!("deadlines:{{{name}}}")
}

/// The channel a release of lock `name` publishes on.
pub fn channel(name: &str) -> String {
    format!("released:{{{name}}}")
}

/// The holder named by the `token` and `owner` fields of `lock:{N}`
/// (`owner` is `<id> <client id>`).
pub fn parse_holder(token: &str, owner: &str) -> Option<Holder> {
    let token = token.parse().ok()?;
    let (_id, client_id) = owner.split_once(' ')?;
    (!client_id.is_empty()).then(|| Holder {
        client_id: client_id.to_string(),
        token,
    })
}

/// The answer to `HMGET lock:{N} token owner`.
pub(crate) type HolderFields = (Option<String>, Option<String>);

/// The answer to `HMGET lock:{N} token owner`, as a holder (`None`: free).
pub(crate) fn holder_from_fields(
    issuer: &str,
    fields: HolderFields,
) -> Result<Option<Holder>, LockError> {
    match fields {
        (None, None) => Ok(None),
        (Some(token), Some(owner)) => parse_holder(&token, &owner).map(Some).ok_or_else(|| {
            LockError::protocol(
                issuer,
                format!("lock hash {token:?} {owner:?} names no holder"),
            )
        }),
        other => Err(LockError::protocol(
            issuer,
            format!("lock hash incomplete: {other:?}"),
        )),
    }
}

/// A lock service on one Redis server. Cheap to clone; clones share one
/// multiplexed connection, one pub/sub connection and the wait counters.
/// Fair unless [`RedisLock::non_fair`].
#[derive(Clone)]
pub struct RedisLock {
    inner: Arc<Inner>,
    client_id: Arc<str>,
    /// `WAIT numreplicas timeout` after every grant ([`RedisLock::with_wait`]).
    wait: Option<ReplicaWait>,
    fair: bool,
    /// The owner id of a reentrant handle ([`RedisLock::reentrant`]).
    reentrant: Option<Arc<str>>,
    poll_fallback: Duration,
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
            .field("fair", &self.fair)
            .field("reentrant", &self.reentrant.is_some())
            .finish()
    }
}

struct Scripts {
    grant: Script,
    fair_grant: Script,
    renew: Script,
    release: Script,
    leave: Script,
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
    notifier: Arc<Notifier>,
    counters: WaitCounters,
}

impl RedisLock {
    /// Connect to `url` (`redis://host:port/db`) and PING it. A malformed URL is
    /// `InvalidConfig`; a server that does not answer within 2 s is
    /// `Unavailable`, at once. The lock is fair; see [`RedisLock::non_fair`].
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
                    fair_grant: Script::new(FAIR_GRANT_SCRIPT),
                    renew: Script::new(RENEW_SCRIPT),
                    release: Script::new(RELEASE_SCRIPT),
                    leave: Script::new(LEAVE_SCRIPT),
                },
                notifier: Notifier::new(),
                counters: WaitCounters::default(),
            }),
            client_id: default_client_id().into(),
            wait: None,
            fair: true,
            reentrant: None,
            poll_fallback: DEFAULT_POLL_FALLBACK,
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

    /// The non-fair variant: whoever tries first when the lock is free gets
    /// it, ahead of any queue (see the module docs, "Fairness"). Kept for the
    /// comparison; the worker uses it with `--fair false`.
    pub fn non_fair(mut self) -> Self {
        self.fair = false;
        self
    }

    /// The fair variant (the default): first come, first served.
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    pub fn is_fair(&self) -> bool {
        self.fair
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

    /// The longest a waiter waits for a release message before it tries
    /// again anyway (default 500 ms; at least 1 ms). A fair waiter's place in
    /// the queue lasts four of these without a renewal.
    pub fn with_poll_fallback(mut self, fallback: Duration) -> Self {
        self.poll_fallback = fallback.max(Duration::from_millis(1));
        self
    }

    /// How this service's waiters waited so far (shared by its clones).
    pub fn wait_stats(&self) -> WaitStats {
        self.inner.counters.snapshot()
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

    fn place_ms(&self) -> u64 {
        (self.poll_fallback * PLACE_POLLS).as_millis() as u64
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
        let ttl_ms = opts.ttl.as_millis() as u64;
        let requested_at = Instant::now();
        let answer: Vec<Value> = self
            .inner
            .run(opts.ttl, |scripts| {
                if self.fair {
                    let mut inv = scripts.fair_grant.key(lock_key(name));
                    inv.key(fence_key(name))
                        .key(queue_key(name))
                        .key(deadlines_key(name))
                        .arg(owner)
                        .arg(ttl_ms)
                        .arg(waiter)
                        .arg(if queue { self.place_ms() } else { 0 });
                    inv
                } else {
                    let mut inv = scripts.grant.key(lock_key(name));
                    inv.key(fence_key(name)).arg(owner).arg(ttl_ms);
                    inv
                }
            })
            .await?;
        let issuer = self.inner.issuer;
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
                Duration::from_millis(ms).min(self.poll_fallback),
            ));
        }
        let token = Token::try_from(number)
            .map_err(|e| LockError::protocol(issuer, format!("counter {number}: {e}")))?;
        tracing::debug!(lock = name, %token, issuer, fair = self.fair, "redis lock granted");
        let grant = Arc::new(RedisGrant {
            lock: self.clone(),
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

    async fn acquire_waiting(&self, name: &str, opts: AcquireOptions) -> Result<Lease, LockError> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let owner = match &self.reentrant {
            Some(owner_id) => format!("{owner_id} {}", self.client_id),
            None => format!("{id} {}", self.client_id),
        };
        let waiter: Arc<str> = id.into();
        let queue = !opts.wait.is_zero();
        // A fair waiter that leaves without its grant gives its place up.
        let mut place = QueuePlace {
            lock: (self.fair && queue).then(|| self.clone()),
            name: name.to_string(),
            waiter: waiter.clone(),
        };
        let result = wait_for_grant(
            name,
            opts.wait,
            &self.inner.counters,
            || self.try_grant(name, opts, &owner, &waiter, queue),
            || async {
                let filter = self.fair.then(|| waiter.clone());
                SubscribedWaiter(
                    self.inner
                        .notifier
                        .subscribe(&self.inner, name, filter)
                        .await,
                )
            },
        )
        .await;
        if result.is_ok() {
            place.lock = None;
        } else {
            // Gave up (or failed): leave the queue now, not in the background,
            // so that a process that exits right after still leaves no place
            // for others to wait behind.
            place.leave_now().await;
        }
        result
    }
}

/// A fair waiter's place; dropped without being granted, it leaves the
/// queue in the background (best effort: otherwise the place lapses).
struct QueuePlace {
    lock: Option<RedisLock>,
    name: String,
    waiter: Arc<str>,
}

impl QueuePlace {
    /// Give the place up now.
    async fn leave_now(&mut self) {
        if let Some(lock) = self.lock.take() {
            leave(lock, &self.name, &self.waiter).await;
        }
    }
}

async fn leave(lock: RedisLock, name: &str, waiter: &str) {
    let left: Result<i64, LockError> = lock
        .inner
        .run(RESPONSE_TIMEOUT, |scripts| {
            let mut inv = scripts.leave.key(lock_key(name));
            inv.key(queue_key(name))
                .key(deadlines_key(name))
                .arg(waiter)
                .arg(channel(name));
            inv
        })
        .await;
    if let Err(e) = left {
        tracing::debug!(lock = %name, "leaving the queue failed (the place lapses): {e}");
    }
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (name, waiter) = (std::mem::take(&mut self.name), self.waiter.clone());
        rt.spawn(async move { leave(lock, &name, &waiter).await });
    }
}

/// The pub/sub side: one connection per [`RedisLock`] (and its clones),
/// opened at the first contended acquire, subscribed to the channels of the
/// locks somebody in this process waits for.
struct Notifier {
    wakers: Arc<Wakers>,
    state: tokio::sync::Mutex<PubSubState>,
}

#[derive(Default)]
struct PubSubState {
    sink: Option<PubSubSink>,
    subscribed: HashSet<String>,
    /// When opening the connection last failed (waiters poll meanwhile).
    failed_at: Option<Instant>,
    /// Dropping it stops the reader task of the current connection.
    _stop: Option<oneshot::Sender<()>>,
    /// Which connection this is (a reader only clears its own).
    generation: u64,
}

impl Notifier {
    fn new() -> Arc<Notifier> {
        Arc::new_cyclic(|me: &Weak<Notifier>| {
            let me = me.clone();
            Notifier {
                wakers: Arc::new(Wakers::with_on_empty(Box::new(move |channel: &str| {
                    // The last waiter of `channel` left: unsubscribe, unless
                    // a new one came meanwhile (checked under the state lock).
                    let (Some(me), Ok(rt)) = (me.upgrade(), tokio::runtime::Handle::try_current())
                    else {
                        return;
                    };
                    let channel = channel.to_string();
                    rt.spawn(async move { me.unsubscribe_if_unused(&channel).await });
                }))),
                state: tokio::sync::Mutex::new(PubSubState::default()),
            }
        })
    }

    /// Register a waiter for lock `name` and make sure its channel is
    /// subscribed (the server confirmed it) before returning. `None` when
    /// pub/sub is unavailable: the waiter polls.
    async fn subscribe(
        self: &Arc<Self>,
        inner: &Inner,
        name: &str,
        waiter: Option<Arc<str>>,
    ) -> Option<Registration> {
        let channel = channel(name);
        let registration = self.wakers.register(&channel, waiter);
        let mut state = self.state.lock().await;
        if state.subscribed.contains(&channel) && state.sink.is_some() {
            return Some(registration);
        }
        if state.sink.is_none() {
            if state
                .failed_at
                .is_some_and(|at| at.elapsed() < PUBSUB_RETRY)
            {
                return None;
            }
            match self.open(inner, &mut state).await {
                Ok(()) => state.failed_at = None,
                Err(e) => {
                    tracing::debug!(issuer = inner.issuer, "pub/sub unavailable, polling: {e}");
                    state.failed_at = Some(Instant::now());
                    return None;
                }
            }
        }
        let sink = state.sink.as_mut().expect("opened above");
        match tokio::time::timeout(CONNECT_TIMEOUT, sink.subscribe(&channel)).await {
            Ok(Ok(())) => {
                state.subscribed.insert(channel);
                Some(registration)
            }
            failed => {
                tracing::debug!(
                    issuer = inner.issuer,
                    "SUBSCRIBE failed, polling: {failed:?}"
                );
                Self::close(&mut state);
                None
            }
        }
    }

    /// Open the pub/sub connection and start the task that reads it.
    async fn open(
        self: &Arc<Self>,
        inner: &Inner,
        state: &mut PubSubState,
    ) -> Result<(), LockError> {
        let client = match &inner.source {
            Source::Fixed(client) => client.clone(),
            #[cfg(feature = "redis-sentinel")]
            Source::Sentinel(discovery) => discovery.master_client().await?,
        };
        let pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
            .await
            .map_err(|_| LockError::unavailable(inner.issuer, "pub/sub connect timed out"))?
            .map_err(|e| LockError::unavailable(inner.issuer, e))?;
        let (sink, mut stream) = pubsub.split();
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        state.generation += 1;
        let generation = state.generation;
        state.sink = Some(sink);
        state._stop = Some(stop_tx);
        state.subscribed.clear();
        let me = Arc::downgrade(self);
        let wakers = self.wakers.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    msg = stream.next() => match msg {
                        Some(msg) => {
                            let target = String::from_utf8_lossy(msg.get_payload_bytes());
                            wakers.notify(msg.get_channel_name(), &target);
                        }
                        None => break,
                    },
                    _ = &mut stop_rx => return,
                }
            }
            // The connection broke: messages may have been lost. Forget it
            // (the next waiter reopens it) and wake everybody to try again.
            if let Some(me) = me.upgrade() {
                let mut state = me.state.lock().await;
                if state.generation == generation {
                    Self::close(&mut state);
                }
            }
            wakers.notify_all();
        });
        Ok(())
    }

    fn close(state: &mut PubSubState) {
        state.sink = None;
        state._stop = None;
        state.subscribed.clear();
    }

    async fn unsubscribe_if_unused(&self, channel: &str) {
        let mut state = self.state.lock().await;
        if self.wakers.has(channel) || !state.subscribed.remove(channel) {
            return;
        }
        if let Some(sink) = state.sink.as_mut() {
            match tokio::time::timeout(CONNECT_TIMEOUT, sink.unsubscribe(channel)).await {
                Ok(Ok(())) => {}
                _ => Self::close(&mut state),
            }
        }
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

    /// A guard for one request on the kept connection: dropped before
    /// [`answered`], it forgets the connection. A caller that gives
    /// up on a request before our own response timeout (the gateway asks an
    /// issuer for at most 500 ms, and drops the lookup then) would otherwise
    /// leave a connection that stopped answering in place for every later
    /// request, each of them abandoned in turn before anything notices:
    /// after a `docker compose restart redis`, the gateway answered
    /// `issuer_unavailable` to every check until it was restarted.
    fn pending(&self) -> Unanswered<impl FnOnce(()) + '_> {
        unanswered(|| self.forget())
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
        let pending = self.pending();
        let answer = tokio::time::timeout(limit, inv.invoke_async(&mut conn)).await;
        answered(pending);
        match answer {
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
            self.acquire_waiting(name, opts).await
        }
        .boxed()
    }
}

impl HolderLookup for RedisLock {
    fn issuer(&self) -> &str {
        self.inner.issuer
    }

    /// One `HMGET lock:{N} token owner`: the hash exists exactly while the
    /// lock is held (Redis expires it), whatever the variant that holds it
    /// (fair, non-fair, reentrant), and names the holder and its token.
    fn current_holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Holder>, LockError>> {
        async move {
            let get = holder_command(name);
            let mut asked_again = false;
            loop {
                let mut conn = self.inner.connection().await?;
                let pending = self.inner.pending();
                let answer =
                    tokio::time::timeout(RESPONSE_TIMEOUT, get.query_async(&mut conn)).await;
                answered(pending);
                match answer {
                    Err(_) => {
                        self.inner.forget();
                        return Err(LockError::unavailable(self.inner.issuer, "HMGET timed out"));
                    }
                    Ok(Ok(fields)) => return holder_from_fields(self.inner.issuer, fields),
                    // A connection kept from before a server restart (or a
                    // dropped link) fails on its first use. The read changes
                    // nothing, so ask once more on a fresh connection instead
                    // of making the caller (the gateway) refuse a write with
                    // 503 that the server could have checked. A second
                    // failure is the answer: the server is really away.
                    Ok(Err(e))
                        if !asked_again && (e.is_connection_dropped() || e.is_io_error()) =>
                    {
                        self.inner.forget();
                        asked_again = true;
                    }
                    Ok(Err(e)) => return Err(self.inner.failed(e)),
                }
            }
        }
        .boxed()
    }
}

/// A request in flight: dropped before [`answered`] (its caller gave up on
/// it), it runs `on_abandon`. See [`Inner::pending`].
pub(crate) type Unanswered<F> = scopeguard::ScopeGuard<(), F>;

/// See [`Unanswered`].
pub(crate) fn unanswered(on_abandon: impl FnOnce()) -> Unanswered<impl FnOnce(())> {
    scopeguard::guard((), move |()| on_abandon())
}

/// The request got an answer (or an error that was dealt with): defuse.
pub(crate) fn answered<F: FnOnce(())>(pending: Unanswered<F>) {
    scopeguard::ScopeGuard::into_inner(pending);
}

/// `HMGET lock:{N} token owner`: the holder lookup's one read.
pub(crate) fn holder_command(name: &str) -> redis::Cmd {
    redis::cmd("HMGET")
        .arg(lock_key(name))
        .arg("token")
        .arg("owner")
        .to_owned()
}

/// One grant: the owner and token that prove it is ours.
struct RedisGrant {
    lock: RedisLock,
    name: String,
    owner: String,
    token: Token,
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
                    inv.arg(&self.owner)
                        .arg(self.token.get())
                        .arg(ttl.as_millis() as u64);
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

    /// Deletes the hash only if it still holds our owner and token (and, for
    /// a reentrant owner, only at the last release), and in the same step
    /// tells the channel who is next. When it does not hold ours (our grant
    /// expired, maybe somebody else holds it now) nothing is touched and the
    /// answer is `NotHeld`, so the caller learns that its critical section
    /// outlived its lease.
    fn release(&self) -> BoxFuture<'_, Result<(), LockError>> {
        async move {
            let released: i64 = self
                .lock
                .inner
                .run(RESPONSE_TIMEOUT, |scripts| {
                    let mut inv = scripts.release.key(lock_key(&self.name));
                    inv.key(queue_key(&self.name))
                        .key(deadlines_key(&self.name))
                        .arg(&self.owner)
                        .arg(self.token.get())
                        .arg(channel(&self.name));
                    inv
                })
                .await?;
            if released >= 1 {
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
