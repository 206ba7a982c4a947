//! ZooKeeper: a fair lock on ephemeral-sequential nodes, fenced by the lock
//! node's creation zxid, plus the non-fair variant, a read-write lock
//! ([`ZooKeeperReadWriteLock`]) on the same queue, and leader election
//! ([`election`]) on the same recipe.
//!
//! # Layout
//! - `mod.rs`: [`ZooKeeperLock`], the grant (renew, release), the
//!   [`HolderLookup`].
//! - `recipe.rs`: the queue and the non-fair node: waiting, protected
//!   creation.
//! - `queue.rs`: which nodes count and in which order (ephemeral ones, by
//!   creation zxid), read in one round trip.
//! - `lookup.rs`: who holds a lock, and a bound on its tokens, from outside.
//! - `access.rs`: credentials, the ACL of every node, preparing the roots
//!   ([`Access`], [`prepare_root`]).
//! - `rwlock.rs`: [`ZooKeeperReadWriteLock`] and its two halves.
//! - `session.rs`: the session, retries, deleting our own node and only ours,
//!   cleaning up after dropped acquires.
//! - `path.rs`: lock names as path segments, the queue's node names.
//! - `election.rs`: leader election.
//!
//! # The recipe
//! Each contender creates an EPHEMERAL_SEQUENTIAL node
//! `/fencing/locks/<name>/_c_<guid>-lock-<seq>`. The node created first
//! holds the lock; every other contender watches only its immediate
//! predecessor (an `exists` watch), so a release wakes exactly one waiter (no
//! herd). This is the ZooKeeper recipe and Apache Curator's
//! `InterProcessMutex` node layout, so Curator clients and this one queue in
//! the same order on the same lock.
//!
//! "First" is the server's order, the creation zxid (czxid), and only
//! ephemeral nodes count: anyone allowed to create a node in the queue can
//! name it as they like (a name that looks sequential and sorts first) and
//! make it persistent (no session end removes it). Such a node is ignored by
//! the recipe and by the holder lookup; a hand-named ephemeral node queues
//! where the server created it. Ordering honest nodes by czxid is ordering
//! them by sequence, so the order Curator sees is the same.
//!
//! Grants go in queue order, and a release deletes the node before it
//! returns, so a client that releases and acquires again queues behind
//! everybody already waiting: clients that are always queued take strict
//! turns (tested by `three_always_queued_clients_take_strict_turns_on_the_fair_lock`).
//!
//! The GUID in the name is Curator's "protected mode": when the connection
//! drops while the create is in flight, the client cannot know whether the node
//! was created. It lists the parent and looks for its GUID; without that, a
//! created-but-unacknowledged node would sit in the queue for the rest of the
//! session and block every later contender behind it. The listing follows a
//! `sync`: after reconnecting to another server, a lagging follower could
//! otherwise answer without the node, and a second create would queue behind
//! the first. Should a second node with our GUID ever be in the queue anyway,
//! the waiter deletes it rather than wait behind itself.
//!
//! The non-fair variant ([`ZooKeeperLock::non_fair`]) is the naive one: one
//! plain EPHEMERAL node `/fencing/locks/<name>/lock`; whoever creates it holds
//! the lock, everybody else watches it and races to create it when it goes.
//! Every release wakes every waiter (the herd effect), and the client that
//! just released usually creates the node again before the woken ones do (it
//! does not share). It is here to show those effects
//! ([`ZooKeeperLock::wakeups`] counts the herd), not for use.
//!
//! Its release must not delete the next holder's node, which sits at the same
//! path: it deletes the node only after a `sync` and a stat show our creation
//! zxid (see `session::delete_own` for why, and the window that is left).
//!
//! The two variants keep different nodes and neither waits for the other's,
//! so on one name they would both hold. An acquire that finds the other
//! variant's nodes under the name (after its own create, so of two racing
//! acquires the later one always sees the earlier) deletes its node and
//! fails with [`LockError::InvalidConfig`]. The fair mutex and the read-write
//! lock share one queue instead: a mutex holder is a writer to the readers.
//!
//! # The fencing token: the node's creation zxid
//! The token is the lock node's `czxid`, the zxid of the transaction that
//! created it. A zxid is ONE 64-bit counter for the whole ensemble: the leader's
//! epoch in the high 32 bits, a counter within that epoch in the low 32. Every
//! write is ordered by it, and a new leader starts a higher epoch, so the czxid
//! of a later grant is higher than that of any earlier one, across sessions,
//! clients, lock names and leader changes.
//!
//! The sequence suffix looks like a token but is not one: it is a signed
//! 32-bit counter kept per parent node (its `cversion`), it wraps, and it
//! starts again at zero whenever the parent is recreated. Parents here are
//! CONTAINER nodes, which ZooKeeper deletes once they are empty, so a lock that
//! sits idle for a minute would restart at `0000000000` and hand out tokens
//! lower than the ones the storage has already seen: every honest writer would
//! be refused. And it is per parent, so it says nothing across locks.
//!
//! # Liveness
//! The grant lives as long as the ZooKeeper session: the node is ephemeral.
//! The server expires a session that has not been heard from for the session
//! timeout `T`, counted from the last request it received. So a successful round
//! trip sent at `t` proves the session (and the node, which we check is still
//! ours) survives until at least `t + T`, provided the round trip reached the
//! quorum: the renewal is a `sync` (answered by the leader) pipelined with an
//! `exists` of our node, because a follower cut off from the leader answers
//! reads from its own stale state until its link to the leader times out,
//! after the leader may have expired the session and granted the lock again.
//! The lease is trusted for `min(ttl, 3/4 T)` from the last such proof, so
//! the holder stops trusting it a quarter of `T` before the server can
//! possibly expire it. A process frozen (SIGSTOP, GC) past that learns it
//! on its first [`Lease::is_lost`] after it resumes, from the deadline alone.
//!
//! A short disconnect inside the session timeout is not a loss: the client
//! reconnects to any server of the ensemble and keeps its session, node and
//! token. Session expiry (or the client being closed) is: the client's state
//! watcher sees it and fires the lease's lost signal. The next acquire on the
//! same [`ZooKeeperLock`] opens a new session.
//!
//! # Who holds it
//! The node's data is `<guid>\n<client id>`, so a storage can ask who holds a
//! lock ([`HolderLookup`]): the head of the queue, its data and its czxid. That
//! read is preceded by a `sync` (pipelined with it), so that a storage whose
//! session is on a lagging follower still sees a grant made through the
//! leader a moment ago. The head is found as the recipe finds it (ephemeral
//! nodes, by czxid), and its data is trusted only as written at its create.
//! [`HolderLookup::minted`] answers the lock parent's `pzxid`: every token of
//! the lock is at or below it, every later one above.
//!
//! # Who may do what
//! With credentials ([`ZooKeeperLock::connect_with`], [`Access`]) every node
//! is created with an ACL: lock clients may create and delete nodes in a
//! lock's queue, only a node's creator may write it, the gateway only reads;
//! anonymous clients write nowhere, once an operator has run
//! [`prepare_root`]. The `access` module says which ACL each node gets, and
//! what ZooKeeper cannot refuse.
//!
//! # Cancellation
//! Dropping an acquire future midway never leaves a node that blocks others:
//! the node is ephemeral, but the session of a long-lived [`ZooKeeperLock`]
//! lives on, so a guard deletes it. If the create was in flight (its outcome
//! unknown), the guard's spawned task lists the parent and deletes the node
//! carrying our GUID; ZooKeeper answers one session's requests in order, so that
//! list sees the create. Dropping a [`Lease`] without releasing it also
//! deletes its node in the background. Only when no tokio runtime is left to run
//! those tasks does the node wait for the session to end (it ends when the last
//! clone of the client is dropped).

