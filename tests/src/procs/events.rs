//! The workers' JSONL events, with the runner's receive time, in one log that
//! scripts wait on.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::bail;
use serde_json::Value;
use tokio::sync::Notify;

/// Unix time in ms, the unit of the worker's `ts`.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One JSONL event of a worker, with the runner's own receive time.
#[derive(Debug, Clone)]
pub struct Event {
    pub client: String,
    pub json: Value,
    /// Unix ms when the runner read the line.
    pub received_ms: i64,
}

impl Event {
    pub fn kind(&self) -> &str {
        self.json.get("event").and_then(Value::as_str).unwrap_or("")
    }

    pub fn u64(&self, field: &str) -> Option<u64> {
        self.json.get(field).and_then(Value::as_u64)
    }

    pub fn str(&self, field: &str) -> Option<&str> {
        self.json.get(field).and_then(Value::as_str)
    }

    /// Whether `client` sent it and it is a `kind` event.
    pub fn is(&self, client: &str, kind: &str) -> bool {
        self.client == client && self.kind() == kind
    }

    /// The event's time: the worker's `ts`, unless the worker's clock is off by
    /// more than a minute (a worker under libfaketime), then the receive time.
    pub fn ts(&self) -> i64 {
        match self.json.get("ts").and_then(Value::as_i64) {
            Some(ts) if (ts - self.received_ms).abs() < 60_000 => ts,
            _ => self.received_ms,
        }
    }
}

/// Every event of a set of workers (one scenario's, one page's, one
/// worker's), in arrival order.
#[derive(Clone, Default)]
pub struct EventLog {
    inner: Arc<(Mutex<Vec<Event>>, Notify)>,
}

impl EventLog {
    pub fn push(&self, e: Event) {
        self.inner.0.lock().expect("event log").push(e);
        self.wake();
    }

    /// Wake every waiter, to look again (a worker's stdout closed, say).
    pub fn wake(&self) {
        self.inner.1.notify_waiters();
    }

    pub fn all(&self) -> Vec<Event> {
        self.inner.0.lock().expect("event log").clone()
    }

    /// Wait until `look` finds something in the log (it may already be there).
    pub async fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut look: impl FnMut(&[Event]) -> Option<T>,
    ) -> anyhow::Result<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(found) = look(&self.inner.0.lock().expect("event log")) {
                return Ok(found);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                bail!("timed out after {timeout:?} waiting for {what}");
            }
        }
    }

    /// Wait until an event matching `pred` is in the log (it may already be).
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Event) -> bool,
    ) -> anyhow::Result<Event> {
        self.wait_until(what, timeout, |events| {
            events.iter().find(|e| pred(e)).cloned()
        })
        .await
    }

    /// Wait for a `kind` event of `client`.
    pub async fn wait_event(
        &self,
        client: &str,
        kind: &str,
        timeout: Duration,
    ) -> anyhow::Result<Event> {
        self.wait_for(&format!("`{kind}` from {client}"), timeout, |e| {
            e.is(client, kind)
        })
        .await
    }

    /// Wait until a client other than `client` wrote after `since` (unix ms).
    pub async fn wait_other_wrote(
        &self,
        client: &str,
        since: i64,
        timeout: Duration,
    ) -> anyhow::Result<Event> {
        self.wait_for("another holder's `wrote`", timeout, |e| {
            e.client != client && e.kind() == "wrote" && e.received_ms >= since
        })
        .await
    }
}
