//! `cargo run --release -p bench -- locks`: acquire+release per second and
//! latency of the Redis and lease-table backends, uncontended (one client, one
//! lock) and with `--contenders` tasks on one lock (each waits for it), side
//! by side in one run with:
//!
//! - the limit for Redis: `redis-benchmark` running the same grant and release
//!   scripts (`EVALSHA` of [`GRANT_SCRIPT`] and [`RELEASE_SCRIPT`]) from one
//!   client; the pair's rate is `1 / (1/grant + 1/release)`, its latency the
//!   sum of the two;
//! - the limit for PostgreSQL: `pgbench -M prepared` running the same calls
//!   of the lease functions (`postgres::Statements::acquire_fair_light` then
//!   `release_light`: an uncontended acquire and release) against the same
//!   database;
//! - the limit for MariaDB: `mariadb-slap` running the same calls
//!   (`mysql::Statements::acquire_fair_light` then `release`: an uncontended fair
//!   acquire and release; it reports no latencies);
//! - the peer: the Python `redis` package's `Lock` (its defaults: 0.1 s sleep
//!   between tries when waiting), installed into a venv under `target/`.
//!
//! A lock serialises its holders, so with contenders the ceiling is still one
//! grant+release at a time: the contended rows are compared with the same
//! single-client limit.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fencelock::lease_table::LeaseTable;
use fencelock::redis::RedisLock;
use fencelock::{AcquireOptions, LockService};
use harness::{MariaDb, Postgres, Redis};
use tokio::time::Instant;

use crate::stats::{median, ms, spread, Run};
use crate::{peers, tools};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Seconds per measured run.
    #[arg(long, default_value_t = 2)]
    seconds: u64,
    /// Runs per row (figures are medians).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Tasks (threads for Python) contending for one lock.
    #[arg(long, default_value_t = 16)]
    contenders: usize,
    /// A Python interpreter that has `redis` installed; by default a venv is
    /// created under `target/lockbench-venv` and `redis==8.1.0` installed.
    #[arg(long)]
    python: Option<PathBuf>,
    /// Measure only the Redis backend against its limit (a quick check).
    #[arg(long)]
    redis_only: bool,
    /// Also measure the Redis backend uncontended on a single-threaded tokio
    /// runtime (its own thread and connection), to separate the cost of
    /// cross-thread wake-ups from the backend's own work.
    #[arg(long)]
    current_thread: bool,
}

/// One row of the table: repeated runs of one system in one mode.
struct Row {
    system: String,
    mode: &'static str,
    runs: Vec<Run>,
    /// Rates only (tools that report no latencies).
    rates: Vec<f64>,
    limit: Option<&'static str>,
}

impl Row {
    fn new(system: &str, mode: &'static str, limit: Option<&'static str>) -> Self {
        Row {
            system: system.into(),
            mode,
            runs: vec![],
            rates: vec![],
            limit,
        }
    }

    fn push(&mut self, run: Run) {
        self.rates.push(run.per_sec());
        self.runs.push(run);
    }

    fn rate(&self) -> f64 {
        median(&self.rates)
    }

    fn p(&self, q: f64) -> Option<Duration> {
        if self.runs.is_empty() {
            return None;
        }
        let v: Vec<f64> = self
            .runs
            .iter()
            .map(|r| r.quantile(q).as_secs_f64())
            .collect();
        Some(Duration::from_secs_f64(median(&v)))
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let secs = Duration::from_secs(args.seconds);
    let python = peers::python(&args.python, "lockbench-venv", "redis", &[peers::REDIS]).await;

    eprintln!("starting redis-server, PostgreSQL and MariaDB ...");
    let redis = Redis::start().await;
    let pg = Postgres::start().await;
    let pg_db = pg.create_database().await;
    let maria = MariaDb::start().await;
    let my_db = maria.create_database().await;

    let redis_lock = RedisLock::connect(&redis.url()).await?;
    let lease_pg = LeaseTable::postgres(&pg_db).await?;
    let lease_my = LeaseTable::mysql(&my_db).await?;
    // The lease-table limits run against rows that already exist.
    for svc in [&lease_pg as &dyn LockService, &lease_my] {
        svc.acquire("limit", Duration::from_secs(1), Duration::ZERO)
            .await?
            .release()
            .await?;
    }
    let services: Vec<(&str, Arc<dyn LockService>)> = vec![
        ("redis", Arc::new(redis_lock)),
        ("lease-postgres", Arc::new(lease_pg)),
        ("lease-mysql", Arc::new(lease_my)),
    ];

    let n = args.contenders;
    let mut rows: Vec<Row> = Vec::new();
    for (name, _) in &services {
        let limit = Some(match *name {
            "redis" => "redis-benchmark",
            "lease-postgres" => "pgbench",
            _ => "mariadb-slap",
        });
        rows.push(Row::new(name, "uncontended", limit));
        rows.push(Row::new(name, "contended", limit));
    }
    rows.push(Row::new("redis-benchmark", "limit", None));
    rows.push(Row::new("pgbench", "limit", None));
    rows.push(Row::new("mariadb-slap", "limit", None));
    rows.push(Row::new(
        "python redis Lock",
        "uncontended",
        Some("redis-benchmark"),
    ));
    rows.push(Row::new(
        "python redis Lock",
        "contended",
        Some("redis-benchmark"),
    ));
    rows.push(Row::new(
        "redis (current_thread runtime)",
        "uncontended",
        Some("redis-benchmark"),
    ));

    // Each system is measured right beside its limit within a run, and ratios
    // are taken per run (then the median), so that load from other processes
    // on this shared machine hits both sides of a ratio alike.
    let base = 2 * services.len();
    for round in 0..args.runs {
        eprintln!("run {}/{} ...", round + 1, args.runs);
        let (u, c) = (format!("u{round}"), format!("c{round}"));
        let redis_svc = services[0].1.clone();
        rows[0].push(ours(redis_svc.clone(), 1, secs, &u).await?);
        rows[base].push(redis_benchmark(redis.port(), secs).await?);
        rows[1].push(ours(redis_svc, n, secs, &c).await?);
        if args.current_thread {
            let (url, lock) = (redis.url(), format!("t{round}"));
            let run = tokio::task::spawn_blocking(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async {
                    let svc: Arc<dyn LockService> = Arc::new(RedisLock::connect(&url).await?);
                    ours(svc, 1, secs, &lock).await
                })
            })
            .await??;
            rows[base + 5].push(run);
        }
        if let Ok(py) = &python {
            rows[base + 3].push(peers::redis_lock(py, redis.port(), 1, secs).await?);
            rows[base + 4].push(peers::redis_lock(py, redis.port(), n, secs).await?);
        }
        if args.redis_only {
            continue;
        }
        let pg_svc = services[1].1.clone();
        rows[2].push(ours(pg_svc.clone(), 1, secs, &u).await?);
        rows[base + 1].push(tools::pgbench_lease(&pg_db, secs).await?);
        rows[3].push(ours(pg_svc, n, secs, &c).await?);
        let my_svc = services[2].1.clone();
        rows[4].push(ours(my_svc.clone(), 1, secs, &u).await?);
        let slap = tools::mariadb_slap_pairs(maria.port(), &my_db, secs).await?;
        rows[base + 2].rates.push(slap);
        rows[5].push(ours(my_svc, n, secs, &c).await?);
    }

    print_table(&rows, &args);
    if let Err(e) = python {
        println!("\nPython peer not measured: {e:#}");
    }
    Ok(())
}

