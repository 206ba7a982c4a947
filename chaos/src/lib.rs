//! The chaos suite: the articles' failure stories run for real against real
//! processes (workers, gateway, Redis, ZooKeeper, PostgreSQL, MariaDB), with a
//! table of what happened.
//!
//! `cargo run -p chaos -- [--scenario X] [--backend Y] [--fencing on|off]
//! [--seed N] [--soak] [--json out.json]` prints the table and the seed; the
//! tests in `chaos/tests/it/` call the same [`run`] and assert on its rows.
//! The faults themselves are the harness's catalogue ([`harness::faults`]);
//! the worker and gateway processes are [`harness::procs`] (also [`procs`]
//! here).
//!
//! # Layout
//! - [`plan`]: which rows, the seed of each, and the runner.
//! - [`backends`]: the lock services each backend needs, and its worker flags.
//! - [`ctx`]: what a script works with, the helpers every script uses, and
//!   the row's evidence collected at the end.
//! - [`scenarios`]: the rows, and the scripts on one lock service, each
//!   waiting on events.
//! - [`replication`]: the replicated lock services' faults: ZooKeeper leader
//!   kill and partition, Sentinel failover, Redlock partition.
//! - [`failover`]: the rows on stacks of their own (PostgreSQL failover with
//!   an async or sync standby, a gateway killed behind HAProxy).
//! - [`history`]: a page's complete history from the database, and stale-write
//!   arithmetic across a failover.
//! - [`soak`]: `--soak --minutes N`: every fenced backend at once under random
//!   faults, and the checker over the complete history.
//! - [`report`]: the row, how each number is computed from the evidence, the table.
//! - [`verdicts`]: what the rows must show.

pub mod backends;
pub mod ctx;
pub mod failover;
pub mod history;
pub mod plan;
pub mod replication;
pub mod report;
pub mod scenarios;
pub mod soak;
pub mod verdicts;

/// The worker and gateway processes (the harness's).
pub use harness::procs;

pub use backends::{Backend, Services};
pub use ctx::Timing;
pub use plan::{row_seed, run, Plan};
pub use report::Row;
pub use scenarios::Scenario;
pub use verdicts::violations;
