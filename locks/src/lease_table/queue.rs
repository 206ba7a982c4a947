//! The fair queue, as one service sees it: a waiter's place (given up when
//! its acquire fails or is dropped), and the memory of the locks contended
//! lately, which picks between the light statements and those that look at
//! the queue (see "The uncontended path" in the module docs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{LeaseTable, KNOWN_ROWS};

/// A lock whose try was refused this recently counts as contended: its
/// acquires start with the statement that queues. Otherwise they start with
/// the light grant. Mistaking a contended lock for a quiet one costs one
/// light statement more per refused acquire; the other way round, a heavier
/// first try (0.85× instead of 0.97× of the pre-fairness pair under
/// pgbench; on MariaDB 0.8× of the grant alone): a burst of contention is
/// remembered for a while.
const CONTENDED_FOR: Duration = Duration::from_secs(5);

/// Lock names refused lately, and when (at most [`KNOWN_ROWS`]).
#[derive(Default)]
pub(super) struct Contended(Mutex<HashMap<String, Instant>>);

impl Contended {
    /// Whether a try of lock `name` was refused within [`CONTENDED_FOR`].
    pub(super) fn is_contended(&self, name: &str) -> bool {
        self.0
            .lock()
            .expect("contended")
            .get(name)
            .is_some_and(|at| at.elapsed() < CONTENDED_FOR)
    }

    /// A try of lock `name` was refused just now.
    pub(super) fn contend(&self, name: &str) {
        let mut contended = self.0.lock().expect("contended");
        if contended.len() >= KNOWN_ROWS && !contended.contains_key(name) {
            contended.retain(|_, at| at.elapsed() < CONTENDED_FOR);
            if contended.len() >= KNOWN_ROWS {
                contended.clear();
            }
        }
        contended.insert(name.to_string(), Instant::now());
    }
}

/// A fair waiter's place; dropped without being granted, it is given up in
/// the background (best effort: otherwise it lapses).
pub(super) struct QueuePlace {
    table: Option<LeaseTable>,
    name: String,
    waiter: Arc<str>,
}

impl QueuePlace {
    /// The place an acquire of `name` by `waiter` may take: none unless the
    /// service is fair and the acquire may wait (`queue`).
    pub(super) fn new(table: &LeaseTable, name: &str, waiter: &Arc<str>, queue: bool) -> Self {
        QueuePlace {
            table: (table.fair && queue).then(|| table.clone()),
            name: name.to_string(),
            waiter: waiter.clone(),
        }
    }

    /// The dialect gave the place up itself.
    pub(super) fn given_up(&mut self) {
        self.table = None;
    }

    /// The acquire is over. Granted, the place was served; otherwise it
    /// gave up (or failed) and leaves the queue now, not in the background,
    /// so that a process that exits right after still leaves no place for
    /// others to wait behind.
    pub(super) async fn settle(mut self, granted: bool) {
        let Some(table) = self.table.take() else {
            return;
        };
        if !granted {
            table.leave(&self.name, &self.waiter).await;
        }
    }
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        if let (Some(table), Ok(rt)) = (self.table.take(), tokio::runtime::Handle::try_current()) {
            let (name, waiter) = (std::mem::take(&mut self.name), self.waiter.clone());
            rt.spawn(async move { table.leave(&name, &waiter).await });
        }
    }
}