/// `tasks` tasks acquire+release one lock for `secs`: operations completed and
/// the latency of each (acquire including any wait, plus release).
async fn ours(
    svc: Arc<dyn LockService>,
    tasks: usize,
    secs: Duration,
    lock: &str,
) -> anyhow::Result<Run> {
    let start = Instant::now();
    let end = start + secs;
    let mut joins = Vec::new();
    for _ in 0..tasks {
        let svc = svc.clone();
        let lock = format!("bench-{lock}");
        joins.push(tokio::spawn(async move {
            let opts = AcquireOptions::new(Duration::from_secs(10))
                .wait(Duration::from_secs(30))
                .auto_renew(false);
            acquire_release_until(&*svc, &lock, opts, end).await
        }));
    }
    Run::joined(start, joins).await
}

/// Acquire+release `lock` on `svc` back to back until `end`: the latency of
/// each pair (acquire including any wait, plus release).
pub(crate) async fn acquire_release_until<S: LockService + ?Sized>(
    svc: &S,
    lock: &str,
    opts: AcquireOptions,
    end: Instant,
) -> anyhow::Result<Vec<Duration>> {
    let mut lat = Vec::new();
    while Instant::now() < end {
        let t0 = Instant::now();
        let lease = svc.acquire_with(lock, opts).await?;
        lease.release().await?;
        lat.push(t0.elapsed());
    }
    Ok(lat)
}

/// [`tools::redis_benchmark_pair`] as a [`Run`]: one synthetic sample per
/// quantile, so that the table's p50/p99 give the pair's sums.
async fn redis_benchmark(port: u16, secs: Duration) -> anyhow::Result<Run> {
    let (pair_rate, p50, p99) = tools::redis_benchmark_pair(port, secs).await?;
    let mut latencies = vec![p50; 98];
    latencies.extend([p99, p99]);
    Ok(Run {
        ops: (pair_rate * 1000.0) as u64,
        elapsed: Duration::from_secs(1000),
        latencies,
    })
}

fn print_table(rows: &[Row], args: &Args) {
    // The median over runs of (this run's rate / the limit's rate in the same run).
    let ratio = |row: &Row, limit: &str| -> Option<f64> {
        let limit = rows.iter().find(|r| r.system == limit)?;
        let per_run: Vec<f64> = row
            .rates
            .iter()
            .zip(&limit.rates)
            .filter(|(_, l)| **l > 0.0)
            .map(|(r, l)| r / l)
            .collect();
        (!per_run.is_empty()).then(|| median(&per_run))
    };
    println!(
        "{} runs of {} s each, {} contenders; medians; spread = min..max of the runs' rates; \"vs limit\" = median of per-run ratios\n",
        args.runs, args.seconds, args.contenders
    );
    println!("| system | mode | acquire+release/s | spread | p50 ms | p99 ms | vs limit |");
    println!("|---|---|---:|---:|---:|---:|---|");
    for row in rows {
        if row.rates.is_empty() {
            continue;
        }
        let (lo, hi) = spread(&row.rates);
        let lat = |q| row.p(q).map(ms).unwrap_or_else(|| "n/a".into());
        let vs = match row.limit.and_then(|l| ratio(row, l).map(|r| (l, r))) {
            Some((limit, r)) => format!("{r:.2}× {limit}"),
            None => "(limit)".into(),
        };
        println!(
            "| {} | {} | {:.0} | {:.0}..{:.0} | {} | {} | {} |",
            row.system,
            row.mode,
            row.rate(),
            lo,
            hi,
            lat(0.50),
            lat(0.99),
            vs
        );
    }
}
