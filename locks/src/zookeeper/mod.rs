//! ZooKeeper: a fair lock on ephemeral-sequential nodes, fenced by the lock
//! node's creation zxid, plus the non-fair variant and leader election
//! ([`election`]) on the same recipe.
//!
//! # The recipe
//! Each contender creates an EPHEMERAL_SEQUENTIAL node
//! `/fencing/locks/<name>/_c_<guid>-lock-<seq>`. The lowest sequence holds the
//! lock; every other contender watches only its immediate predecessor (an
//! `exists` watch), so a release wakes exactly one waiter (no herd). This is the
//! ZooKeeper recipe and Apache Curator's `InterProcessMutex` node layout, so
//! Curator clients and this one queue in the same order on the same lock.
//!
//! The GUID in the name is Curator's "protected mode": when the connection
//! drops while the create is in flight, the client cannot know whether the node
//! was created. It lists the parent and looks for its GUID; without that, a
//! created-but-unacknowledged node would sit in the queue for the rest of the
//! session and block every later contender behind it.
//!
//! The non-fair variant ([`ZooKeeperLock::non_fair`]) is the naive one: one
//! plain EPHEMERAL node `/fencing/locks/<name>/lock`; whoever creates it holds
//! the lock, everybody else watches it and races to create it when it goes.
//! Every release wakes every waiter (the herd effect). It is here to show that
//! effect ([`ZooKeeperLock::wakeups`] counts it), not for use.
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
//! ours) survives until at least `t + T`. The lease is trusted for `min(ttl,
//! 3/4 T)` from the last such proof ([`ZkGrant::renew`] is an `exists` of our
//! node), so the holder stops trusting it a quarter of `T` before the server
//! can possibly expire it. A process frozen (SIGSTOP, GC) past that learns it
//! on its first [`Lease::is_lost`] after it resumes, from the deadline alone.
//!
//! A short disconnect inside the session timeout is not a loss: the client
//! reconnects to any server of the ensemble and keeps its session, node and
//! token. Session expiry (or the client being closed) is: the client's state
//! watcher sees it and fires the lease's lost signal. The next acquire on the
//! same [`ZooKeeperLock`] opens a new session.
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

pub mod election;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use super::{
    lost_channel, AcquireOptions, Fencing, Grant, Lease, LockError, LockService, LostTrigger,
    NewLease,
};

/// The `Fencing-Issuer` of every ZooKeeper grant.
pub const ISSUER: &str = "zookeeper";
/// Where lock nodes live: `/fencing/locks/<escaped name>/...`.
pub const LOCKS_ROOT: &str = "/fencing/locks";
/// Where election nodes live: `/fencing/elections/<escaped name>/...`.
pub const ELECTIONS_ROOT: &str = "/fencing/elections";

/// Curator's node name for `InterProcessMutex` (`_c_<guid>-lock-<seq>`).
const FAIR_NODE: &str = "lock-";
/// The single node of the non-fair variant.
const NON_FAIR_NODE: &str = "lock";
/// Longest lock name accepted (before escaping).
const MAX_NAME: usize = 200;
/// How many times an operation is retried after a connection loss (100 ms
/// apart): enough to ride out a leader election of a few seconds.
const CONNECTION_LOSS_RETRIES: u32 = 60;

/// The ZooKeeper lock service: one session shared by every acquire on it.
/// Cheap to clone; clones share the session and the counters.
#[derive(Clone)]
pub struct ZooKeeperLock {
    inner: Arc<Inner>,
    fair: bool,
}

struct Inner {
    connect_string: String,
    requested_timeout: Duration,
    session: AsyncMutex<zk::Client>,
    wakeups: AtomicU64,
    parked: AtomicU64,
}

