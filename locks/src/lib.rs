//! Distributed locks whose every grant carries a **fencing token**, on Redis,
//! ZooKeeper and SQL lease tables, plus Redlock, which cannot mint one and
//! says so in its type.
//!
//! ```toml
//! [dependencies]
//! # Not on crates.io (the workspace is `publish = false`): a path dependency
//! # on a clone of this repository, or `git = "<its URL>"` instead of `path`.
//! fencelock = { path = "../fencing-tokens/locks", default-features = false, features = ["redis"] }
//! ```
//!
//! Each backend is a cargo feature and pulls only its own client:
//!
//! | feature | type | lock service | token | fair (default) / non-fair | what wakes a waiter |
//! |---|---|---|---|---|---|
//! | `redis` | [`redis::RedisLock`] | one Redis server | `INCR` of a counter beside the lock, in the grant's Lua script | FIFO queue in Lua (as Redisson's `RFairLock`) / `.non_fair()`; also `.reentrant()` | a message the release publishes; bounded by the holder's `PTTL` |
//! | `redis-sentinel` | [`redis_sentinel::RedisSentinelLock`] | a Redis master with replicas, found through Sentinel | the same `INCR`, on whichever server is master (a failover can re-mint tokens: see the module) | the same | the same |
//! | `redlock` | [`redlock::Redlock`] | N independent Redis masters | none: [`Fencing::Unfenced`] | no fair variant | nothing: it polls ([`poll_until_granted`]) |
//! | `zookeeper` | [`zookeeper::ZooKeeperLock`], [`zookeeper::ZooKeeperReadWriteLock`] | a ZooKeeper ensemble | the lock node's creation zxid | queue of sequential nodes / `.non_fair()` | a watch on the node before it (fair), on the lock node (non-fair) |
//! | `lease-postgres` | [`lease_table::LeaseTable::postgres`] | a table in PostgreSQL | a column incremented by the grant's `update` | a queue table judged by `now()` / `.non_fair()` | `pg_notify` in the release statement; bounded by the lease's `expires_at` |
//! | `lease-mysql` | [`lease_table::LeaseTable::mysql`] | a table in MySQL/MariaDB | the same, through `last_insert_id` | the same | the holder's `GET_LOCK` bell, rung at release (no `LISTEN` there); bounded the same way |
//!
//! Fair means first come, first served among the waiters: a holder that
//! releases and asks again at once queues behind them, so clients on one
//! hot lock take turns. Non-fair means whoever asks first when the lock is
//! free wins, usually the one that just released it. Either way the grant
//! and the token are one atomic step, and a waiter that dies or freezes is
//! skipped once its place in the queue lapses.
//!
//! # The safety model, in five paragraphs
//!
//! **What a lock with a TTL cannot do.** A client takes the lock, then stops
//! (a GC pause, SIGSTOP, a slow disk) past its lease. Another client is granted
//! the lock and writes. The first one wakes up and writes too. Nothing the
//! first client checks before its write closes this: the pause can fall
//! between the check and the write.
//!
//! **What the token guarantees.** Every grant carries a [`Token`], minted in
//! the same atomic step as the grant, larger than every token the same issuer
//! minted before for that lock. So of two clients that believe they hold the
//! lock, the later grant has the larger token.
//!
//! **What the storage must do.** Remember, per resource, the highest token it
//! has accepted (the *fence*), and refuse anything older, atomically with the
//! write (one conditional statement, or under the row's lock). Tokens of
//! different issuers ([`Lease::issuer`]) are not comparable: refuse a mix. A
//! storage that also asks the issuer whether the token is current
//! ([`HolderLookup`], Chubby's `CheckSequencer`) refuses tokens nobody was
//! granted (guessed, copied, from the future) as well. The companion
//! `gateway` crate of this repository is such a storage.
//!
//! **What the lost signal means.** A [`Lease`] renews itself at a third of its
//! trust window (unless [`AcquireOptions::auto_renew`] is off) and its
//! [`LostSignal`] fires as soon as the grant can no longer be trusted: renewal
//! refused, trust window passed, ZooKeeper session gone. [`Lease::is_lost`]
//! also checks the deadline itself, so a process resumed from a long pause
//! learns it on its first check. Stop writing when it fires; but a pause right
//! after the check is invisible to you, which is why the token and the
//! storage's fence exist.
//!
//! **What release and `Drop` do.** [`Lease::release`] frees exactly this grant
//! and nobody else's (compare-owner, on every backend), and answers
//! `Err(NotHeld)` when your lease had already ended. Dropping a lease without
//! releasing it releases it in the background the same way (best effort, with
//! a tokio runtime still running). A process that dies leaves the grant until
//! it expires on the service: after the TTL for Redis, Redlock and the lease
//! tables, after the session timeout for ZooKeeper.
//!
//! # Examples
//!
//! Redis (feature `redis`):
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # async fn demo() -> Result<(), fencelock::LockError> {
//! use std::time::Duration;
//! use fencelock::redis::RedisLock;
//! use fencelock::LockService;
//!
//! let locks = RedisLock::connect("redis://127.0.0.1:6379/")
//!     .await?
//!     .with_client_id("billing-7")?;
//! let lease = locks
//!     .acquire("page:demo", Duration::from_secs(2), Duration::from_secs(10))
//!     .await?;
//! let token = lease.token().expect("redis mints tokens");
//! // ... send `token` (and `lease.issuer()`) with every write to the storage ...
//! if lease.is_lost() {
//!     // too late for the storage to accept us; it will refuse the token anyway
//! }
//! lease.release().await?;
//! # let _ = token; Ok(()) }
//! ```
//!
//! ZooKeeper (feature `zookeeper`): the session timeout bounds how long a
//! holder trusts its grant between heartbeats.
//!
//! ```no_run
//! # #[cfg(feature = "zookeeper")]
//! # async fn demo() -> Result<(), fencelock::LockError> {
//! use std::time::Duration;
//! use fencelock::zookeeper::ZooKeeperLock;
//! use fencelock::LockService;
//!
//! let locks = ZooKeeperLock::connect("zk1:2181,zk2:2181,zk3:2181", Duration::from_secs(4))
//!     .await?
//!     .with_client_id("billing-7")?;
//! let lease = locks
//!     .acquire("page:demo", Duration::from_secs(4), Duration::from_secs(10))
//!     .await?;
//! println!("token {} from {}", lease.token().unwrap(), lease.issuer());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! A lease table (features `lease-postgres`, `lease-mysql`). The table is
//! created if missing ([`lease_table::LeaseTable::postgres`]); its name can be
//! chosen ([`lease_table::LeaseTableOptions`]):
//!
//! ```no_run
//! # #[cfg(feature = "lease-postgres")]
//! # async fn demo() -> Result<(), fencelock::LockError> {
//! use std::time::Duration;
//! use fencelock::lease_table::{LeaseTable, LeaseTableOptions};
//! use fencelock::LockService;
//!
//! let locks = LeaseTable::postgres_with(
//!     "postgres://app@db/app",
//!     LeaseTableOptions::default().table("app_locks"),
//! )
//! .await?
//! .with_client_id("billing-7")?;
//! let lease = locks
//!     .acquire("invoice:42", Duration::from_secs(5), Duration::from_secs(30))
//!     .await?;
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! Redlock (feature `redlock`): a lease without a token.
//!
//! ```no_run
//! # #[cfg(feature = "redlock")]
//! # async fn demo() -> Result<(), fencelock::LockError> {
//! use std::time::Duration;
//! use fencelock::redlock::Redlock;
//! use fencelock::{Fencing, LockService};
//!
//! let urls = ["redis://a:6379/", "redis://b:6379/", "redis://c:6379/"].map(String::from);
//! let locks = Redlock::connect(&urls).await?;
//! let lease = locks
//!     .acquire("report:daily", Duration::from_secs(10), Duration::ZERO)
//!     .await?;
//! assert!(matches!(lease.fencing(), Fencing::Unfenced { .. }));
//! // Good for avoiding duplicate work; never for protecting data.
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! `examples/write_through_gateway.rs` takes a Redis lock and writes a page
//! through the gateway with its token.
//!
//! # Layout
//! - `lease.rs`: [`LockService`], [`Lease`], [`LostSignal`], [`Fencing`],
//!   [`AcquireOptions`], [`HolderLookup`], [`WaitStats`], the watchdog, the
//!   one validity formula ([`validity_for`]) and the polling loop
//!   ([`poll_until_granted`]); [`Grant`] and [`NewLease`] are what a backend
//!   implements.
//! - `wake.rs`: the loop of a notified lock (try, subscribe, try, wait for a
//!   notification or a bound), the routing of notifications to this
//!   process's waiters (Redis pub/sub, PostgreSQL `NOTIFY`), and a fair
//!   waiter's place in the queue, given up when it leaves ungranted.
//! - `token.rs`: [`Token`]. `error.rs`: [`LockError`]. `backend.rs`: [`Backend`],
//!   the backends by name, feature or not. `redact.rs`: [`redact_url`] and
//!   [`scrub_secrets`]: URLs in messages without their secrets.
//! - `settings.rs`: what every backend's builder sets (client id, fair or
//!   not, the fallback poll), written once.
//! - `redis/`: the Redis backend (`mod.rs` maps its files), and in
//!   `redis/sentinel.rs` the same lock on the master Sentinel names
//!   ([`redis_sentinel`]); `redlock.rs`: one backend.
//! - `lease_table/`: the SQL lease tables; `mod.rs` the service and what
//!   both databases share, `postgres/` and `mysql/` each database's
//!   statements (`sql/`) and way of waiting (see its module docs).
//! - `zookeeper/`: `mod.rs` the lock type, `recipe.rs` the queue of
//!   sequential nodes, `rwlock.rs` the read-write lock on the same queue,
//!   `session.rs` the session, cleanup and retry machinery, `path.rs` node
//!   names, `election.rs` leader election on the same recipe.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod error;
mod lease;
mod redact;
#[cfg(any(
    feature = "redis",
    feature = "zookeeper",
    feature = "lease-postgres",
    feature = "lease-mysql"
))]
mod settings;
mod token;
#[cfg(any(feature = "redis", feature = "lease-postgres", feature = "lease-mysql"))]
mod wake;

