//! The fair queue, as one service sees it: the memory of the locks
//! contended lately, which picks between the light statements and those
//! that look at the queue (see "The uncontended path" in the module docs).
//! A waiter's place is `wake::QueuePlace`, shared with Redis.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::KNOWN_ROWS;

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
