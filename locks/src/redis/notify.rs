//! The waiters' pub/sub side: one connection per [`RedisLock`] (and its
//! clones), opened at the first contended acquire, subscribed to the
//! channels of the locks somebody in this process waits for.
//!
//! [`RedisLock`]: super::RedisLock

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
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
    /// Never held across an `await`: a waiter's future that stops being
    /// polled must not hold up the other waiters (see [`Notifier::subscribe`]).
    state: Mutex<PubSubState>,
    /// Orders the connection's opening, subscriptions and unsubscriptions.
    /// Held only by tasks this notifier spawns, which are always polled.
    io: tokio::sync::Mutex<()>,
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

impl PubSubState {
    /// Whether opening failed so recently that waiters should poll.
    fn failed_lately(&self) -> bool {
        self.sink.is_none() && self.failed_at.is_some_and(|at| at.elapsed() < PUBSUB_RETRY)
    }

    fn close(&mut self) {
        self.sink = None;
        self._stop = None;
        self.subscribed.clear();
    }
}

impl Notifier {
    pub(super) fn new() -> Arc<Notifier> {
        Arc::new_cyclic(|me: &Weak<Notifier>| {
            let me = me.clone();
            Notifier {
                wakers: Arc::new(Wakers::with_on_empty(Box::new(move |channel: &str| {
                    // The last waiter of `channel` left: unsubscribe, unless
                    // a new one came meanwhile (checked in that task).
                    let (Some(me), Ok(rt)) = (me.upgrade(), tokio::runtime::Handle::try_current())
                    else {
                        return;
                    };
                    let channel = channel.to_string();
                    rt.spawn(async move {
                        let _io = me.io.lock().await;
                        me.unsubscribe_if_unused(&channel).await;
                    });
                }))),
                state: Mutex::new(PubSubState::default()),
                io: tokio::sync::Mutex::new(()),
            }
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PubSubState> {
        self.state.lock().expect("pub/sub state")
    }

    /// Register a waiter for lock `name` and make sure its channel is
    /// subscribed (the server confirmed it) before returning. `None` when
    /// pub/sub is unavailable: the waiter polls.
    ///
    /// The connection is opened and the channel subscribed by a task of its
    /// own, whose outcome the waiter awaits: when that ran in the waiter's
    /// future under the notifier's lock, a future that stopped being polled
    /// there (dropped neither, as a task stuck elsewhere) kept every later
    /// waiter of the service from subscribing, past its own `wait`.
    pub(super) async fn subscribe(
        self: &Arc<Self>,
        server: &Arc<Server>,
        name: &str,
        waiter: Option<Arc<str>>,
    ) -> Option<Registration> {
        let channel = channel(name);
        let registration = self.wakers.register(&channel, waiter);
        {
            let state = self.state();
            if state.sink.is_some() && state.subscribed.contains(&channel) {
                return Some(registration);
            }
            if state.failed_lately() {
                return None;
            }
        }
        let (outcome_tx, outcome) = oneshot::channel();
        let (me, server) = (self.clone(), server.clone());
        tokio::spawn(async move {
            let _io = me.io.lock().await;
            let _ = outcome_tx.send(me.ensure_subscribed(&server, &channel).await);
        });
        outcome.await.unwrap_or(false).then_some(registration)
    }

    /// Subscribe `channel`, opening the connection first if there is none.
    /// Under the `io` lock.
    async fn ensure_subscribed(self: &Arc<Self>, server: &Server, channel: &str) -> bool {
        let current = {
            let state = self.state();
            if state.sink.is_some() && state.subscribed.contains(channel) {
                return true;
            }
            if state.failed_lately() {
                return false;
            }
            state.sink.clone().map(|sink| (sink, state.generation))
        };
        let (mut sink, generation) = match current {
            Some(open) => open,
            None => match self.open(server).await {
                Ok(opened) => opened,
                Err(e) => {
                    tracing::debug!(issuer = server.issuer, "pub/sub unavailable, polling: {e}");
                    self.state().failed_at = Some(Instant::now());
                    return false;
                }
            },
        };
        let subscribed = tokio::time::timeout(CONNECT_TIMEOUT, sink.subscribe(channel)).await;
        {
            let mut state = self.state();
            if state.generation != generation {
                return false;
            }
            if !matches!(subscribed, Ok(Ok(()))) {
                tracing::debug!(
                    issuer = server.issuer,
                    "SUBSCRIBE failed, polling: {subscribed:?}"
                );
                state.close();
                return false;
            }
            state.subscribed.insert(channel.to_string());
        }
        // Its waiters may all have left meanwhile, their unsubscription
        // finding nothing to undo yet.
        self.unsubscribe_if_unused(channel).await;
        true
    }

    /// Open the pub/sub connection and start the task that reads it; its
    /// sink and generation. Under the `io` lock.
    async fn open(self: &Arc<Self>, server: &Server) -> Result<(PubSubSink, u64), LockError> {
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
        let generation = {
            let mut state = self.state();
            state.generation += 1;
            state.sink = Some(sink.clone());
            state._stop = Some(stop_tx);
            state.subscribed.clear();
            state.failed_at = None;
            state.generation
        };
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
                let mut state = me.state();
                if state.generation == generation {
                    state.close();
                }
            }
            wakers.notify_all();
        });
        Ok((sink, generation))
    }

    /// Unsubscribe `channel` if nobody in this process waits for it. Under
    /// the `io` lock, so that a subscription that follows goes out after.
    async fn unsubscribe_if_unused(&self, channel: &str) {
        let open = {
            let mut state = self.state();
            if self.wakers.has(channel) || !state.subscribed.remove(channel) {
                return;
            }
            state.sink.clone().map(|sink| (sink, state.generation))
        };
        let Some((mut sink, generation)) = open else {
            return;
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, sink.unsubscribe(channel)).await {
            Ok(Ok(())) => {}
            _ => {
                let mut state = self.state();
                if state.generation == generation {
                    state.close();
                }
            }
        }
    }
}