#[cfg(any(feature = "lease-postgres", feature = "lease-mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "lease-postgres", feature = "lease-mysql")))
)]
pub mod lease_table;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "redlock")]
#[cfg_attr(docsrs, doc(cfg(feature = "redlock")))]
pub mod redlock;
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub mod zookeeper;

/// The Redis lock on the master Sentinel names (`redis::sentinel`, kept
/// at this path too).
#[cfg(feature = "redis-sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-sentinel")))]
pub use redis::sentinel as redis_sentinel;

pub use backend::{Backend, UnknownBackend};
pub use error::LockError;
pub use lease::{
    default_client_id, drift_allowance, lost_channel, poll_until_granted, validate_client_id,
    validity_for, AcquireOptions, Fencing, Grant, Holder, HolderLookup, Lease, LockService,
    LockState, LostSignal, LostTrigger, NewLease, WaitStats,
};
pub use redact::{redact_url, scrub_secrets, scrub_secrets_all};
pub use token::{Token, TokenError};
#[cfg(any(feature = "redis", feature = "lease-postgres", feature = "lease-mysql"))]
pub(crate) use wake::{wait_for_grant, Try, WaitCounters};
// The lease tables' own waiters (the MariaDB bell, a registered PostgreSQL
// waiter); Redis uses `wake::SubscribedWaiter`.
#[cfg(any(feature = "lease-postgres", feature = "lease-mysql"))]
pub(crate) use wake::Waiter;
