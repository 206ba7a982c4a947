//! The recipes: the queue of ephemeral-sequential nodes (the fair mutex and
//! both halves of the read-write lock) or the one ephemeral node (non-fair),
//! protected creation, and reading who holds a lock.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;
use zookeeper_client as zk;

use super::access::Access;
use super::path::{node_name, NodeKind, Role, NON_FAIR_NODE};
use super::queue::{counted, is_ephemeral, Counted};
use super::session::{
    find_by_guid, retry, session_still_alive, timeout, zk_error, Cleanup, OwnNode, Pending,
    CONNECTION_LOSS_RETRIES,
};
use super::{ZooKeeperLock, ISSUER};
use crate::LockError;

impl ZooKeeperLock {
    /// The queue recipe: create our sequential node, then wait until nothing
    /// queued before it stands in our way, watching only the one node whose
    /// deletion can change that. A mutex or writer waits for every node
    /// before it and watches its predecessor; a reader waits only for the
    /// exclusive nodes (writers, mutexes) before it and watches the nearest.
    ///
    /// "Before it" is in creation order (czxid), among ephemeral nodes: see
    /// [`super::queue`]. Which nodes those are is read once, from the first
    /// listing answered after our create: a node created later has a higher
    /// czxid, so it is never before ours, whatever its name.
    pub(super) async fn wait_queued(
        &self,
        at: &Attempt<'_>,
        guid: uuid::Uuid,
        kind: NodeKind,
    ) -> Result<Held, LockError> {
        let (client, parent) = (at.client, at.parent);
        let guid_prefix = format!("_c_{guid}-");
        let mut cleanup = at.cleanup(Pending::QueueCreating {
            parent: parent.to_string(),
            guid_prefix: guid_prefix.clone(),
        });
        let prefix = format!("{parent}/{guid_prefix}{}", kind.infix());
        // Pipelined: the getChildren is sent right behind the create, before
        // its answer. ZooKeeper answers one session's requests in order, so
        // the listing already holds our node (found by its GUID): an
        // uncontended acquire costs one round trip, not two.
        let mode = zk::CreateMode::EphemeralSequential.with_acls(at.access.node_acls());
        let listed_at = Instant::now();
        let (created, listed) = tokio::join!(
            client.create(&prefix, at.data, &mode),
            client.list_children(parent)
        );
        let created_at_once = created.is_ok();
        let (path, stat) = create_protected(at, &prefix, &guid_prefix, created).await?;
        let node = OwnNode {
            path,
            czxid: stat.czxid,
            reused_path: false,
        };
        cleanup.pending = Pending::Created(node.clone());
        let ours = node_name(&node.path).to_string();
        let mut first = match listed {
            Ok(children) if created_at_once => Some(children),
            _ => None,
        };
        let mut ahead: Option<Vec<Counted>> = None;
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
            // Nodes with our GUID that are not the one we know: a create of
            // ours that was applied twice (its reply lost, the recovery's
            // listing missed it). Waiting on one would be waiting on
            // ourselves until the session ends: delete them instead.
            let strays: Vec<String> = children
                .iter()
                .filter(|c| c.starts_with(&guid_prefix) && **c != ours)
                .map(|c| format!("{parent}/{c}"))
                .collect();
            if !strays.is_empty() {
                for stray in &strays {
                    tracing::warn!(lock = %at.name, node = node_name(stray), "deleting a second node of ours");
                    match retry(|| client.delete(stray, None)).await {
                        Ok(()) | Err(zk::Error::NoNode) => {}
                        Err(e) => return Err(zk_error(e)),
                    }
                }
                continue;
            }
            if !children.contains(&ours) {
                return Err(LockError::NotHeld {
                    name: at.name.to_string(),
                    reason: format!(
                        "our lock node {} vanished while waiting (session expired?)",
                        node.path
                    ),
                });
            }
            let ahead = match &mut ahead {
                Some(ahead) => {
                    let listed: HashSet<&str> = children.iter().map(String::as_str).collect();
                    ahead.retain(|n| listed.contains(n.name.as_str()));
                    ahead
                }
                None => {
                    let mut before = counted(client, parent, &children, &ours)
                        .await
                        .map_err(zk_error)?;
                    before.retain(|n| n.czxid < node.czxid);
                    if before.iter().any(|n| n.role == Role::NonFair) {
                        cleanup.delete_now().await;
                        return Err(mixed_variants(at.name, "the non-fair variant"));
                    }
                    ahead.insert(before)
                }
            };
            let blocker = match kind {
                NodeKind::Read => ahead.iter().rev().find(|n| n.role.is_exclusive()),
                NodeKind::Lock | NodeKind::Write => ahead.last(),
            };
            let Some(Counted { name, czxid, .. }) = blocker.cloned() else {
                return Ok(Held {
                    node,
                    proven_at: sent,
                    cleanup,
                });
            };
            match self
                .await_change(at, &format!("{parent}/{name}"), Some(czxid))
                .await?
            {
                Waited::Changed => {}
                // Gone, or another node under its name since: not before ours.
                Waited::Gone | Waited::Persistent => ahead.retain(|n| n.czxid != czxid),
                Waited::TimedOut => {
                    cleanup.delete_now().await;
                    return Err(at.timed_out());
                }
            }
        }
    }

    /// The non-fair recipe: try to create the one node; if it exists, watch it
    /// and try again when it changes. Everybody watches the same node.
    ///
    /// Every create is followed (pipelined) by a listing of the parent: when
    /// queue nodes are there, a fair lock or a read-write lock uses the same
    /// name, and the two would not exclude each other, so we refuse (and
    /// delete our node if we made one). The queue recipe refuses the same way
    /// when it sees this node. Both look after their own create, so of two
    /// that race, the later one always sees the earlier one: never both hold.
    /// Only queue nodes that count ([`super::queue`]) refuse.
    ///
    /// A node at our path that is not ephemeral holds nothing (no session
    /// ends it) but keeps every create out: refused as well. It is not
    /// deleted: a delete can only say which version it deletes, and the next
    /// holder's node has the same one, so two waiters that both saw the
    /// planted node could delete a holder's node.
    pub(super) async fn wait_non_fair(&self, at: &Attempt<'_>) -> Result<Held, LockError> {
        let (client, parent) = (at.client, at.parent);
        let path = format!("{parent}/{NON_FAIR_NODE}");
        let mut cleanup = at.cleanup(Pending::NonFairCreating {
            path: path.clone(),
            data: at.data.to_vec(),
        });
        let ephemeral = zk::CreateMode::Ephemeral.with_acls(at.access.node_acls());
        loop {
            let sent = Instant::now();
            let (created, listed) = tokio::join!(
                client.create(&path, at.data, &ephemeral),
                client.list_children(parent)
            );
            let czxid = match created {
                Ok((stat, _)) => Some(stat.czxid),
                Err(zk::Error::NodeExists) => {
                    if let Ok(children) = &listed {
                        refuse_queue(client, parent, children, at.name).await?;
                    }
                    None
                }
                Err(zk::Error::NoNode) => {
                    ensure_parent(at).await?;
                    continue;
                }
                Err(zk::Error::ConnectionLoss) => {
                    // Protected mode for the single node: the data carries
                    // our GUID. `sync` first, for the same reason as
                    // `find_by_guid`.
                    let read = retry(|| async {
                        let (synced, read) =
                            tokio::join!(client.sync(&path), client.get_data(&path));
                        synced.and(read)
                    })
                    .await;
                    match read {
                        Ok((stored, stat)) if stored == at.data => Some(stat.czxid),
                        Ok(_) | Err(zk::Error::NoNode) => continue,
                        Err(e) => return Err(zk_error(e)),
                    }
                }
                Err(e) => return Err(zk_error(e)),
            };
            if let Some(czxid) = czxid {
                let node = OwnNode {
                    path,
                    czxid,
                    reused_path: true,
                };
                cleanup.pending = Pending::Created(node.clone());
                // The listing that matters is one answered after our create.
                let children = match listed {
                    Ok(children) if has_non_fair_node(&children) => Ok(children),
                    _ => retry(|| client.list_children(parent)).await,
                };
                let refused = match children {
                    Ok(children) => refuse_queue(client, parent, &children, at.name).await,
                    Err(e) => Err(zk_error(e)),
                };
                if let Err(e) = refused {
                    cleanup.delete_now().await;
                    return Err(e);
                }
                return Ok(Held {
                    node,
                    proven_at: sent,
                    cleanup,
                });
            }
            match self.await_change(at, &path, None).await? {
                Waited::Changed | Waited::Gone => {}
                Waited::TimedOut => return Err(at.timed_out()),
                Waited::Persistent => {
                    return Err(LockError::InvalidConfig(format!(
                        "zookeeper lock {:?}: {path} is not an ephemeral node, so it holds \
                         nothing and no session end removes it, but it keeps the non-fair \
                         lock from being taken: an operator must delete it",
                        at.name
                    )))
                }
            }
        }
    }

    /// Wait until the node at `path` (the one created in `czxid`, if given)
    /// changes or is gone, up to the deadline (past already: `TimedOut` at
    /// once). A watch woken by the end of the session is an error: our own
    /// node went with it.
    async fn await_change(
        &self,
        at: &Attempt<'_>,
        path: &str,
        czxid: Option<i64>,
    ) -> Result<Waited, LockError> {
        if at.deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(Waited::TimedOut);
        }
        let (exists, watcher) = retry(|| at.client.check_and_watch_stat(path))
            .await
            .map_err(zk_error)?;
        match exists {
            None => return Ok(Waited::Gone),
            Some(stat) if czxid.is_some_and(|c| c != stat.czxid) => return Ok(Waited::Gone),
            Some(stat) if !is_ephemeral(&stat) => return Ok(Waited::Persistent),
            Some(_) => {}
        }
        match self.park(watcher, at.deadline).await {
            Some(event) => session_still_alive(&event).map(|()| Waited::Changed),
            None => Ok(Waited::TimedOut),
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

/// Whether a listing sent right behind our create shows the node (it was
/// answered after the create, so it must, unless the create failed).
fn has_non_fair_node(children: &[String]) -> bool {
    children.iter().any(|c| c == NON_FAIR_NODE)
}

/// The non-fair side of the refusal: queue nodes that count under the
/// parent. Their stats are read only when the listing names some.
async fn refuse_queue(
    client: &zk::Client,
    parent: &str,
    children: &[String],
    name: &str,
) -> Result<(), LockError> {
    let queue = counted(client, parent, children, NON_FAIR_NODE)
        .await
        .map_err(zk_error)?;
    match queue.first().map(|n| n.role) {
        Some(Role::Queued(NodeKind::Lock)) => Err(mixed_variants(name, "the fair lock")),
        Some(_) => Err(mixed_variants(name, "a read-write lock")),
        None => Ok(()),
    }
}

/// What a waiter found at the node it waited on.
enum Waited {
    /// Its watch fired: look again.
    Changed,
    /// Gone, or another node stands under its name now.
    Gone,
    /// It is not ephemeral.
    Persistent,
    /// The deadline passed.
    TimedOut,
}

/// The fair and the non-fair recipe keep different nodes under the same
/// parent and neither waits for the other's: on one name they would both hold.
fn mixed_variants(name: &str, other: &str) -> LockError {
    LockError::InvalidConfig(format!(
        "zookeeper lock {name:?} is in use by {other}: the fair and the non-fair \
         recipes do not exclude each other, so they are refused on the same name \
         (use one variant for a name everywhere)"
    ))
}

/// One acquire: where its node goes, what it holds, and how long it waits.
#[derive(Clone, Copy)]
pub(super) struct Attempt<'a> {
    pub(super) client: &'a zk::Client,
    /// The root of all such locks (the parent's parent).
    pub(super) root: &'a str,
    /// The lock's own node, under which the queue or the non-fair node goes.
    pub(super) parent: &'a str,
    /// The node's data: `<guid>\n<id>`.
    pub(super) data: &'a [u8],
    /// The ACLs of the nodes it creates.
    pub(super) access: &'a Access,
    pub(super) name: &'a str,
    pub(super) start: Instant,
    /// `None`: wait forever.
    pub(super) deadline: Option<Instant>,
}

