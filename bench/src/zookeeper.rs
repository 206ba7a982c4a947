//! `cargo run --release -p bench -- zookeeper`: acquire+release per second and
//! latency of the fair ZooKeeper lock, uncontended (one task) and with
//! `--contenders` tasks on one lock, beside, in the same run and against the
//! same standalone ZooKeeper:
//!
//! - the limit: the same three requests issued raw with the same client, no
//!   recipe (create EPHEMERAL_SEQUENTIAL, getChildren of the parent, delete),
//!   one after the other from one task. A lock serialises its holders, so this
//!   one-at-a-time sequence is also the ceiling of the contended rows;
//! - the peer: Python's `kazoo` `Lock` (the recipe most ZooKeeper users in
//!   Python take), installed into a venv under `target/`.
//!
//! Contenders are separate clients, as separate processes would be: each of
//! our tasks has its own `ZooKeeperLock` (own session), each kazoo thread its
//! own `KazooClient`. (Sharing one session would queue every contender's reads
//! behind the others' writes: ZooKeeper answers one session in order.)

use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use fencelock::zookeeper::ZooKeeperLock;
use fencelock::AcquireOptions;
use harness::ZooKeeper;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::locks;
use crate::peers;
use crate::stats::{median, ms, spread, Run};

const SESSION: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Seconds per measured run.
    #[arg(long, default_value_t = 2)]
    seconds: u64,
    /// Rounds; each measures every row once (figures are medians).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Tasks (threads for kazoo) contending for one lock.
    #[arg(long, default_value_t = 16)]
    contenders: usize,
    /// A Python interpreter that has `kazoo` installed; by default a venv is
    /// created under `target/kazoo-venv` with `kazoo==2.11.0`.
    #[arg(long)]
    python: Option<PathBuf>,
}

struct Row {
    system: &'static str,
    mode: String,
    runs: Vec<Run>,
}

impl Row {
    fn new(system: &'static str, mode: String) -> Self {
        Row {
            system,
            mode,
            runs: vec![],
        }
    }

    fn rates(&self) -> Vec<f64> {
        self.runs.iter().map(Run::per_sec).collect()
    }

    fn rate(&self) -> f64 {
        median(&self.rates())
    }