impl ZooKeeperLock {
    /// Open a session on `connect_string` (`host:port[,host:port...]`), asking
    /// for `session_timeout` (the server clamps it to its min/max). A bad
    /// string is `InvalidConfig`; no server reachable is `Unavailable`, at once.
    pub async fn connect(
        connect_string: &str,
        session_timeout: Duration,
    ) -> Result<Self, LockError> {
        if session_timeout < Duration::from_millis(100) {
            return Err(LockError::InvalidConfig(format!(
                "zookeeper session timeout {session_timeout:?} is below 100ms"
            )));
        }
        let client = new_session(connect_string, session_timeout).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                connect_string: connect_string.to_string(),
                requested_timeout: session_timeout,
                session: AsyncMutex::new(client),
                wakeups: AtomicU64::new(0),
                parked: AtomicU64::new(0),
            }),
            fair: true,
        })
    }

    /// The naive variant: one plain ephemeral node that every waiter watches.
    /// Each release wakes every waiter; see [`ZooKeeperLock::wakeups`].
    pub fn non_fair(mut self) -> Self {
        self.fair = false;
        self
    }

    pub fn is_fair(&self) -> bool {
        self.fair
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
            *session =
                new_session(&self.inner.connect_string, self.inner.requested_timeout).await?;
        }
        Ok(session.clone())
    }

    /// Acquire `name` under `root`, waiting up to `wait` (`None`: forever).
    /// `id` goes into the node's data (who holds it, for operators and for
    /// [`election::Election::leader`]).
    #[tracing::instrument(name = "zk_acquire", skip(self, opts), fields(fair = self.fair, token))]
    async fn acquire_node(
        &self,
        root: &str,
        name: &str,
        opts: AcquireOptions,
        wait: Option<Duration>,
        id: &str,
    ) -> Result<Lease, LockError> {
        let parent = format!("{root}/{}", escape_name(name)?);
        let client = self.client().await?;
        let start = Instant::now();
        let deadline = wait.and_then(|w| start.checked_add(w));
        let guid = uuid::Uuid::new_v4();
        let data = format!("{guid}\n{id}");
        let held = if self.fair {
            self.wait_fair(
                &client,
                root,
                &parent,
                guid,
                data.as_bytes(),
                name,
                start,
                deadline,
            )
            .await?
        } else {
            self.wait_non_fair(
                &client,
                root,
                &parent,
                data.as_bytes(),
                name,
                start,
                deadline,
            )
            .await?
        };
        let Held {
            path,
            czxid,
            proven_at,
            mut cleanup,
        } = held;
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
            path,
            czxid,
            session_timeout,
            released: AtomicBool::new(false),
            monitor,
        });
        cleanup.disarm();
        tracing::Span::current().record("token", czxid);
        Ok(Lease::new(NewLease {
            name: name.to_string(),
            issuer: ISSUER.to_string(),
            fencing: Fencing::Token(czxid as u64),
            // The watchdog renews at a third of this, so it must not exceed
            // what one round trip can prove.
            ttl: Self::validity_for(opts.ttl, session_timeout),
            requested_at: proven_at,
            validity: Some(Self::validity_for(opts.ttl, session_timeout)),
            auto_renew: opts.auto_renew,
            grant,
            lost_trigger: Some(trigger),
        }))
    }

    /// The fair recipe: create our sequential node, then wait until it is the
    /// lowest, watching only the node just before ours.
    #[allow(clippy::too_many_arguments)]
    async fn wait_fair(
        &self,
        client: &zk::Client,
        root: &str,
        parent: &str,
        guid: uuid::Uuid,
        data: &[u8],
        name: &str,
        start: Instant,
        deadline: Option<Instant>,
    ) -> Result<Held, LockError> {
        let guid_prefix = format!("_c_{guid}-");
        let mut cleanup = Cleanup::new(
            client.clone(),
            Pending::FairCreating {
                parent: parent.to_string(),
                guid_prefix: guid_prefix.clone(),
            },
        );
        let prefix = format!("{parent}/{guid_prefix}{FAIR_NODE}");
        // Pipelined: the getChildren is sent right behind the create, before
        // its answer. ZooKeeper answers one session's requests in order, so
        // the listing already holds our node (found by its GUID): an
        // uncontended acquire costs one round trip, not two.
        let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let listed_at = Instant::now();
        let (created, listed) = tokio::join!(
            client.create(&prefix, data, &mode),
            client.list_children(parent)
        );
        let created_at_once = created.is_ok();
        let (path, stat) =
            create_protected(client, root, parent, &prefix, &guid_prefix, data, created).await?;
        cleanup.pending = Pending::Created(path.clone());
        let ours = node_name(&path).to_string();
        let our_seq = sequence_of(&ours).ok_or_else(|| {
            LockError::protocol(
                ISSUER,
                format!("created node {path} has no sequence suffix"),
            )
        })?;
        let mut first = match listed {
            Ok(children) if created_at_once => Some(children),
            _ => None,
        };
        loop {
            let (sent, children) = match first.take() {
                Some(children) => (listed_at, children),
                None => {
                    let sent = Instant::now();
                    let children = retry(|| client.list_children(parent))
                        .await
                        .map_err(zk_error)?;
                    (sent, children)
                }
            };
            let mut queue: Vec<(i64, &str)> = children
                .iter()
                .filter(|c| c.starts_with("_c_") && c.contains(FAIR_NODE))
                .filter_map(|c| sequence_of(c).map(|s| (s, c.as_str())))
                .collect();
            queue.sort_unstable();
            let Some(pos) = queue.iter().position(|(s, c)| *s == our_seq && *c == ours) else {
                return Err(LockError::NotHeld {
                    name: name.to_string(),
                    reason: format!(
                        "our lock node {path} vanished while waiting (session expired?)"
                    ),
                });
            };
            if pos == 0 {
                return Ok(Held {
                    path,
                    czxid: stat.czxid,
                    proven_at: sent,
                    cleanup,
                });
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                cleanup.delete_now().await;
                return Err(timeout(name, start));
            }
            let predecessor = format!("{parent}/{}", queue[pos - 1].1);
            let (exists, watcher) = retry(|| client.check_and_watch_stat(&predecessor))
                .await
                .map_err(zk_error)?;
            if exists.is_none() {
                continue;
            }
            match self.park(watcher, deadline).await {
                Some(event) => session_still_alive(&event)?,
                None => {
                    cleanup.delete_now().await;
                    return Err(timeout(name, start));
                }
            }
        }
    }

    /// The non-fair recipe: try to create the one node; if it exists, watch it
    /// and try again when it changes. Everybody watches the same node.
    #[allow(clippy::too_many_arguments)]
    async fn wait_non_fair(
        &self,
        client: &zk::Client,
        root: &str,
        parent: &str,
        data: &[u8],
        name: &str,
        start: Instant,
        deadline: Option<Instant>,
    ) -> Result<Held, LockError> {
        let path = format!("{parent}/{NON_FAIR_NODE}");
        let mut cleanup = Cleanup::new(
            client.clone(),
            Pending::NonFairCreating {
                path: path.clone(),
                data: data.to_vec(),
            },
        );
        let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        loop {
            let sent = Instant::now();
            match client.create(&path, data, &ephemeral).await {
                Ok((stat, _)) => {
                    cleanup.pending = Pending::Created(path.clone());
                    return Ok(Held {
                        path,
                        czxid: stat.czxid,
                        proven_at: sent,
                        cleanup,
                    });
                }
                Err(zk::Error::NodeExists) => {}
                Err(zk::Error::NoNode) => {
                    ensure_parent(client, root, parent).await?;
                    continue;
                }
                Err(zk::Error::ConnectionLoss) => {
                    // Protected mode for the single node: the data carries our GUID.
                    match retry(|| client.get_data(&path)).await {
                        Ok((stored, stat)) if stored == data => {
                            cleanup.pending = Pending::Created(path.clone());
                            return Ok(Held {
                                path,
                                czxid: stat.czxid,
                                proven_at: sent,
                                cleanup,
                            });
                        }
                        Ok(_) | Err(zk::Error::NoNode) => continue,
                        Err(e) => return Err(zk_error(e)),
                    }
                }
                Err(e) => return Err(zk_error(e)),
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timeout(name, start));
            }
            let (exists, watcher) = retry(|| client.check_and_watch_stat(&path))
                .await
                .map_err(zk_error)?;
            if exists.is_none() {
                continue;
            }
            match self.park(watcher, deadline).await {
                Some(event) => session_still_alive(&event)?,
                None => return Err(timeout(name, start)),
            }
        }
    }

    /// Wait for a watch to fire, up to `deadline`. `None` on timeout.
    async fn park(
        &self,
        watcher: zk::OneshotWatcher,
        deadline: Option<Instant>,
    ) -> Option<zk::WatchedEvent> {
        let _parked = Parked::new(&self.inner.parked);
        let event = match deadline {
            Some(d) => tokio::time::timeout_at(d, watcher.changed()).await.ok()?,
            None => watcher.changed().await,
        };
        self.inner.wakeups.fetch_add(1, Ordering::SeqCst);
        Some(event)
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
            let id = format!("pid {}", std::process::id());
            self.acquire_node(LOCKS_ROOT, name, opts, Some(opts.wait), &id)
                .await
        })
    }
}

