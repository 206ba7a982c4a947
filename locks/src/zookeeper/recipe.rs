//! The recipes: the queue of ephemeral-sequential nodes (the fair mutex and
//! both halves of the read-write lock) or the one ephemeral node (non-fair),
//! protected creation, and reading who holds a lock.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;
use zookeeper_client as zk;

use super::path::{node_name, queue_of, NodeKind, NON_FAIR_NODE};
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
        let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let listed_at = Instant::now();
        let (created, listed) = tokio::join!(
            client.create(&prefix, at.data, &mode),
            client.list_children(parent)
        );
        let created_at_once = created.is_ok();
        let (path, stat) = create_protected(
            client,
            at.root,
            parent,
            &prefix,
            &guid_prefix,
            at.data,
            created,
        )
        .await?;
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
            if children.iter().any(|c| c == NON_FAIR_NODE) {
                cleanup.delete_now().await;
                return Err(mixed_variants(at.name, "the non-fair variant"));
            }
            let queue = queue_of(&children);
            // Nodes with our GUID that are not the one we know: a create of
            // ours that was applied twice (its reply lost, the recovery's
            // listing missed it). Waiting on one would be waiting on
            // ourselves until the session ends: delete them instead.
            let strays: Vec<String> = queue
                .iter()
                .filter(|n| n.name.starts_with(&guid_prefix) && n.name != ours)
                .map(|n| format!("{parent}/{}", n.name))
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
            let Some(pos) = queue.iter().position(|n| n.name == ours) else {
                return Err(LockError::NotHeld {
                    name: at.name.to_string(),
                    reason: format!(
                        "our lock node {} vanished while waiting (session expired?)",
                        node.path
                    ),
                });
            };
            let blocker = match kind {
                NodeKind::Read => queue[..pos].iter().rev().find(|n| n.kind.is_exclusive()),
                NodeKind::Lock | NodeKind::Write => pos.checked_sub(1).map(|p| &queue[p]),
            };
            let Some(blocker) = blocker else {
                return Ok(Held {
                    node,
                    proven_at: sent,
                    cleanup,
                });
            };
            let blocker = format!("{parent}/{}", blocker.name);
            if !self.await_change(at, &blocker).await? {
                cleanup.delete_now().await;
                return Err(at.timed_out());
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
    pub(super) async fn wait_non_fair(&self, at: &Attempt<'_>) -> Result<Held, LockError> {
        let (client, parent) = (at.client, at.parent);
        let path = format!("{parent}/{NON_FAIR_NODE}");
        let mut cleanup = at.cleanup(Pending::NonFairCreating {
            path: path.clone(),
            data: at.data.to_vec(),
        });
        let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
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
                        refuse_queue(children, at.name)?;
                    }
                    None
                }
                Err(zk::Error::NoNode) => {
                    ensure_parent(client, at.root, parent).await?;
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
                match children
                    .map_err(zk_error)
                    .and_then(|c| refuse_queue(&c, at.name))
                {
                    Ok(()) => {
                        return Ok(Held {
                            node,
                            proven_at: sent,
                            cleanup,
                        })
                    }
                    Err(e) => {
                        cleanup.delete_now().await;
                        return Err(e);
                    }
                }
            }
            if !self.await_change(at, &path).await? {
                return Err(at.timed_out());
            }
        }
    }

    /// Wait until the node at `path` changes or is gone: true then, false
    /// once the deadline passed (before or during the wait). A watch woken by
    /// the end of the session is an error: our own node went with it.
    async fn await_change(&self, at: &Attempt<'_>, path: &str) -> Result<bool, LockError> {
        if at.deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
        let (exists, watcher) = retry(|| at.client.check_and_watch_stat(path))
            .await
            .map_err(zk_error)?;
        if exists.is_none() {
            return Ok(true);
        }
        match self.park(watcher, at.deadline).await {
            Some(event) => session_still_alive(&event).map(|()| true),
            None => Ok(false),
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

/// The non-fair side of the refusal: queue nodes under the parent.
fn refuse_queue(children: &[String], name: &str) -> Result<(), LockError> {
    match queue_of(children).first() {
        Some(n) if n.kind == NodeKind::Lock => Err(mixed_variants(name, "the fair lock")),
        Some(_) => Err(mixed_variants(name, "a read-write lock")),
        None => Ok(()),
    }
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
                if let Some(found) = find_by_guid(client, parent, guid_prefix)
                    .await
                    .map_err(zk_error)?
                {
                    return Ok(found);
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

/// Who holds a lock exclusively as ZooKeeper sees it now: the node's data
/// after the GUID line (the holder's id) and its czxid (the holder's token).
/// `None` when nobody does: free, or held by readers (they share it, and no
/// one of them is *the* holder).
///
/// The holder is the head of the queue (a mutex or a writer), or the
/// non-fair node. Both can be there for a moment when the two variants are
/// mixed on one name and one of them is backing out; then the older one
/// holds (the younger saw it and refuses).
///
/// The `sync` is pipelined with the listing: ZooKeeper answers a session's
/// requests in order and a read after a `sync` reflects every write the
/// leader had committed when the sync reached it, so a session on a lagging
/// follower does not miss a grant that another client was just answered.
pub(super) async fn head_of(
    client: &zk::Client,
    parent: &str,
) -> Result<Option<(String, i64)>, LockError> {
    let (synced, listed) = tokio::join!(client.sync(parent), client.list_children(parent));
    let children = match synced.and(listed) {
        Ok(c) => c,
        Err(zk::Error::NoNode) => return Ok(None),
        Err(zk::Error::ConnectionLoss) => match retry(|| client.list_children(parent)).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(zk_error(e)),
        },
        Err(e) => return Err(zk_error(e)),
    };
    let head = queue_of(&children)
        .first()
        .map(|n| (n.name.to_string(), n.kind.is_exclusive()));
    let non_fair = has_non_fair_node(&children).then(|| (NON_FAIR_NODE.to_string(), true));
    let mut oldest: Option<(i64, bool, String)> = None;
    for (child, exclusive) in head.into_iter().chain(non_fair) {
        let path = format!("{parent}/{child}");
        match retry(|| client.get_data(&path)).await {
            Ok((data, stat)) => {
                if oldest
                    .as_ref()
                    .is_none_or(|(czxid, ..)| stat.czxid < *czxid)
                {
                    let text = String::from_utf8_lossy(&data);
                    // Node data is "<guid>\n<id>".
                    let id = text.split_once('\n').map_or(&*text, |(_, c)| c).to_string();
                    oldest = Some((stat.czxid, exclusive, id));
                }
            }
            Err(zk::Error::NoNode) => {
                tracing::debug!(node = %child, "head node went while reading it");
            }
            Err(e) => return Err(zk_error(e)),
        }
    }
    Ok(match oldest {
        Some((czxid, true, id)) => Some((id, czxid)),
        _ => None,
    })
}