    fn p(&self, q: f64) -> Duration {
        let v: Vec<f64> = self
            .runs
            .iter()
            .map(|r| r.quantile(q).as_secs_f64())
            .collect();
        Duration::from_secs_f64(median(&v))
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let secs = Duration::from_secs(args.seconds);
    let n = args.contenders;
    let python = peers::python(&args.python, "kazoo-venv", "kazoo", &[peers::KAZOO]).await;
    eprintln!("starting ZooKeeper ...");
    let server = ZooKeeper::start().await;
    let cs = server.connect_string();
    let mut locks = Vec::new();
    for _ in 0..n.max(1) {
        locks.push(ZooKeeperLock::connect(&cs, SESSION).await?);
    }
    let raw_client = zk::Client::connector()
        .with_session_timeout(SESSION)
        .connect(&cs)
        .await
        .map_err(|e| anyhow!("zookeeper connect: {e}"))?;

    let mut rows = vec![
        Row::new("ZooKeeperLock (fair)", "uncontended".into()),
        Row::new("ZooKeeperLock (fair)", format!("{n} contenders")),
        Row::new("kazoo Lock", "uncontended".into()),
        Row::new("kazoo Lock", format!("{n} contenders")),
        Row::new("raw create+getChildren+delete", "limit".into()),
    ];
    for round in 0..args.runs {
        eprintln!("run {}/{} ...", round + 1, args.runs);
        // The limit right before our uncontended row: the pair is seconds apart.
        rows[4]
            .runs
            .push(raw(&raw_client, secs, &format!("r{round}")).await?);
        rows[0]
            .runs
            .push(ours(&locks[..1], secs, &format!("u{round}")).await?);
        rows[1]
            .runs
            .push(ours(&locks, secs, &format!("c{round}")).await?);
        if let Ok(py) = &python {
            rows[2]
                .runs
                .push(peers::kazoo_lock(py, &cs, 1, secs, &format!("u{round}")).await?);
            rows[3]
                .runs
                .push(peers::kazoo_lock(py, &cs, n, secs, &format!("c{round}")).await?);
        }
    }
    print_table(&rows, &args);
    if let Err(e) = python {
        println!("\nkazoo not measured: {e:#}");
    }
    Ok(())
}

/// One task per session in `locks` acquire+release one lock for `secs`.
async fn ours(locks: &[ZooKeeperLock], secs: Duration, name: &str) -> anyhow::Result<Run> {
    let start = Instant::now();
    let end = start + secs;
    let mut joins = Vec::new();
    for lock in locks {
        let lock = lock.clone();
        let name = format!("bench-{name}");
        joins.push(tokio::spawn(async move {
            let opts = AcquireOptions::new(SESSION).wait(Duration::from_secs(30));
            locks::acquire_release_until(&lock, &name, opts, end).await
        }));
    }
    Run::joined(start, joins).await
}

/// The limit: create EPHEMERAL_SEQUENTIAL, getChildren, delete, one at a time.
async fn raw(client: &zk::Client, secs: Duration, name: &str) -> anyhow::Result<Run> {
    let parent = format!("/raw-bench/{name}");
    client
        .mkdir(
            &parent,
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .map_err(|e| anyhow!("mkdir {parent}: {e}"))?;
    let prefix = format!("{parent}/n-");
    let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    Run::timed(secs, || raw_once(client, &parent, &prefix, &mode, "")).await
}

/// One raw round of the lock recipe's requests: create `prefix`N with `mode`,
/// getChildren of `parent`, delete `prefix`N. `what` starts each error text.
pub(crate) async fn raw_once(
    client: &zk::Client,
    parent: &str,
    prefix: &str,
    mode: &zk::CreateOptions<'_>,
    what: &str,
) -> anyhow::Result<()> {
    let (_, seq) = client
        .create(prefix, b"", mode)
        .await
        .map_err(|e| anyhow!("{what}create: {e}"))?;
    client
        .list_children(parent)
        .await
        .map_err(|e| anyhow!("{what}getChildren: {e}"))?;
    client
        .delete(&format!("{prefix}{seq}"), None)
        .await
        .map_err(|e| anyhow!("{what}delete: {e}"))?;
    Ok(())
}

/// Median over rounds of `row`'s rate divided by `base`'s rate in the same
/// round: pairing runs that ran seconds apart cancels most of the drift of a
/// shared machine.
fn paired_ratio(row: &Row, base: &Row) -> Option<f64> {
    if base.runs.len() != row.runs.len() || row.runs.is_empty() {
        return None;
    }
    let ratios: Vec<f64> = row
        .runs
        .iter()
        .zip(&base.runs)
        .map(|(a, b)| a.per_sec() / b.per_sec())
        .collect();
    Some(median(&ratios))
}

fn print_table(rows: &[Row], args: &Args) {
    let raw = &rows[4];
    let kazoo_for = |mode: &str| {
        rows.iter()
            .find(|r| r.system == "kazoo Lock" && r.mode == mode && !r.runs.is_empty())
    };
    println!(
        "\n{} rounds of {} s per row; figures are medians over rounds; spread is \
         min..max; ratios are medians of per-round ratios.\n",
        args.runs, args.seconds
    );
    println!(
        "| system | mode | acquire+release/s | spread | p50 ms | p99 ms | × raw limit | × kazoo |"
    );
    println!("|---|---|---:|---|---:|---:|---:|---:|");
    for row in rows.iter().filter(|r| !r.runs.is_empty()) {
        let (lo, hi) = spread(&row.rates());
        let fmt = |r: Option<f64>| r.map(|r| format!("{r:.2}")).unwrap_or_default();
        let vs_kazoo = match (row.system, kazoo_for(&row.mode)) {
            ("ZooKeeperLock (fair)", Some(k)) => fmt(paired_ratio(row, k)),
            _ => String::new(),
        };
        println!(
            "| {} | {} | {:.0} | {:.0}..{:.0} | {} | {} | {} | {} |",
            row.system,
            row.mode,
            row.rate(),
            lo,
            hi,
            ms(row.p(0.50)),
            ms(row.p(0.99)),
            fmt(paired_ratio(row, raw)),
            vs_kazoo
        );
    }
}