mod access;
mod credentials;
pub mod election;
mod lookup;
mod path;
mod queue;
mod recipe;
mod rwlock;
mod session;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

pub use access::{prepare_root, Access, Roles};
pub use credentials::{parse_url, Credentials, DigestId};
pub use path::escape_name;
use path::NodeKind;
use recipe::{Attempt, Held};
pub use rwlock::{ZooKeeperReadLock, ZooKeeperReadWriteLock, ZooKeeperWriteLock};
use session::{
    delete_own, new_session, spawn_cleanup, watch_session, zk_error, Deleted, FirstAttempt,
    OwnNode, Pending,
};

use crate::settings::{Configurable, Settings};
use crate::{
    lost_channel, AcquireOptions, Fencing, Grant, Holder, HolderLookup, Lease, LockError,
    LockService, LockState, NewLease, Token,
};

/// The `Fencing-Issuer` of every ZooKeeper grant.
pub const ISSUER: &str = "zookeeper";
/// Where lock nodes live: `/fencing/locks/<escaped name>/...`.
pub const LOCKS_ROOT: &str = "/fencing/locks";
/// Where election nodes live: `/fencing/elections/<escaped name>/...`.
pub const ELECTIONS_ROOT: &str = "/fencing/elections";

/// The ZooKeeper lock service: one session shared by every acquire on it.
/// Cheap to clone; clones share the session and the counters.
#[derive(Clone)]
pub struct ZooKeeperLock {
    inner: Arc<Inner>,
    /// Fair: the queue; non-fair: the one ephemeral node.
    settings: Settings,
    /// What this service queues as: a mutex, or a reader or a writer of a
    /// read-write lock.
    kind: NodeKind,
}