/// A lock node we hold, and what proves it.
struct Held {
    path: String,
    czxid: i64,
    /// When the last round trip that showed us the holder was sent.
    proven_at: Instant,
    cleanup: Cleanup,
}

/// Counts a waiter parked on a watch, also when its future is dropped.
struct Parked<'a>(&'a AtomicU64);

impl<'a> Parked<'a> {
    fn new(counter: &'a AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One grant: our node, on the session that created it.
struct ZkGrant {
    name: String,
    /// The session that owns the node. After it expires every call fails, so a
    /// late release can never delete a node of a later session.
    client: zk::Client,
    path: String,
    czxid: i64,
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
    /// One `exists` of our node: the answer proves the session is alive (the
    /// server heard from us at or after the send) and the node still ours.
    fn renew(&self, ttl: Duration) -> BoxFuture<'_, Result<Duration, LockError>> {
        Box::pin(async move {
            match self.client.check_stat(&self.path).await {
                Ok(Some(stat)) if stat.czxid == self.czxid => {
                    Ok(ZooKeeperLock::validity_for(ttl, self.session_timeout))
                }
                Ok(_) => Err(self.not_held(format!("lock node {} is gone", self.path))),
                Err(e @ (zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                    Err(self.not_held(format!("zookeeper session ended: {e}")))
                }
                Err(e) => Err(zk_error(e)),
            }
        })
    }

    fn release(&self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            self.monitor.cancel();
            let mut retried = false;
            let result = loop {
                match self.client.delete(&self.path, None).await {
                    Ok(()) => break Ok(()),
                    // After a connection loss the first delete may have gone through.
                    Err(zk::Error::NoNode) if retried => break Ok(()),
                    Err(zk::Error::NoNode) => {
                        break Err(
                            self.not_held(format!("lock node {} was already gone", self.path))
                        )
                    }
                    Err(e @ (zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                        break Err(self.not_held(format!("zookeeper session ended: {e}")))
                    }
                    Err(zk::Error::ConnectionLoss) if !retried => {
                        retried = true;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => break Err(zk_error(e)),
                }
            };
            // Only a release that is known to have taken effect (or found the
            // node already gone) counts. Otherwise the node may still exist in
            // a session that lives on (a server restart shorter than the
            // session timeout), and this client would queue behind its own
            // node forever: leave `released` unset so that Drop hands the node
            // to the background cleanup, which retries until it is gone.
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
            spawn_cleanup(self.client.clone(), Pending::Created(self.path.clone()));
        }
    }
}

/// Fire the lost signal when the session ends. A disconnect is not a loss:
/// the session (and our node) survive until the session timeout, and the
/// lease's deadline already bounds how long we trust it without an answer.
async fn watch_session(
    client: zk::Client,
    name: String,
    trigger: LostTrigger,
    stop: CancellationToken,
) {
    let state = client.state();
    if state.is_terminated() {
        trigger.fire(format!("zookeeper session {state:?}"));
        return;
    }
    let mut states = client.state_watcher();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            state = states.changed() => {
                if state.is_terminated() {
                    tracing::warn!(lock = %name, ?state, "zookeeper session ended; lock lost");
                    trigger.fire(format!(
                        "zookeeper session {state:?}: the ephemeral lock node is gone"
                    ));
                    return;
                }
                tracing::debug!(lock = %name, ?state, "zookeeper session state");
            }
        }
    }
}

/// What a dropped acquire leaves behind and must delete.
enum Pending {
    Nothing,
    /// A fair create was sent; its node (if any) carries this GUID prefix.
    FairCreating {
        parent: String,
        guid_prefix: String,
    },
    /// A non-fair create was sent; the node is ours if its data is ours.
    NonFairCreating {
        path: String,
        data: Vec<u8>,
    },
    /// This node is ours.
    Created(String),
}

/// Deletes what [`Pending`] names when dropped before [`Cleanup::disarm`].
struct Cleanup {
    client: zk::Client,
    pending: Pending,
}

impl Cleanup {
    fn new(client: zk::Client, pending: Pending) -> Self {
        Self { client, pending }
    }

