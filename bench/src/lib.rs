//! The benchmarks (`cargo run --release -p bench -- <what>`): each
//! subcommand starts its own real services, measures the project's code and
//! the limit (or peer) in the same run, and prints a Markdown table for
//! `docs/BENCHMARKS.md`.
//!
//! # Layout
//! - `gateway.rs`: fenced PUTs through the gateway beside pgbench running the
//!   minimal same-work statement and the gateway's own.
//! - `trust.rs`: fenced PUTs with real grants, without and with keys and
//!   issuer checks.
//! - `scale.rs`: PUT/s with one and two gateway processes on one PostgreSQL,
//!   direct and behind HAProxy, beside pgbench, with the CPU of each part.
//! - `locks.rs`: Redis and lease-table backends beside redis-benchmark,
//!   pgbench and Python's redis Lock.
//! - `zookeeper.rs`: the ZooKeeper lock beside kazoo and raw create/delete.
//! - `redlock.rs`: Redlock N=3/5 beside the single instance and rslock.
//! - `abuse.rs`: keyed writers through one gateway under floods of streams,
//!   slowloris connections, anonymous reads and connection churn, beside the
//!   same floods sent to a sink.
//! - `compare.rs`: every backend side by side (speed, limits, peers, chaos)
//!   into docs/COMPARISON.md.
//!
//! Shared by them:
//! - `http.rs`: the HTTP load generator of the gateway benchmarks.
//! - `pgbench.rs`: pgbench running the gateway's statement.
//! - `tools.rs`: redis-benchmark, pgbench and mariadb-slap on the locks.
//! - `peers.rs`: the Python peers (redis Lock, kazoo Lock).
//! - `stats.rs`: runs, quantiles, medians. `cpu.rs`: CPU time of processes.
//! - `machine.rs`: the machine, its load, the time. `sections.rs`: the
//!   sections of `docs/BENCHMARKS.md`.

mod abuse;
mod compare;
mod cpu;
mod gateway;
mod http;
mod locks;
mod machine;
mod peers;
mod pgbench;
mod redlock;
mod scale;
mod sections;
mod stats;
mod tools;
mod trust;
mod zookeeper;

use clap::{Parser, Subcommand};

/// The command line.
#[derive(Parser)]
#[command(about = "Benchmarks, each beside the limit measured in the same run")]
pub struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Redis and lease-table locks beside redis-benchmark, pgbench, mariadb-slap and Python's redis Lock.
    Locks(locks::Args),
    /// Fenced PUTs through the gateway beside pgbench running the minimal same-work statement and the gateway's own.
    Gateway(gateway::Args),
    /// What the issuer check costs: fenced PUTs with real grants per backend,
    /// without keys, with keys, with keys and the issuer check.
    Trust(trust::Args),
    /// Redlock N=3/5 beside the single-instance lock, rslock and bare round trips.
    Redlock(redlock::Args),
    /// The fair ZooKeeper lock beside kazoo's Lock and raw create/getChildren/delete.
    Zookeeper(zookeeper::Args),
    /// PUT/s with 1 and 2 gateway processes on one PostgreSQL, direct and behind HAProxy (docs/SCALING.md).
    Scale(scale::Args),
    /// Every backend side by side: speed, limits, peers and chaos, into COMPARISON.md and an SVG.
    Compare(compare::Args),
    /// Keyed writers through one gateway under floods (streams, slowloris, reads, churn), beside the same floods sent to a sink.
    Abuse(abuse::Args),
}

/// Run the benchmark the command line names, on a runtime of its own.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    match cli.what {
        What::Locks(args) => runtime.block_on(locks::run(args)),
        What::Gateway(args) => runtime.block_on(gateway::run(args)),
        What::Trust(args) => runtime.block_on(trust::run(args)),
        What::Redlock(args) => runtime.block_on(redlock::run(args)),
        What::Zookeeper(args) => runtime.block_on(zookeeper::run(args)),
        What::Compare(args) => runtime.block_on(compare::run(args)),
        What::Scale(args) => runtime.block_on(scale::run(args)),
        What::Abuse(args) => runtime.block_on(abuse::run(args)),
    }
}