impl Configurable for ZooKeeperLock {
    fn settings_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }
}

struct Inner {
    connect_string: String,
    requested_timeout: Duration,
    /// Who the session authenticates as, and the ACLs of what it creates.
    access: Access,
    session: AsyncMutex<zk::Client>,
    wakeups: AtomicU64,
    parked: AtomicU64,
}

impl ZooKeeperLock {
    /// Open a session on `connect_string` (`host:port[,host:port...]`), asking
    /// for `session_timeout` (the server clamps it to its min/max). A bad
    /// string is `InvalidConfig`; no server reachable is `Unavailable`, at once.
    /// No credentials: every node it creates is open to anyone
    /// ([`Access::open`]).
    pub async fn connect(
        connect_string: &str,
        session_timeout: Duration,
    ) -> Result<Self, LockError> {
        Self::connect_with(connect_string, session_timeout, &Access::open()).await
    }

    /// [`connect`](Self::connect), authenticated as `access` says, every node
    /// it creates with `access`' ACLs (and every later session too).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), fencelock::LockError> {
    /// use std::time::Duration;
    /// use fencelock::zookeeper::{Access, Credentials, DigestId, Roles, ZooKeeperLock};
    ///
    /// // The ids are public; each password only its own user knows.
    /// let admin: DigestId = "admin:fvr2cB/fjGeAiX8g1aGhUm3ZICk=".parse()?;
    /// let lock_clients: Credentials = "lock-clients:lc-secret".parse()?;
    /// let gateway: DigestId = "gateway:ZRRkjMCYlzqdwH9JGwWGDNBk3Lg=".parse()?;
    /// let roles = Roles::new(admin, lock_clients.id()).reader(gateway);
    /// let access = Access::lock_client("worker-1:w1-secret".parse()?, lock_clients, &roles)?;
    /// let locks = ZooKeeperLock::connect_with("zk1:2181", Duration::from_secs(4), &access)
    ///     .await?
    ///     .with_client_id("worker-1")?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(
        connect_string: &str,
        session_timeout: Duration,
        access: &Access,
    ) -> Result<Self, LockError> {
        if session_timeout < Duration::from_millis(100) {
            return Err(LockError::InvalidConfig(format!(
                "zookeeper session timeout {session_timeout:?} is below 100ms"
            )));
        }
        let client = new_session(connect_string, session_timeout, access.credentials()).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                connect_string: connect_string.to_string(),
                requested_timeout: session_timeout,
                access: access.clone(),
                session: AsyncMutex::new(client),
                wakeups: AtomicU64::new(0),
                parked: AtomicU64::new(0),
            }),
            settings: Settings::default(),
            kind: NodeKind::Lock,
        })
    }

    /// Record `id` as this client's id in the data of every lock node (see
    /// [`LockService::client_id`]).
    pub fn with_client_id(self, id: impl Into<String>) -> Result<Self, LockError> {
        self.set_client_id(id)
    }

    /// The naive variant: one plain ephemeral node that every waiter watches.
    /// Each release wakes every waiter; see [`ZooKeeperLock::wakeups`]. A
    /// name is either fair or non-fair: an acquire that finds the other
    /// variant's nodes under it fails with [`LockError::InvalidConfig`].
    pub fn non_fair(self) -> Self {
        self.set_fair(false)
    }

    pub fn is_fair(&self) -> bool {
        self.settings.is_fair()
    }

    /// How many times a waiter on this service was woken by a watch firing.
    /// Fair: one per release that had waiters. Non-fair: every waiter, every release.
    pub fn wakeups(&self) -> u64 {
        self.inner.wakeups.load(Ordering::SeqCst)
    }

    /// How many acquires on this service are parked on a watch right now.
    pub fn parked(&self) -> u64 {
        self.inner.parked.load(Ordering::SeqCst)
    }

    /// The session timeout the server granted for the current session.
    pub async fn session_timeout(&self) -> Duration {
        self.inner.session.lock().await.session_timeout()
    }

    /// The current session's id and password. Another client can attach to
    /// it (`Connector::with_session`) and close it, which is how tests expire
    /// a session from outside.
    pub async fn session_info(&self) -> zk::SessionInfo {
        self.inner.session.lock().await.session().clone()
    }

    /// How long a grant can be trusted after one successful round trip:
    /// `ttl`, but never more than three quarters of the session timeout.
    pub fn validity_for(ttl: Duration, session_timeout: Duration) -> Duration {
        ttl.min(session_timeout * 3 / 4)
    }

    /// The current session, or a new one if the last one expired or was closed.
    async fn client(&self) -> Result<zk::Client, LockError> {
        let mut session = self.inner.session.lock().await;
        let state = session.state();
        if state.is_terminated() {
            tracing::warn!(?state, "zookeeper session ended; opening a new one");
            *session = new_session(
                &self.inner.connect_string,
                self.inner.requested_timeout,
                self.inner.access.credentials(),
            )
            .await?;
        }
        Ok(session.clone())
    }

    /// Acquire `name` under `root`, waiting up to `wait` (`None`: forever).
    /// `id` goes into the node's data (who holds it, for operators and for
    /// [`election::Election::leader`]).
    #[tracing::instrument(
        name = "zk_acquire",
        skip(self, opts),
        fields(fair = self.settings.is_fair(), kind = ?self.kind, token)
    )]
    async fn acquire_node(
        &self,
        root: &str,
        name: &str,
        opts: AcquireOptions,
        wait: Option<Duration>,
        id: &str,
    ) -> Result<Lease, LockError> {
        self.inner.access.check_may_lock()?;
        let parent = format!("{root}/{}", escape_name(name)?);
        let client = self.client().await?;
        let start = Instant::now();
        let deadline = wait.and_then(|w| start.checked_add(w));
        let guid = uuid::Uuid::new_v4();
        let data = format!("{guid}\n{id}");
        let at = Attempt {
            client: &client,
            root,
            parent: &parent,
            data: data.as_bytes(),
            access: &self.inner.access,
            name,
            start,
            deadline,
        };
        let held = if self.settings.is_fair() {
            self.wait_queued(&at, guid, self.kind).await?
        } else {
            self.wait_non_fair(&at).await?
        };
        self.lease(client, name, opts, id, held)
    }

    /// The lease for a node we hold.
    fn lease(
        &self,
        client: zk::Client,
        name: &str,
        opts: AcquireOptions,
        id: &str,
        held: Held,
    ) -> Result<Lease, LockError> {
        let Held {
            node,
            proven_at,
            mut cleanup,
        } = held;
        let czxid = node.czxid;
        let session_timeout = client.session_timeout();
        let trigger = lost_channel();
        let monitor = CancellationToken::new();
        tokio::spawn(watch_session(
            client.clone(),
            name.to_string(),
            trigger.clone(),
            monitor.clone(),
        ));
        let grant = Arc::new(ZkGrant {
            name: name.to_string(),
            client: client.clone(),
            node,
            session_timeout,
            released: AtomicBool::new(false),
            monitor,
        });
        cleanup.disarm();
        tracing::Span::current().record("token", czxid);
        let token = czxid_token(czxid)?;
        Ok(Lease::new(NewLease {
            name: name.to_string(),
            issuer: ISSUER.to_string(),
            client_id: id.to_string(),
            fencing: Fencing::Token(token),
            ttl: opts.ttl,
            requested_at: proven_at,
            validity: Some(Self::validity_for(opts.ttl, session_timeout)),
            auto_renew: opts.auto_renew,
            grant,
            lost_trigger: Some(trigger),
        }))
    }
}

