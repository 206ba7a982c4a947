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
//!   ([`HolderLookup`]); with `GET fence:{N}` in the same round trip, also
//!   the highest token minted ([`HolderLookup::state`]).
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
//! - A counter that cannot be incremented (written by hand to 2^63-1, or
//!   to something that is not a number) fails every grant of its lock with
//!   a protocol error naming the counter, until an operator repairs it.
//!
//! # Who may do what
//! Redis 7 ACLs can confine a lock client to the lock's keys (`lock:*`,
//! `fence:*`, `queue:*`, `deadlines:*`), its channel (`released:*`) and
//! the commands the scripts and the wait send; the URL (or the Sentinel
//! list) names its user. They cannot confine it to the scripts: a script
//! runs with its caller's rights, so a client allowed to run the grant may
//! also write `lock:{N}` and `fence:{N}` by hand. A storage that asks the
//! lock service must therefore not trust a holder or a counter beyond what
//! it can check (the gateway bounds a token's jump over the page's fence).
//! Redis locks suit trusted lock clients. With the `default` user off,
//! leave it all rights (`user default off ~* &* +@all`: nobody can log in
//! as it): Redis 7.0 replays an append-only file as `default` and checks
//! each `MULTI`/`EXEC` in it (how a script's writes are logged) against its
//! rules, dropping the counters otherwise.

//!
//! # Layout
//! - `lock.rs`: [`RedisLock`], its builder, one grant attempt and the wait.
//! - `grant.rs`: a grant's renew and release, and the replicas' `WAIT`.
//! - `scripts.rs`: the Lua scripts (in `lua/`) and how each is called.
//! - `keys.rs`: the names of a lock's keys and channel.
//! - `holder.rs`: who holds a lock ([`HolderLookup`]).
//! - `connection.rs`: the kept connection, its source (a fixed server or
//!   the master Sentinel names), and what makes it forget a connection.
//! - `notify.rs`: the waiters' pub/sub connection.
//! - `sentinel.rs`: `RedisSentinelLock`, the same lock on the
//!   master Sentinel names; `discovery.rs`: asking the sentinels.
//!
//! [`HolderLookup`]: crate::HolderLookup
//! [`HolderLookup::state`]: crate::HolderLookup::state
//! [`LockService::client_id`]: crate::LockService::client_id

mod connection;
#[cfg(feature = "redis-sentinel")]
mod discovery;
mod grant;
mod holder;
mod keys;
mod lock;
mod notify;
mod pending;
mod scripts;
#[cfg(feature = "redis-sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-sentinel")))]
pub mod sentinel;

pub use crate::settings::DEFAULT_POLL_FALLBACK;
pub use grant::ReplicaWait;
pub use holder::parse_holder;
pub use keys::{channel, deadlines_key, fence_key, lock_key, queue_key};
pub use lock::{RedisLock, ISSUER, STALE_GRANT_HINT};
pub use scripts::{FAIR_GRANT_SCRIPT, GRANT_SCRIPT, LEAVE_SCRIPT, RELEASE_SCRIPT, RENEW_SCRIPT};