    fn disarm(&mut self) {
        self.pending = Pending::Nothing;
    }

    /// Delete now and wait for it (used on timeout, so the next waiter's
    /// predecessor watch fires before we report the timeout).
    async fn delete_now(&mut self) {
        let pending = std::mem::replace(&mut self.pending, Pending::Nothing);
        clean(&self.client, pending).await;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let pending = std::mem::replace(&mut self.pending, Pending::Nothing);
        spawn_cleanup(self.client.clone(), pending);
    }
}

fn spawn_cleanup(client: zk::Client, pending: Pending) {
    if matches!(pending, Pending::Nothing) {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(async move { clean(&client, pending).await });
        }
        Err(_) => tracing::warn!(
            "no tokio runtime to delete an abandoned zookeeper lock node; it goes with the session"
        ),
    }
}

async fn clean(client: &zk::Client, pending: Pending) {
    let path = match pending {
        Pending::Nothing => return,
        Pending::Created(path) => Some(path),
        Pending::FairCreating {
            parent,
            guid_prefix,
        } => match retry(|| client.list_children(&parent)).await {
            Ok(children) => children
                .into_iter()
                .find(|c| c.starts_with(&guid_prefix))
                .map(|c| format!("{parent}/{c}")),
            Err(_) => None,
        },
        Pending::NonFairCreating { path, data } => match retry(|| client.get_data(&path)).await {
            Ok((stored, _)) if stored == data => Some(path),
            _ => None,
        },
    };
    if let Some(path) = path {
        match retry_while_session_lives(client, || client.delete(&path, None)).await {
            Ok(()) | Err(zk::Error::NoNode) => {
                tracing::debug!(%path, "abandoned lock node deleted")
            }
            Err(e) => tracing::debug!(%path, "could not delete abandoned lock node: {e}"),
        }
    }
}