impl LockService for ZooKeeperLock {
    fn issuer(&self) -> &str {
        ISSUER
    }

    fn acquire_with<'a>(
        &'a self,
        name: &'a str,
        opts: AcquireOptions,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(async move {
            opts.validate(name)?;
            let id = self.settings.client_id();
            self.acquire_node(LOCKS_ROOT, name, opts, Some(opts.wait), id)
                .await
        })
    }

    fn client_id(&self) -> &str {
        self.settings.client_id()
    }
}

impl HolderLookup for ZooKeeperLock {
    fn issuer(&self) -> &str {
        ISSUER
    }

    /// `sync`, then the lock's exclusive holder and its data: the holder's
    /// client id and czxid. Whatever variant holds it: the head of the queue
    /// when that is a fair mutex or a writer of a read-write lock, or the
    /// non-fair node; only ephemeral nodes, in the order the server created
    /// them. `None` while readers hold it: they share it, and a reader's
    /// token is not one a fenced write should be accepted with.
    fn current_holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Holder>, LockError>> {
        Box::pin(async move { Ok(self.lock_state(name, false).await?.holder) })
    }

    /// The holder, and the parent's `pzxid` as the bound of its tokens, read
    /// in the same round trips as the holder alone.
    fn state<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LockState, LockError>> {
        Box::pin(self.lock_state(name, true))
    }

