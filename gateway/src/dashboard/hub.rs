//! The gateway's one tail of `page_history`, shared by every stream.
//!
//! One task polls the table and keeps every page's counters; each poll that
//! finds attempts becomes one [`Batch`], broadcast to every stream, which
//! picks out its page. So the database work does not grow with the number
//! of open dashboards: one poll every [`POLL_INTERVAL`], and one read of the
//! followed pages' rows per batch. A stream's start reads only its page's
//! newest attempts and row (a bounded window on an index); the counters come
//! from the tail's memory.
//!
//! The task runs only while a stream is subscribed; it stops when the last
//! one goes, keeping its position and counters, and the next stream starts
//! it again. A stream starts after a poll that began after it connected and
//! caught up, so its start is as fresh as a read of the table at connect.
//! The whole history is counted once per gateway, when the first dashboard
//! connects.
//!
//! # Exactly once
//! A stream subscribes to the broadcast and copies the tail's position and
//! counters under the same lock under which the task absorbs a poll and
//! sends its batch. So the stream's start reflects exactly the batches sent
//! before it subscribed, and it receives exactly the ones after. Its page's
//! attempts are read up to that position, without its gaps, as the counters
//! were. A stream that falls more than [`BACKLOG`] batches behind has lost
//! some: it is sent `resync` and starts again from a fresh start.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::{broadcast, watch, Notify};

use crate::db::{Db, DbError};

use super::query::{count_all, page_attempts, pages_now, poll_rows, PageNow, TAIL_BATCH};
use super::tail::{Attempt, PageCounters, Tail};

/// How often the tail asks the database for new attempts.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Batches a stream may fall behind before it must start again.
pub const BACKLOG: usize = 64;

/// Encoded `update` events by (followed page, body sent).
pub(super) type Encoded = HashMap<(Option<String>, bool), Arc<str>>;

/// What one poll brought, for every stream.
#[derive(Debug)]
pub struct Batch {
    /// The `update` events made from it, by the page a stream follows and
    /// whether the body goes with it: most streams follow the same page,
    /// and encode the same event once between them.
    pub(super) encoded: Mutex<Encoded>,
    pub now: DateTime<Utc>,
    /// The counters of the pages that had attempts, complete.
    pub pages: Vec<PageCounters>,
    /// The new attempts of every page, oldest first.
    pub attempts: Vec<Attempt>,
    /// The rows, with bodies, of the pages that had attempts and that a
    /// stream follows.
    pub rows: Vec<PageNow>,
}

/// A message of the broadcast.
#[derive(Debug, Clone)]
pub enum Message {
    Batch(Arc<Batch>),
    /// The database failed a poll: streams end, browsers reconnect.
    Problem,
}

/// How far the task has come, for streams waiting to start.
#[derive(Debug, Clone, Default, PartialEq)]
struct Progress {
    /// The number of the last poll after which the tail was caught up (its
    /// batch not full).
    caught_up: u64,
    /// Why the last count or poll failed, until a poll catches up again.
    failed: Option<String>,
}

/// The tail, its subscribers and the pages they follow.
pub struct Hub {
    db: Db,
    inner: Mutex<Inner>,
    sender: broadcast::Sender<Message>,
    progress: watch::Sender<Progress>,
    /// Polls begun, numbered from 1.
    started: AtomicU64,
    /// Wakes the task for a poll at once: a stream is starting.
    wake: Notify,
}

struct Inner {
    /// `None` until the first count.
    tail: Option<Tail>,
    /// Pages chosen by streams, with how many follow each.
    followed: HashMap<String, usize>,
    /// Whether the task runs; changed only under this lock, with the
    /// subscribers counted under it too, so a stream that subscribes while
    /// the task decides to stop always finds it stopped and starts it.
    running: bool,
}

/// A stream's start: what the tail had absorbed when it subscribed.
pub struct Start {
    pub receiver: broadcast::Receiver<Message>,
    pub pages: Vec<PageCounters>,
    pub high: i64,
    pub gaps: Vec<i64>,
}

/// A stream's claim on a page's rows; released on drop.
pub struct Follow {
    hub: Arc<Hub>,
    page: String,
}

impl Drop for Follow {
    fn drop(&mut self) {
        let mut inner = self.hub.lock();
        if let Some(n) = inner.followed.get_mut(&self.page) {
            *n -= 1;
            if *n == 0 {
                inner.followed.remove(&self.page);
            }
        }
    }
}