/// Create our sequential node; after a connection loss, find it by GUID
/// instead of creating a second one (Curator's protected mode).
async fn create_protected(
    client: &zk::Client,
    root: &str,
    parent: &str,
    prefix: &str,
    guid_prefix: &str,
    data: &[u8],
    first_attempt: Result<(zk::Stat, zk::CreateSequence), zk::Error>,
) -> Result<(String, zk::Stat), LockError> {
    let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let mut attempt = first_attempt;
    for _ in 0..CONNECTION_LOSS_RETRIES {
        match attempt {
            Ok((stat, seq)) => return Ok((format!("{prefix}{seq}"), stat)),
            Err(zk::Error::NoNode) => ensure_parent(client, root, parent).await?,
            Err(zk::Error::ConnectionLoss) => {
                let children = retry(|| client.list_children(parent))
                    .await
                    .map_err(zk_error)?;
                if let Some(child) = children.into_iter().find(|c| c.starts_with(guid_prefix)) {
                    let path = format!("{parent}/{child}");
                    let (_, stat) = retry(|| client.get_data(&path)).await.map_err(zk_error)?;
                    return Ok((path, stat));
                }
            }
            Err(e) => return Err(zk_error(e)),
        }
        attempt = client.create(prefix, data, &mode).await;
    }
    Err(LockError::unavailable(
        ISSUER,
        "create kept failing with connection loss",
    ))
}

/// `root` as persistent nodes, then the lock's parent as a CONTAINER node
/// (ZooKeeper deletes it once it is empty, so idle locks leave nothing behind).
async fn ensure_parent(client: &zk::Client, root: &str, parent: &str) -> Result<(), LockError> {
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    retry(|| client.mkdir(root, &persistent))
        .await
        .map_err(zk_error)?;
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    match retry(|| client.create(parent, &[], &container)).await {
        Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
        Err(e) => Err(zk_error(e)),
    }
}

/// Retry `op` after connection losses (a server died; the client moves to
/// another one and keeps the session).
async fn retry<T, F, Fut>(mut op: F) -> Result<T, zk::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, zk::Error>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Err(zk::Error::ConnectionLoss) if tries < CONNECTION_LOSS_RETRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            result => return result,
        }
    }
}