    /// An upper bound of every token granted for `name`, in one round trip
    /// (see `lookup::minted`): a fence set no higher never refuses a later
    /// grant.
    fn minted<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Token>, LockError>> {
        Box::pin(async move {
            let parent = format!("{LOCKS_ROOT}/{}", escape_name(name)?);
            let client = self.client().await?;
            lookup::minted(&client, LOCKS_ROOT, &parent)
                .await?
                .map(czxid_token)
                .transpose()
        })
    }
}

impl ZooKeeperLock {
    async fn lock_state(&self, name: &str, with_minted: bool) -> Result<LockState, LockError> {
        let parent = format!("{LOCKS_ROOT}/{}", escape_name(name)?);
        let client = self.client().await?;
        let seen = lookup::holder(&client, LOCKS_ROOT, &parent, with_minted).await?;
        let holder = match seen.holder {
            Some((client_id, czxid)) => Some(Holder {
                client_id,
                token: czxid_token(czxid)?,
            }),
            None => None,
        };
        let minted = match seen.minted {
            Some(zxid) if with_minted => Some(czxid_token(zxid)?),
            _ => None,
        };
        Ok(LockState { holder, minted })
    }
}

/// The fencing token of a node created in transaction `czxid`.
fn czxid_token(czxid: i64) -> Result<Token, LockError> {
    Token::try_from(czxid).map_err(|e| LockError::protocol(ISSUER, format!("czxid {czxid}: {e}")))
}