impl Attempt<'_> {
    fn timed_out(&self) -> LockError {
        timeout(self.name, self.start)
    }

    /// Deletes what `pending` names unless disarmed (see [`Cleanup`]).
    fn cleanup(&self, pending: Pending) -> Cleanup {
        Cleanup::new(self.client.clone(), pending)
    }
}

/// A lock node we hold, and what proves it.
pub(super) struct Held {
    pub(super) node: OwnNode,
    /// When the last round trip that showed us the holder was sent.
    pub(super) proven_at: Instant,
    pub(super) cleanup: Cleanup,
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

/// Create our sequential node; after a connection loss, find it by GUID
/// (after a `sync`) instead of creating a second one (Curator's protected
/// mode).
async fn create_protected(
    at: &Attempt<'_>,
    prefix: &str,
    guid_prefix: &str,
    first_attempt: Result<(zk::Stat, zk::CreateSequence), zk::Error>,
) -> Result<(String, zk::Stat), LockError> {
    let mode = zk::CreateMode::EphemeralSequential.with_acls(at.access.node_acls());
    let mut attempt = first_attempt;
    for _ in 0..CONNECTION_LOSS_RETRIES {
        match attempt {
            Ok((stat, seq)) => return Ok((format!("{prefix}{seq}"), stat)),
            Err(zk::Error::NoNode) => ensure_parent(at).await?,
            Err(zk::Error::ConnectionLoss) => {
                if let Some(found) = find_by_guid(at.client, at.parent, guid_prefix)
                    .await
                    .map_err(zk_error)?
                {
                    return Ok(found);
                }
            }
            Err(e) => return Err(zk_error(e)),
        }
        attempt = at.client.create(prefix, at.data, &mode).await;
    }
    Err(LockError::unavailable(
        ISSUER,
        "create kept failing with connection loss",
    ))
}

/// The lock's parent, as a CONTAINER node (ZooKeeper deletes it once it
/// is empty, so idle locks leave nothing behind). Without credentials the
/// root is created too, open to anyone; with them, an operator prepares
/// it ([`super::prepare_root`]): a root a lock client made could be given
/// any ACL, by whoever came first.
async fn ensure_parent(at: &Attempt<'_>) -> Result<(), LockError> {
    let (client, root) = (at.client, at.root);
    let container = zk::CreateMode::Container.with_acls(at.access.parent_acls());
    for _ in 0..2 {
        match retry(|| client.create(at.parent, &[], &container)).await {
            Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
            Err(zk::Error::NoNode) if at.access.creates_roots() => {
                let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                retry(|| client.mkdir(root, &persistent))
                    .await
                    .map_err(zk_error)?;
            }
            Err(zk::Error::NoNode) => break,
            Err(e) => return Err(zk_error(e)),
        }
    }
    Err(LockError::InvalidConfig(format!(
        "the zookeeper lock root {root} does not exist: an operator creates it with its \
         ACLs before lock clients with credentials use it (fencelock::zookeeper::prepare_root)"
    )))
}