/// Retry `op` through connection losses for as long as the session can still
/// be alive (bounded at two minutes): an abandoned node must not outlive a
/// server restart shorter than the session timeout. Once the session has
/// ended, the ephemeral node is gone anyway.
async fn retry_while_session_lives<T, F, Fut>(
    client: &zk::Client,
    mut op: F,
) -> Result<T, zk::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, zk::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut delay = Duration::from_millis(50);
    loop {
        match op().await {
            Err(zk::Error::ConnectionLoss)
                if Instant::now() < deadline && !client.state().is_terminated() =>
            {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            result => return result,
        }
    }
}

/// A watch woken by the end of the session means our node is gone.
fn session_still_alive(event: &zk::WatchedEvent) -> Result<(), LockError> {
    if event.event_type == zk::EventType::Session && event.session_state.is_terminated() {
        return Err(LockError::unavailable(
            ISSUER,
            format!("zookeeper session {:?} while waiting", event.session_state),
        ));
    }
    Ok(())
}

fn timeout(name: &str, start: Instant) -> LockError {
    LockError::Timeout {
        name: name.to_string(),
        waited: start.elapsed(),
    }
}

async fn new_session(
    connect_string: &str,
    session_timeout: Duration,
) -> Result<zk::Client, LockError> {
    if connect_string.trim().is_empty() {
        return Err(LockError::InvalidConfig(
            "zookeeper connect string is empty".into(),
        ));
    }
    zk::Client::connector()
        .with_session_timeout(session_timeout)
        .with_fail_eagerly()
        .connect(connect_string)
        .await
        .map_err(|e| match e {
            zk::Error::BadArguments(_) => LockError::InvalidConfig(format!(
                "bad zookeeper connect string {connect_string:?}: {e}"
            )),
            e => LockError::unavailable(ISSUER, format!("{connect_string}: {e}")),
        })
}

fn zk_error(e: zk::Error) -> LockError {
    match e {
        zk::Error::BadArguments(_) | zk::Error::InvalidAcl | zk::Error::NoAuth => {
            LockError::InvalidConfig(format!("zookeeper refused the request: {e}"))
        }
        zk::Error::UnexpectedError(_)
        | zk::Error::UnexpectedErrorCode(_)
        | zk::Error::UnmarshalError { .. }
        | zk::Error::MarshallingError
        | zk::Error::Unimplemented => LockError::protocol(ISSUER, e),
        e => LockError::unavailable(ISSUER, e),
    }
}

/// The last path segment.
fn node_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The sequence suffix of a fair lock node (`...-lock-0000000042`).
fn sequence_of(node: &str) -> Option<i64> {
    let (_, seq) = node.rsplit_once(FAIR_NODE)?;
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        return None;
    }
    seq.parse().ok()
}

/// A lock name as one ZooKeeper path segment: `[A-Za-z0-9_-]` kept, every
/// other byte written `%XX`. Injective, so two names never share a node, and
/// never `.`/`..` or a `/`.
pub fn escape_name(name: &str) -> Result<String, LockError> {
    if name.is_empty() {
        return Err(LockError::InvalidConfig("lock name is empty".into()));
    }
    if name.len() > MAX_NAME {
        return Err(LockError::InvalidConfig(format!(
            "lock name is {} bytes; at most {MAX_NAME}",
            name.len()
        )));
    }
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_one_safe_segment() {
        assert_eq!(escape_name("page-1").unwrap(), "page-1");
        assert_eq!(escape_name("a/b").unwrap(), "a%2Fb");
        assert_eq!(escape_name("..").unwrap(), "%2E%2E");
        assert_eq!(escape_name("%2F").unwrap(), "%252F");
        assert_eq!(escape_name("é").unwrap(), "%C3%A9");
        assert!(matches!(escape_name(""), Err(LockError::InvalidConfig(_))));
        assert!(matches!(
            escape_name(&"x".repeat(201)),
            Err(LockError::InvalidConfig(_))
        ));
    }

    #[test]
    fn sequence_suffix_is_parsed_from_curator_names() {
        assert_eq!(sequence_of("_c_0b5e-lock-0000000042"), Some(42));
        assert_eq!(sequence_of("_c_x-lock-"), None);
        assert_eq!(sequence_of("other"), None);
    }

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
