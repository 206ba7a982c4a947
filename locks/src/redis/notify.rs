//! The waiters' pub/sub side: one connection per [`RedisLock`] (and its
//! clones), opened at the first contended acquire, subscribed to the
//! channels of the locks somebody in this process waits for.
//!
//! [`RedisLock`]: super::RedisLock

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::connection::{Server, CONNECT_TIMEOUT};
use super::keys::channel;
use crate::wake::{Registration, Wakers};
use crate::LockError;

/// After the pub/sub connection failed to open, waiters poll for this long
/// before it is tried again.
const PUBSUB_RETRY: Duration = Duration::from_secs(1);

pub(super) struct Notifier {
    wakers: Arc<Wakers>,
    state: tokio::sync::Mutex<PubSubState>,
}

#[derive(Default)]
struct PubSubState {
    sink: Option<PubSubSink>,
    subscribed: HashSet<String>,
    /// When opening the connection last failed (waiters poll meanwhile).
    failed_at: Option<Instant>,
    /// Dropping it stops the reader task of the current connection.
    _stop: Option<oneshot::Sender<()>>,
    /// Which connection this is (a reader only clears its own).
    generation: u64,
}

impl Notifier {
    pub(super) fn new() -> Arc<Notifier> {
        Arc::new_cyclic(|me: &Weak<Notifier>| {
            let me = me.clone();
            Notifier {
                wakers: Arc::new(Wakers::with_on_empty(Box::new(move |channel: &str| {
                    // The last waiter of `channel` left: unsubscribe, unless
                    // a new one came meanwhile (checked under the state lock).
                    let (Some(me), Ok(rt)) = (me.upgrade(), tokio::runtime::Handle::try_current())
                    else {
                        return;
                    };
                    let channel = channel.to_string();
                    rt.spawn(async move { me.unsubscribe_if_unused(&channel).await });
                }))),
                state: tokio::sync::Mutex::new(PubSubState::default()),
            }
        })
    }

    /// Register a waiter for lock `name` and make sure its channel is
    /// subscribed (the server confirmed it) before returning. `None` when
    /// pub/sub is unavailable: the waiter polls.
    pub(super) async fn subscribe(
        self: &Arc<Self>,
        server: &Server,
        name: &str,
        waiter: Option<Arc<str>>,
    ) -> Option<Registration> {
        let channel = channel(name);
        let registration = self.wakers.register(&channel, waiter);
        let mut state = self.state.lock().await;
        if state.subscribed.contains(&channel) && state.sink.is_some() {
            return Some(registration);
        }
        if state.sink.is_none() {
            if state
                .failed_at
                .is_some_and(|at| at.elapsed() < PUBSUB_RETRY)
            {
                return None;
            }
            match self.open(server, &mut state).await {
                Ok(()) => state.failed_at = None,
                Err(e) => {
                    tracing::debug!(issuer = server.issuer, "pub/sub unavailable, polling: {e}");
                    state.failed_at = Some(Instant::now());
                    return None;
                }
            }
        }
        let sink = state.sink.as_mut().expect("opened above");
        match tokio::time::timeout(CONNECT_TIMEOUT, sink.subscribe(&channel)).await {
            Ok(Ok(())) => {
                state.subscribed.insert(channel);
                Some(registration)
            }
            failed => {
                tracing::debug!(
                    issuer = server.issuer,
                    "SUBSCRIBE failed, polling: {failed:?}"
                );
                Self::close(&mut state);
                None
            }
        }
    }

    /// Open the pub/sub connection and start the task that reads it.
    async fn open(
        self: &Arc<Self>,
        server: &Server,
        state: &mut PubSubState,
    ) -> Result<(), LockError> {
        let issuer = server.issuer;
        let client = server
            .source()
            .pubsub_client()
            .await
            .map_err(|e| LockError::unavailable(issuer, e))?;
        let pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
            .await
            .map_err(|_| LockError::unavailable(issuer, "pub/sub connect timed out"))?
            .map_err(|e| LockError::unavailable(issuer, e))?;
        let (sink, mut stream) = pubsub.split();
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        state.generation += 1;
        let generation = state.generation;
        state.sink = Some(sink);
        state._stop = Some(stop_tx);
        state.subscribed.clear();
        let me = Arc::downgrade(self);
        let wakers = self.wakers.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    msg = stream.next() => match msg {
                        Some(msg) => {
                            let target = String::from_utf8_lossy(msg.get_payload_bytes());
                            wakers.notify(msg.get_channel_name(), &target);
                        }
                        None => break,
                    },
                    _ = &mut stop_rx => return,
                }
            }
            // The connection broke: messages may have been lost. Forget it
            // (the next waiter reopens it) and wake everybody to try again.
            if let Some(me) = me.upgrade() {
                let mut state = me.state.lock().await;
                if state.generation == generation {
                    Self::close(&mut state);
                }
            }
            wakers.notify_all();
        });
        Ok(())
    }

    fn close(state: &mut PubSubState) {
        state.sink = None;
        state._stop = None;
        state.subscribed.clear();
    }

    async fn unsubscribe_if_unused(&self, channel: &str) {
        let mut state = self.state.lock().await;
        if self.wakers.has(channel) || !state.subscribed.remove(channel) {
            return;
        }
        if let Some(sink) = state.sink.as_mut() {
            match tokio::time::timeout(CONNECT_TIMEOUT, sink.unsubscribe(channel)).await {
                Ok(Ok(())) => {}
                _ => Self::close(&mut state),
            }
        }
    }
}
