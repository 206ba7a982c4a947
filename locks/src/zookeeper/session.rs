//! The session and what keeps it tidy: opening it, retrying through
//! connection losses, watching for its end, and deleting the nodes an
//! abandoned acquire or a dropped lease leaves behind.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use super::credentials::Credentials;
use super::ISSUER;
use crate::{LockError, LostTrigger};

/// How many times an operation is retried after a connection loss (100 ms
/// apart): enough to ride out a leader election of a few seconds.
pub(super) const CONNECTION_LOSS_RETRIES: u32 = 60;

/// Fire the lost signal when the session ends. A disconnect is not a loss:
/// the session (and our node) survive until the session timeout, and the
/// lease's deadline already bounds how long we trust it without an answer.
pub(super) async fn watch_session(
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

/// A lock node this client created, and what proves it is still ours.
#[derive(Debug, Clone)]
pub(super) struct OwnNode {
    pub(super) path: String,
    pub(super) czxid: i64,
    /// The non-fair lock's fixed path `{parent}/lock`: the next holder creates
    /// its node under the same name, so a name alone does not say whose it
    /// is. Queue nodes carry our GUID in their names and are never reused.
    pub(super) reused_path: bool,
}

/// What [`delete_own`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Deleted {
    /// Our node is gone, by this call (or by its earlier attempt whose reply
    /// was lost).
    Now,
    /// It was gone before the first attempt: not held any more.
    Before,
}

