//! The Redis lock on a master with replicas watched by Redis Sentinel: the
//! same grant, renew and release scripts as [`crate::redis`] (fair by
//! default, non-fair or reentrant on request, waiters woken by the release's
//! message), on whichever server the sentinels name as the master right now.
//! The waiters' pub/sub connection goes to the master the first answering
//! sentinel names; after a failover it breaks, every waiter is woken and
//! tries again, and the next waiter reconnects it.
//!
//! # Finding the master, following a failover
//! On connect (and on every reconnect) the client asks the sentinels in the
//! order given, `SENTINEL get-master-addr-by-name <name>`, connects to the
//! address the first one answers, and checks with `ROLE` that this server
//! does consider itself the master (a sentinel that has not seen the failover
//! yet names the old one). Every step has a short deadline (500 ms): the
//! server we must route around is typically one that stopped answering.
//!
//! The connection is dropped, so that the next call asks the sentinels
//! again, when a command fails on the socket, gets no reply in time (a frozen
//! or partitioned master keeps its socket open), or is refused with
//! `READONLY` (the server was demoted to a replica by a failover).
//!
//! We do not use the `redis` crate's `sentinel` feature: its discovery has no
//! deadline on the sentinel connections nor on the `ROLE` check of the master,
//! so one frozen master or sentinel (the failure this backend exists for)
//! blocks it for good.
//!
//! # What a failover does to a lock (and to its tokens)
//! Replication is asynchronous. A grant (`INCR fence:{N}`, `HSET lock:{N}`) is
//! acknowledged by the master before any replica has it. If the master dies
//! or is cut off before the grant reaches the replica, Sentinel promotes a
//! replica that never saw it: the lock is free there, and its fence counter
//! is behind by every grant it missed. A second client is then granted the
//! same lock while the first still holds it, and with a token **equal** to
//! (or lower than) the one the first client got, because the promoted
//! counter re-mints the numbers it missed. A fencing storage refuses tokens
//! *lower* than its fence; an equal one passes. So the fence refuses the old
//! holder only once the new master has minted past the lost grants; before
//! that, two clients write with the same number. `docs/CHAOS.md`
//! (`sentinel-failover`) measures exactly this.
//!
//! `WAIT numreplicas timeout` after the grant ([`RedisSentinelLock::with_wait`])
//! refuses (and releases) a grant that fewer replicas acknowledged in time, so
//! nobody acts on a grant that only the master has. It does not make the lock
//! safe: a replica that acknowledged can still lose the write (restart without
//! persistence), Sentinel may promote another replica that did not, and a
//! grant whose `WAIT` timed out stays on the master until the release reaches
//! it. Redis documents `WAIT` as not making Redis strongly consistent.
//!
//! # Holder lookup
//! [`HolderLookup`] asks the sentinels which server is the master **on every
//! lookup** (all of them at once, following the one that knows of the latest
//! failover: the highest `config-epoch`), then sends `ROLE` and `HMGET
//! lock:{N} token owner` (and for [`HolderLookup::state`], `GET fence:{N}`)
//! to that server in one pipeline, and answers only if it still says it is
//! the master. So after a failover that loses a grant it
//! answers for the new master, which is what a storage asking "who holds it
//! now" should get. Asking the sentinels each
//! time matters: a lookup that kept its connection to the old master would
//! keep reading there (reads are not refused with `READONLY` on a replica),
//! and an old master that was frozen and comes back still says `master`
//! until the sentinels demote it; either way it would name the holder the
//! failover lost (the chaos row `sentinel-failover` met exactly this: the new
//! holder's writes were refused with `token_not_current`). A master that no
//! sentinel names, or a named server that is not the master, is
//! `Unavailable`: the storage fails closed until the failover is over.
//!
//! # Authentication
//! An entry of the sentinel list may start with `user:password@`
//! (percent-encoded as in a URL): every connection, to the sentinels and to
//! the master they name (the lock's, its `WAIT`, the waiters' pub/sub, the
//! lookup's), then authenticates as that ACL user. So the user must exist,
//! with the same password, on the sentinels (allowed `SENTINEL
//! get-master-addr-by-name` and `SENTINEL MASTER`) and on the data nodes
//! (the lock's keys and commands). Errors and `Debug` never show the
//! password.
//!
//! [`HolderLookup`]: crate::HolderLookup
//! [`HolderLookup::state`]: crate::HolderLookup::state

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redis::aio::MultiplexedConnection;

use super::connection::Source;
use super::discovery::{role_of, step, step_config, Discovery};
use super::holder::{holder_lookup, Lookup};
use super::lock::RedisLock;
use super::pending::{answered, unanswered};
use crate::{AcquireOptions, Lease, LockError, LockService, LockState, WaitStats};

/// The issuer name sent with every token of this backend. Distinct from
/// `redis`: a storage must not compare these tokens with a standalone
/// server's.
pub const ISSUER: &str = "redis-sentinel";

/// The Redis lock on the master that Sentinel names. Cheap to clone.
#[derive(Clone)]
pub struct RedisSentinelLock {
    lock: RedisLock,
    discovery: Discovery,
    /// The holder lookup's connection, with the `host:port` it goes to.
    lookup: Arc<tokio::sync::Mutex<Option<(String, MultiplexedConnection)>>>,
}