impl Hub {
    pub fn new(db: Db) -> Arc<Self> {
        Arc::new(Self {
            db,
            inner: Mutex::new(Inner {
                tail: None,
                followed: HashMap::new(),
                running: false,
            }),
            sender: broadcast::channel(BACKLOG).0,
            progress: watch::channel(Progress::default()).0,
            started: AtomicU64::new(0),
            wake: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Subscribe, starting the task if it is stopped, and wait for a poll
    /// begun after this call that caught up: the start is as fresh as a read
    /// of the table made now. Then the tail's position and counters.
    pub async fn subscribe(self: &Arc<Self>) -> Result<Start, DbError> {
        let mut progress = self.progress.subscribe();
        // Subscribed while waiting too: the task stops when nobody is.
        let waiting = self.sender.subscribe();
        {
            let mut inner = self.lock();
            if !inner.running {
                inner.running = true;
                self.progress.send_modify(|p| p.failed = None);
                tokio::spawn(self.clone().run());
            }
        }
        let after = self.started.load(Ordering::SeqCst);
        self.wake.notify_one();
        let ready = progress
            .wait_for(|p| p.failed.is_some() || p.caught_up > after)
            .await
            .map(|p| p.failed.clone());
        match ready {
            Ok(None) => {}
            Ok(Some(e)) => return Err(DbError::Unavailable(e)),
            Err(_) => return Err(DbError::Unavailable("the dashboard's tail stopped".into())),
        }
        let inner = self.lock();
        let tail = inner
            .tail
            .as_ref()
            .ok_or_else(|| DbError::Unavailable("the dashboard's tail stopped".into()))?;
        let mut pages: Vec<PageCounters> = tail.counters.values().cloned().collect();
        pages.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Start {
            // Only the batches sent from now on; `waiting` kept the task
            // running until this one exists.
            receiver: waiting.resubscribe(),
            pages,
            high: tail.high,
            gaps: tail.gaps(),
        })
    }

    /// Have the batches carry `page`'s row while the result lives.
    pub fn follow(self: &Arc<Self>, page: &str) -> Follow {
        *self.lock().followed.entry(page.to_owned()).or_default() += 1;
        Follow {
            hub: self.clone(),
            page: page.to_owned(),
        }
    }

    /// `page`'s newest attempts up to a start's position.
    pub async fn attempts(&self, page: &str, start: &Start) -> Result<Vec<Attempt>, DbError> {
        page_attempts(&self.db, page, start.high, &start.gaps).await
    }

    /// `page`'s row as it is now, body included.
    pub async fn row(&self, page: &str) -> Result<Option<PageNow>, DbError> {
        Ok(pages_now(&self.db, &[page.to_owned()]).await?.pop())
    }

    /// The task: count, then poll while anybody is subscribed.
    async fn run(self: Arc<Self>) {
        if self.lock().tail.is_none() {
            match count_all(&self.db).await {
                Ok(tail) => self.lock().tail = Some(tail),
                Err(e) => {
                    tracing::warn!(error = %e, "the dashboard's tail could not count the history");
                    let mut inner = self.lock();
                    inner.running = false;
                    self.progress
                        .send_modify(|p| p.failed = Some(e.to_string()));
                    return;
                }
            }
        }
        let mut full = true; // catch up at once
        loop {
            if !full {
                tokio::select! {
                    _ = tokio::time::sleep(POLL_INTERVAL) => {}
                    _ = self.wake.notified() => {}
                }
            }
            {
                let mut inner = self.lock();
                if self.sender.receiver_count() == 0 {
                    inner.running = false;
                    return;
                }
            }
            let number = self.started.fetch_add(1, Ordering::SeqCst) + 1;
            match self.poll().await {
                Ok(more) => full = more,
                Err(e) => {
                    tracing::warn!(error = %e, "the dashboard's tail failed a poll");
                    let _ = self.sender.send(Message::Problem);
                    // Streams waiting to start are told too.
                    self.progress
                        .send_modify(|p| p.failed = Some(e.to_string()));
                    full = false;
                    continue;
                }
            }
            if !full {
                self.progress.send_modify(|p| {
                    p.caught_up = number;
                    p.failed = None;
                });
            }
        }
    }

    /// One poll: absorb its rows and send them as one batch. `true` when the
    /// batch was full (poll again at once).
    async fn poll(&self) -> Result<bool, DbError> {
        let (high, gaps) = {
            let inner = self.lock();
            let tail = inner.tail.as_ref().expect("counted before polling");
            (tail.high, tail.gaps())
        };
        let rows = poll_rows(&self.db, high, &gaps).await?;
        let full = rows.iter().filter(|r| r.seq > high).count() as i64 >= TAIL_BATCH;
        // The rows of the followed pages with attempts, read after those
        // attempts committed, so at least as new as them.
        let wanted: Vec<String> = {
            let inner = self.lock();
            let mut wanted: Vec<String> = rows
                .iter()
                .filter(|r| inner.followed.contains_key(&r.page_id))
                .map(|r| r.page_id.clone())
                .collect();
            wanted.sort();
            wanted.dedup();
            wanted
        };
        let rows_now = pages_now(&self.db, &wanted).await?;
        let mut inner = self.lock();
        let tail = inner.tail.as_mut().expect("counted before polling");
        let absorbed = tail.absorb(rows, Instant::now());
        if absorbed.pages.is_empty() {
            return Ok(full);
        }
        let pages = absorbed
            .pages
            .iter()
            .filter_map(|id| tail.counters(id).cloned())
            .collect();
        let batch = Batch {
            encoded: Mutex::default(),
            now: Utc::now(),
            pages,
            attempts: absorbed.attempts,
            rows: rows_now,
        };
        // Sent under the lock: see "Exactly once".
        let _ = self.sender.send(Message::Batch(Arc::new(batch)));
        drop(inner);
        Ok(full)
    }
}