/// Delete our node and only ours, retrying through connection losses for up
/// to `patience` while the session lives.
///
/// A queue node's name holds our GUID, so deleting it by name can only ever
/// delete ours. The non-fair lock's fixed path is the hard case: when the
/// reply to a delete that did succeed is lost, the next holder may already
/// have created its own node at the same path, and a blind retry would
/// delete it. So that node is deleted only after a `sync` and a stat show it
/// still has our creation zxid, and then with the version the stat read.
///
/// Why the `sync` and what is left: ZooKeeper applies one session's requests
/// in order, and refuses requests still in flight from a connection the
/// session has since moved away from (SESSIONMOVED). After the reconnect, the
/// sync (answered by the leader once what it had proposed before is
/// committed) and the stat therefore see the first delete if it was ever
/// going to be applied. The version does not tell holders apart (every holder's
/// node is created with version 0; ZooKeeper's multi-op `check` compares only
/// that version, not the czxid, so it adds nothing). The window left is a
/// delete of our node by somebody else between our stat and our delete, with
/// the next holder re-creating it in between: nothing in this protocol deletes
/// another client's node, so only an operator or a foreign client can open it.
///
/// `first_attempt: FirstAttempt::Blind` (the release, when no delete of this
/// node was ever sent) skips the check on the first try: the node at the path
/// is ours until something deletes it, our session is the only client in the
/// protocol that does, and it has not tried yet (if the session ended, the
/// delete fails with `SessionExpired` and touches nothing). That saves the
/// `sync` and the stat (a round trip through the leader) on every uncontended
/// release. Every retry, and the background cleanup (which may follow a
/// release whose reply was lost), checks.
pub(super) async fn delete_own(
    client: &zk::Client,
    node: &OwnNode,
    patience: Duration,
    first_attempt: FirstAttempt,
) -> Result<Deleted, zk::Error> {
    let deadline = Instant::now() + patience;
    let mut delay = Duration::from_millis(50);
    let mut lost_a_reply = false;
    let mut blind = first_attempt == FirstAttempt::Blind;
    let gone = |lost_a_reply| {
        if lost_a_reply {
            Deleted::Now
        } else {
            Deleted::Before
        }
    };
    loop {
        let version = if node.reused_path && !std::mem::take(&mut blind) {
            let (synced, stat) =
                tokio::join!(client.sync(&node.path), client.check_stat(&node.path));
            match synced.and(stat) {
                Ok(Some(stat)) if stat.czxid == node.czxid => Some(stat.version),
                Ok(_) | Err(zk::Error::NoNode) => return Ok(gone(lost_a_reply)),
                Err(zk::Error::ConnectionLoss)
                    if Instant::now() < deadline && !client.state().is_terminated() =>
                {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                    continue;
                }
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        match client.delete(&node.path, version).await {
            Ok(()) => return Ok(Deleted::Now),
            Err(zk::Error::NoNode) => return Ok(gone(lost_a_reply)),
            // Changed between our stat and our delete: look again.
            Err(zk::Error::BadVersion) => continue,
            Err(zk::Error::ConnectionLoss)
                if Instant::now() < deadline && !client.state().is_terminated() =>
            {
                lost_a_reply = true;
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether [`delete_own`] may skip the ownership check on its first try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FirstAttempt {
    /// No delete of this node was ever sent: the node is ours.
    Blind,
    /// A delete may have been sent before (its reply lost): check first.
    Checked,
}

/// What a dropped acquire leaves behind and must delete.
pub(super) enum Pending {
    Nothing,
    /// A queue create was sent; its node (if any) carries this GUID prefix.
    QueueCreating {
        parent: String,
        guid_prefix: String,
    },
    /// A non-fair create was sent; the node is ours if its data is ours.
    NonFairCreating {
        path: String,
        data: Vec<u8>,
    },
    /// This node is ours.
    Created(OwnNode),
}

/// Deletes what [`Pending`] names when dropped before [`Cleanup::disarm`].
pub(super) struct Cleanup {
    client: zk::Client,
    pub(super) pending: Pending,
}

impl Cleanup {
    pub(super) fn new(client: zk::Client, pending: Pending) -> Self {
        Self { client, pending }
    }

    pub(super) fn disarm(&mut self) {
        self.pending = Pending::Nothing;
    }

    /// Delete now and wait for it (used on timeout, so the next waiter's
    /// predecessor watch fires before we report the timeout).
    pub(super) async fn delete_now(&mut self) {
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

pub(super) fn spawn_cleanup(client: zk::Client, pending: Pending) {
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

/// How long the background cleanup keeps trying through connection losses: an
/// abandoned node must not outlive a server restart shorter than the session
/// timeout. Once the session has ended, the ephemeral node is gone anyway.
const CLEANUP_PATIENCE: Duration = Duration::from_secs(120);

pub(super) async fn clean(client: &zk::Client, pending: Pending) {
    let node = match pending {
        Pending::Nothing => return,
        Pending::Created(node) => Some(node),
        Pending::QueueCreating {
            parent,
            guid_prefix,
        } => match find_by_guid(client, &parent, &guid_prefix).await {
            Ok(Some((path, stat))) => Some(OwnNode {
                path,
                czxid: stat.czxid,
                reused_path: false,
            }),
            Ok(None) | Err(_) => None,
        },
        Pending::NonFairCreating { path, data } => match retry(|| client.get_data(&path)).await {
            Ok((stored, stat)) if stored == data => Some(OwnNode {
                path,
                czxid: stat.czxid,
                reused_path: true,
            }),
            _ => None,
        },
    };
    if let Some(node) = node {
        match delete_own(client, &node, CLEANUP_PATIENCE, FirstAttempt::Checked).await {
            Ok(_) => tracing::debug!(path = %node.path, "abandoned lock node deleted"),
            Err(e) => {
                tracing::debug!(path = %node.path, "could not delete abandoned lock node: {e}")
            }
        }
    }
}

/// Our queue node, found by the GUID in its name, after a `sync`: a session
/// that reconnected to another server must not miss a node that the server
/// it lost created for it (the create whose reply never came). Without the
/// sync a lagging follower could answer without it, and the caller would
/// create a second node that then waits behind the first, its own.
pub(super) async fn find_by_guid(
    client: &zk::Client,
    parent: &str,
    guid_prefix: &str,
) -> Result<Option<(String, zk::Stat)>, zk::Error> {
    let children = retry(|| async {
        let (synced, listed) = tokio::join!(client.sync(parent), client.list_children(parent));
        synced.and(listed)
    })
    .await;
    let children = match children {
        Ok(c) => c,
        Err(zk::Error::NoNode) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(child) = children.into_iter().find(|c| c.starts_with(guid_prefix)) else {
        return Ok(None);
    };
    let path = format!("{parent}/{child}");
    // Ours only if our session created it (a GUID is no secret once listed).
    match retry(|| client.check_stat(&path)).await? {
        Some(stat) if stat.ephemeral_owner == client.session_id().0 => Ok(Some((path, stat))),
        Some(_) | None => Ok(None),
    }
}

/// Retry `op` after connection losses (a server died; the client moves to
/// another one and keeps the session).
pub(super) async fn retry<T, F, Fut>(mut op: F) -> Result<T, zk::Error>
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

/// A watch woken by the end of the session means our node is gone.
pub(super) fn session_still_alive(event: &zk::WatchedEvent) -> Result<(), LockError> {
    if event.event_type == zk::EventType::Session && event.session_state.is_terminated() {
        return Err(LockError::unavailable(
            ISSUER,
            format!("zookeeper session {:?} while waiting", event.session_state),
        ));
    }
    Ok(())
}

pub(super) fn timeout(name: &str, start: Instant) -> LockError {
    LockError::Timeout {
        name: name.to_string(),
        waited: start.elapsed(),
    }
}

/// A session on `connect_string`, authenticated as each of `auth` (digest):
/// its rights are the union of theirs.
pub(super) async fn new_session(
    connect_string: &str,
    session_timeout: Duration,
    auth: &[Credentials],
) -> Result<zk::Client, LockError> {
    if connect_string.trim().is_empty() {
        return Err(LockError::InvalidConfig(
            "zookeeper connect string is empty".into(),
        ));
    }
    let mut connector = zk::Client::connector()
        .with_session_timeout(session_timeout)
        .with_fail_eagerly();
    for credentials in auth {
        connector = connector.with_auth("digest", &credentials.auth());
    }
    connector
        .connect(connect_string)
        .await
        .map_err(|e| match e {
            zk::Error::BadArguments(_) => LockError::InvalidConfig(format!(
                "bad zookeeper connect string {connect_string:?}: {e}"
            )),
            e => LockError::unavailable(ISSUER, format!("{connect_string}: {e}")),
        })
}

pub(super) fn zk_error(e: zk::Error) -> LockError {
    match e {
        zk::Error::NoAuth => LockError::InvalidConfig(
            "zookeeper refused the request (NoAuth): the users this session authenticates as \
             have no such right on the node (see fencelock::zookeeper::Access and prepare_root)"
                .into(),
        ),
        zk::Error::BadArguments(_) | zk::Error::InvalidAcl | zk::Error::AuthFailed => {
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