impl fmt::Debug for RedisSentinelLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSentinelLock")
            .field("lock", &self.lock)
            .field("discovery", &self.discovery)
            .finish()
    }
}

impl RedisSentinelLock {
    /// Ask the sentinels (`host:port` each; entries may also be
    /// comma-separated lists; credentials as `user:password@host:port` on
    /// any entry, see the module docs, "Authentication") for master
    /// `master_name`, connect to it and PING it. A malformed list or an
    /// empty name is `InvalidConfig`; no sentinel leading to a master is
    /// `Unavailable`, at once.
    pub async fn connect(
        sentinels: &[String],
        master_name: &str,
    ) -> Result<RedisSentinelLock, LockError> {
        let discovery = Discovery::new(sentinels, master_name)?;
        let lock = RedisLock::connect_source(Source::Sentinel(discovery.clone()), ISSUER).await?;
        Ok(RedisSentinelLock {
            lock,
            discovery,
            lookup: Arc::default(),
        })
    }

    /// Record `id` as this client's id in every grant.
    pub fn with_client_id(mut self, id: impl Into<String>) -> Result<Self, LockError> {
        self.lock = self.lock.with_client_id(id)?;
        Ok(self)
    }

    /// The non-fair variant (see [`RedisLock::non_fair`]); fair by default.
    pub fn non_fair(mut self) -> Self {
        self.lock = self.lock.non_fair();
        self
    }

    pub fn is_fair(&self) -> bool {
        self.lock.is_fair()
    }

    /// A reentrant handle with a new owner id (see [`RedisLock::reentrant`]).
    pub fn reentrant(mut self) -> Self {
        self.lock = self.lock.reentrant();
        self
    }

    /// See [`RedisLock::with_poll_fallback`].
    pub fn with_poll_fallback(mut self, fallback: Duration) -> Self {
        self.lock = self.lock.with_poll_fallback(fallback);
        self
    }

    /// How this service's waiters waited so far.
    pub fn wait_stats(&self) -> WaitStats {
        self.lock.wait_stats()
    }

    /// `WAIT replicas timeout` after every grant; a grant acknowledged by
    /// fewer replicas is released and refused (`Unavailable`). See the module
    /// docs for what this does not fix.
    pub fn with_wait(mut self, replicas: u32, timeout: Duration) -> Self {
        self.lock = self.lock.with_wait(replicas, timeout);
        self
    }

    /// A lookup: see the module docs ("Holder lookup").
    async fn lookup_lock(&self, name: &str, what: Lookup) -> Result<LockState, LockError> {
        let master = self.current_master().await?;
        let mut conn = {
            let mut cached = self.lookup.lock().await;
            match cached.as_ref() {
                Some((addr, conn)) if *addr == master => conn.clone(),
                _ => {
                    *cached = None;
                    let conn = self
                        .discovery
                        .connect(&master, &step_config())
                        .await
                        .map_err(|e| LockError::unavailable(ISSUER, format!("master {e}")))?;
                    *cached = Some((master.clone(), conn.clone()));
                    conn
                }
            }
        };
        let mut pipe = redis::pipe();
        pipe.cmd("ROLE");
        for cmd in what.commands(name) {
            pipe.add_command(cmd);
        }
        // Abandoned by its caller before it is answered (the gateway waits
        // at most 500 ms for an issuer), the lookup forgets the cached
        // connection, which may have stopped answering (as the kept
        // connection does: see `Server::answer`).
        let pending = unanswered(|| {
            // Held by another lookup right now: that one decides.
            if let Ok(mut cached) = self.lookup.try_lock() {
                *cached = None;
            }
        });
        let answer: Result<Vec<redis::Value>, String> = step(pipe.query_async(&mut conn)).await;
        answered(pending);
        let values = match answer {
            Ok(values) => values,
            Err(e) => {
                *self.lookup.lock().await = None;
                return Err(LockError::unavailable(
                    ISSUER,
                    format!("master {master}: {e}"),
                ));
            }
        };
        let role = values
            .first()
            .and_then(|r| redis::from_redis_value::<Vec<redis::Value>>(r).ok())
            .map(|r| role_of(&r))
            .unwrap_or_default();
        if role != "master" {
            *self.lookup.lock().await = None;
            return Err(LockError::unavailable(
                ISSUER,
                format!(
                    "the sentinels name {master}, which is a {role:?}, not the master \
                     (failover in progress?)"
                ),
            ));
        }
        what.answer(ISSUER, &values[1..])
    }

    /// The master's `host:port` as the sentinel that knows of the latest
    /// failover names it now (the highest `config-epoch` among the sentinels
    /// that answer; see `Discovery::freshest_master`).
    pub async fn current_master(&self) -> Result<String, LockError> {
        self.discovery
            .freshest_master()
            .await
            .map_err(|e| LockError::unavailable(ISSUER, e))
    }
}

impl LockService for RedisSentinelLock {
    fn issuer(&self) -> &str {
        ISSUER
    }

    fn client_id(&self) -> &str {
        LockService::client_id(&self.lock)
    }

    fn acquire_with<'a>(
        &'a self,
        name: &'a str,
        opts: AcquireOptions,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        self.lock.acquire_with(name, opts)
    }
}

holder_lookup!(RedisSentinelLock);
