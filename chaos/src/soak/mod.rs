//! The soak: every fenced backend at once, each on pages of its
//! own, all through two gateways behind HAProxy on PostgreSQL with a
//! synchronous standby, while faults drawn from the whole catalogue hit the
//! stack one after another; then a checker reads the complete history.
//!
//! `cargo run -p chaos -- --soak --minutes 30 [--seed N] [--backend B]...`
//!
//! # The stack
//! - PostgreSQL primary + synchronous standby ([`harness::PostgresPair`]);
//!   two gateway processes on its multi-host URL; HAProxy in front of them,
//!   health-checked on `/readyz`. Workers talk to the balancer only.
//! - Per backend, its own lock server(s) ([`Services::start_owned`]): Redis
//!   with `appendfsync always` (a Redis that forgets its counter is the
//!   separate, deliberately stuck row `redis-restart`; here restarts keep
//!   it), ZooKeeper (the three-node ensemble in network namespaces,
//!   [`harness::ZooKeeperHosts`], or one server with
//!   `--zookeeper-standalone`), a PostgreSQL for the lease table, a MariaDB
//!   for the other lease table.
//! - Per page, [`SoakConfig::workers_per_page`] workers editing until the end;
//!   on the ensemble, each ZooKeeper page's first worker talks to one server
//!   only (pinned), so that `zookeeper-partition` cuts a worker off with the
//!   minority.
//!
//! # The faults
//! First each kind once, in an order drawn from the seed (so a two-minute
//! run covers the catalogue), then kinds drawn at random, with a random gap:
//! see [`Fault`]. Each fault, from the harness's catalogue
//! ([`harness::faults`]), is healed before the next one starts.
//!
//! # The checker
//! Per page, over `page_history` read from the final primary and every
//! worker's events: accepted tokens never decrease in commit order; every
//! acknowledged edit has its accepted PUT in the history; every acknowledged
//! line is in the final body exactly once; the final body is the last
//! accepted write (its version, and its line last); the fence is the highest
//! accepted token. Any worker that does not finish is a violation too.
//!
//! # Layout
//! - [`config`]: what to run, and the kinds of fault.
//! - [`stack`]: the stack, its pages and their workers.
//! - [`faults`]: the fault loop, each kind drawn from the catalogue.
//! - [`check`]: the checker over one page's complete history.
//! - [`report`]: what the soak measured, and its tables.

pub mod check;
pub mod config;
pub mod faults;
pub mod report;
pub mod stack;

use std::time::Instant;

pub use check::check_page;
pub use config::{Fault, SoakConfig};
pub use report::{FaultRecord, PageReport, SoakReport};

#[cfg(doc)]
use crate::backends::Services;

/// Run the soak and check it.
pub async fn run(config: SoakConfig) -> anyhow::Result<SoakReport> {
    let started_wall = Instant::now();
    let mut soak = stack::Soak::start(config).await?;
    soak.inject_faults().await;
    let stuck = soak.drain().await;
    let mut report = soak.check().await?;
    report.violations.extend(stuck);
    report.wall_s = started_wall.elapsed().as_secs_f64();
    Ok(report)
}
