//! The session and what keeps it tidy: opening it, retrying through
//! connection losses, watching for its end, and deleting the nodes an
//! abandoned acquire or a dropped lease leaves behind.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

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

/// What a dropped acquire leaves behind and must delete.
pub(super) enum Pending {
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

pub(super) async fn clean(client: &zk::Client, pending: Pending) {
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

/// Retry `op` through connection losses for as long as the session can still
/// be alive (bounded at two minutes): an abandoned node must not outlive a
/// server restart shorter than the session timeout. Once the session has
/// ended, the ephemeral node is gone anyway.
pub(super) async fn retry_while_session_lives<T, F, Fut>(
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

pub(super) async fn new_session(
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

pub(super) fn zk_error(e: zk::Error) -> LockError {
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
