//! The recipe: the queue of ephemeral-sequential nodes (fair) or the one
//! ephemeral node (non-fair), protected creation, and reading the head of the
//! queue.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;
use zookeeper_client as zk;

use super::path::{node_name, sequence_of, FAIR_NODE, NON_FAIR_NODE};
use super::session::{
    retry, session_still_alive, timeout, zk_error, Cleanup, Pending, CONNECTION_LOSS_RETRIES,
};
use super::{ZooKeeperLock, ISSUER};
use crate::LockError;

impl ZooKeeperLock {
    /// The fair recipe: create our sequential node, then wait until it is the
    /// lowest, watching only the node just before ours.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn wait_fair(
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
    pub(super) async fn wait_non_fair(
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

/// A lock node we hold, and what proves it.
pub(super) struct Held {
    pub(super) path: String,
    pub(super) czxid: i64,
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

/// The head of a lock's queue (the holder) as ZooKeeper sees it now: the
/// node's data after the GUID line (the holder's id) and its czxid (the
/// holder's token). `None` when nobody holds it.
///
/// The `sync` is pipelined with the listing: ZooKeeper answers a session's
/// requests in order and a read after a `sync` reflects every write the
/// leader had committed when the sync reached it, so a session on a lagging
/// follower does not miss a grant that another client was just answered.
pub(super) async fn head_of(
    client: &zk::Client,
    parent: &str,
    fair: bool,
) -> Result<Option<(String, i64)>, LockError> {
    let path = if fair {
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
        let lowest = children
            .iter()
            .filter(|c| c.starts_with("_c_") && c.contains(FAIR_NODE))
            .filter_map(|c| sequence_of(c).map(|s| (s, c)))
            .min();
        match lowest {
            Some((_, c)) => format!("{parent}/{c}"),
            None => return Ok(None),
        }
    } else {
        match retry(|| client.sync(parent)).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(zk_error(e)),
        }
        format!("{parent}/{NON_FAIR_NODE}")
    };
    match retry(|| client.get_data(&path)).await {
        Ok((data, stat)) => {
            let text = String::from_utf8_lossy(&data);
            // Node data is "<guid>\n<id>".
            let id = text.split_once('\n').map_or(&*text, |(_, c)| c).to_string();
            Ok(Some((id, stat.czxid)))
        }
        Err(zk::Error::NoNode) => {
            tracing::debug!(node = node_name(&path), "head node went while reading it");
            Ok(None)
        }
        Err(e) => Err(zk_error(e)),
    }
}
