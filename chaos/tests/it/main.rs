//! The chaos suite's tests, in one binary: the rows' assertions
//! ([`rows`]) and the two-minute soak ([`soak`]). They run one at a time
//! (two cores, and timing matters), under [`SERIAL`].
//!
//! Needs the worker and gateway binaries (`cargo build --workspace --bins`),
//! and root: the ZooKeeper ensemble runs in network namespaces.
//! `CHAOS_SEED` replays a run.

use tokio::sync::Mutex;

mod rows;
mod soak;

/// Held by every test for its whole run.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// `CHAOS_SEED`, else a random seed (printed by each test).
fn seed() -> u64 {
    std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}