/// One grant: our node, on the session that created it.
struct ZkGrant {
    name: String,
    /// The session that owns the node. After it expires every call fails, so a
    /// late release can never delete a node of a later session.
    client: zk::Client,
    node: OwnNode,
    session_timeout: Duration,
    released: AtomicBool,
    monitor: CancellationToken,
}

impl ZkGrant {
    fn not_held(&self, reason: impl Into<String>) -> LockError {
        LockError::NotHeld {
            name: self.name.clone(),
            reason: reason.into(),
        }
    }
}

impl Grant for ZkGrant {
    /// A `sync` and an `exists` of our node, sent together: the answer
    /// proves the session is alive (the quorum heard from us at or after the
    /// send) and the node still ours.
    ///
    /// Why the `sync`: an `exists` alone is a read that the server we are
    /// connected to answers from its own state. A follower cut off from the
    /// leader keeps answering reads until its link to the leader times out
    /// (`syncLimit` ticks), while the leader has already expired our session
    /// and granted the lock to the next waiter: the chaos row
    /// `zookeeper-partition` measured exactly that (a renewal 1 s after the
    /// next holder's grant). The `sync` goes through the leader, and the
    /// server applies one session's requests in order, so the `exists` is
    /// answered only once the leader has answered the `sync`: a partitioned
    /// follower cannot renew a lease the majority has ended.
    fn renew(&self, ttl: Duration) -> BoxFuture<'_, Result<Duration, LockError>> {
        Box::pin(async move {
            let (synced, stat) = tokio::join!(
                self.client.sync(&self.node.path),
                self.client.check_stat(&self.node.path)
            );
            match synced.and(stat) {
                Ok(Some(stat)) if stat.czxid == self.node.czxid => {
                    Ok(ZooKeeperLock::validity_for(ttl, self.session_timeout))
                }
                Ok(_) => Err(self.not_held(format!("lock node {} is gone", self.node.path))),
                Err(e @ (zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                    Err(self.not_held(format!("zookeeper session ended: {e}")))
                }
                Err(e) => Err(zk_error(e)),
            }
        })
    }

    /// Delete our node, and only ours ([`delete_own`]), retrying through
    /// connection losses for up to the session timeout (after that the
    /// session has either moved to another server or ended).
    fn release(&self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            self.monitor.cancel();
            let result = match delete_own(
                &self.client,
                &self.node,
                self.session_timeout,
                FirstAttempt::Blind,
            )
            .await
            {
                Ok(Deleted::Now) => Ok(()),
                Ok(Deleted::Before) => {
                    Err(self.not_held(format!("lock node {} was already gone", self.node.path)))
                }
                Err(e @ (zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                    Err(self.not_held(format!("zookeeper session ended: {e}")))
                }
                Err(e) => Err(zk_error(e)),
            };
            // Only a release that is known to have taken effect (or found the
            // node already gone) counts. Otherwise the node may still exist in
            // a session that lives on (a server restart shorter than the
            // session timeout), and this client would queue behind its own
            // node forever: leave `released` unset so that Drop hands the node
            // to the background cleanup, which keeps trying.
            if matches!(result, Ok(()) | Err(LockError::NotHeld { .. })) {
                self.released.store(true, Ordering::SeqCst);
            }
            result
        })
    }
}

impl Drop for ZkGrant {
    fn drop(&mut self) {
        self.monitor.cancel();
        if !self.released.load(Ordering::SeqCst) {
            // A lease dropped without release: do not keep the lock for the
            // rest of a long-lived session.
            spawn_cleanup(self.client.clone(), Pending::Created(self.node.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_stays_below_the_session_timeout() {
        let t = Duration::from_secs(4);
        assert_eq!(
            ZooKeeperLock::validity_for(Duration::from_secs(60), t),
            Duration::from_secs(3)
        );
        assert_eq!(
            ZooKeeperLock::validity_for(Duration::from_secs(1), t),
            Duration::from_secs(1)
        );
    }
}
