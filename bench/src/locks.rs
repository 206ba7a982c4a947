//! `cargo run --release -p bench -- locks`: acquire+release per second and
//! latency of the Redis and lease-table backends, uncontended (one client, one
//! lock) and with `--contenders` tasks on one lock (each waits for it), side
//! by side in one run with:
//!
//! - the limit for Redis: `redis-benchmark` running the same grant and release
//!   scripts (`EVALSHA` of [`GRANT_SCRIPT`] and [`RELEASE_SCRIPT`]) from one
//!   client; the pair's rate is `1 / (1/grant + 1/release)`, its latency the
//!   sum of the two;
//! - the limit for PostgreSQL: `pgbench -M prepared` running the same lease
//!   SQL ([`PG_ACQUIRE`] then [`PG_RELEASE`]) against the same database;
//! - the limit for MariaDB: `mariadb-slap` running the same SQL
//!   ([`MYSQL_ACQUIRE`] then [`MYSQL_RELEASE`]; it reports no latencies);
//! - the peer: the Python `redis` package's `Lock` (its defaults: 0.1 s sleep
//!   between tries when waiting), installed into a venv under `target/`.
//!
//! A lock serialises its holders, so with contenders the ceiling is still one
//! grant+release at a time: the contended rows are compared with the same
//! single-client limit.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use harness::{MariaDb, Postgres, Redis};
use tokio::process::Command;
use tokio::time::Instant;
use worker::lock::lease_table::{LeaseTable, MYSQL_ACQUIRE, MYSQL_RELEASE, PG_ACQUIRE, PG_RELEASE};
use worker::lock::redis::{RedisLock, GRANT_SCRIPT, RELEASE_SCRIPT};
use worker::lock::{AcquireOptions, LockService};

use crate::stats::{median, ms, spread, Run};

/// The pinned version of the Python peer.
const PY_REDIS: &str = "redis==8.1.0";

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
    let python = match &args.python {
        Some(p) => Ok(p.clone()),
        None => python_venv().await,
    };
    if let Err(e) = &python {
        eprintln!("Python peer unavailable: {e:#}");
    }

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
            rows[base + 3].push(python_lock(py, redis.port(), 1, secs).await?);
            rows[base + 4].push(python_lock(py, redis.port(), n, secs).await?);
        }
        if args.redis_only {
            continue;
        }
        let pg_svc = services[1].1.clone();
        rows[2].push(ours(pg_svc.clone(), 1, secs, &u).await?);
        rows[base + 1].push(pgbench(&pg_db, secs).await?);
        rows[3].push(ours(pg_svc, n, secs, &c).await?);
        let my_svc = services[2].1.clone();
        rows[4].push(ours(my_svc.clone(), 1, secs, &u).await?);
        let slap = mariadb_slap(maria.port(), &my_db, secs).await?;
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
            let mut lat = Vec::new();
            while Instant::now() < end {
                let t0 = Instant::now();
                let lease = svc.acquire_with(&lock, opts).await?;
                lease.release().await?;
                lat.push(t0.elapsed());
            }
            anyhow::Ok(lat)
        }));
    }
    let mut latencies = Vec::new();
    for j in joins {
        latencies.extend(j.await??);
    }
    Ok(Run {
        ops: latencies.len() as u64,
        elapsed: start.elapsed(),
        latencies,
    })
}

/// redis-benchmark, one client, EVALSHA of the grant script then (separately)
/// of the release script, each for `secs / 2` worth of requests.
async fn redis_benchmark(port: u16, secs: Duration) -> anyhow::Result<Run> {
    let mut halves = Vec::new();
    for script in [GRANT_SCRIPT, RELEASE_SCRIPT] {
        let sha = output(Command::new("redis-cli").args([
            "-p",
            &port.to_string(),
            "SCRIPT",
            "LOAD",
            script,
        ]))
        .await?
        .trim()
        .to_string();
        // Probe the rate, then size -n so that the run lasts about secs / 2.
        let probe = redis_benchmark_once(port, &sha, 2_000).await?;
        let n = ((probe.0 * secs.as_secs_f64() / 2.0) as u64).max(2_000);
        halves.push(redis_benchmark_once(port, &sha, n).await?);
    }
    let (grant, release) = (halves[0], halves[1]);
    let pair_rate = 1.0 / (1.0 / grant.0 + 1.0 / release.0);
    // One synthetic sample per quantile so that Run's p50/p99 give the sums.
    let p50 = grant.1 + release.1;
    let p99 = grant.2 + release.2;
    let mut latencies = vec![p50; 98];
    latencies.extend([p99, p99]);
    Ok(Run {
        ops: (pair_rate * 1000.0) as u64,
        elapsed: Duration::from_secs(1000),
        latencies,
    })
}

/// (requests/s, p50, p99) of one redis-benchmark run of `EVALSHA sha` on
/// random lock names (so every grant takes a free lock: SET and INCR).
async fn redis_benchmark_once(
    port: u16,
    sha: &str,
    n: u64,
) -> anyhow::Result<(f64, Duration, Duration)> {
    let out = output(Command::new("redis-benchmark").args([
        "-p",
        &port.to_string(),
        "-c",
        "1",
        "-n",
        &n.to_string(),
        "-r",
        "100000000",
        "--csv",
        "EVALSHA",
        sha,
        "2",
        "lock:{bench-__rand_int__}",
        "fence:{bench-__rand_int__}",
        "bench-owner",
        "10000",
    ]))
    .await?;
    let line = out
        .lines()
        .nth(1)
        .context("redis-benchmark printed no result")?;
    let fields: Vec<&str> = line.split("\",\"").map(|f| f.trim_matches('"')).collect();
    let num = |i: usize| -> anyhow::Result<f64> {
        fields
            .get(i)
            .context("short redis-benchmark line")?
            .parse::<f64>()
            .with_context(|| format!("redis-benchmark field {i} in {line}"))
    };
    Ok((
        num(1)?,
        Duration::from_secs_f64(num(4)? / 1000.0),
        Duration::from_secs_f64(num(6)? / 1000.0),
    ))
}

/// pgbench, one client, the same grant then release SQL (prepared), with
/// per-transaction latencies from its log.
async fn pgbench(url: &str, secs: Duration) -> anyhow::Result<Run> {
    let dir = tempfile_dir("pgbench")?;
    let grant = PG_ACQUIRE
        .replace("$1", "'pgbench'")
        .replace("$2", "'pgbench-holder'")
        .replace("$3", "10.0")
        .replace("$4", "0.0");
    let release = PG_RELEASE
        .replace("$1", "'pgbench'")
        .replace("$2", "'pgbench-holder'")
        .replace("$3", ":token");
    let script = format!("{} \\gset\n{};\n", one_line(&grant), one_line(&release));
    let script_path = dir.join("lock.sql");
    std::fs::write(&script_path, script)?;
    // url: postgres://postgres@127.0.0.1:PORT/DB
    let (host_port, db) = url
        .trim_start_matches("postgres://postgres@")
        .split_once('/')
        .context("postgres url")?;
    let (host, port) = host_port.split_once(':').context("postgres url port")?;
    let start = Instant::now();
    output(
        Command::new(harness::postgres::pgbench())
            .current_dir(&dir)
            .args(["-n", "-M", "prepared", "-c", "1", "-T"])
            .arg(secs.as_secs().to_string())
            .args([
                "-h",
                host,
                "-p",
                port,
                "-U",
                "postgres",
                "-l",
                "--log-prefix",
            ])
            .arg(dir.join("pgb"))
            .arg("-f")
            .arg(&script_path)
            .arg(db),
    )
    .await?;
    let elapsed = start.elapsed().min(secs);
    let mut latencies = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|f| f.to_string_lossy().starts_with("pgb"))
        {
            for line in std::fs::read_to_string(&path)?.lines() {
                // client_id transaction_no time_us script_no time_epoch time_us
                if let Some(us) = line.split_whitespace().nth(2) {
                    latencies.push(Duration::from_micros(us.parse()?));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if latencies.is_empty() {
        bail!("pgbench logged no transactions");
    }
    Ok(Run {
        ops: latencies.len() as u64,
        elapsed,
        latencies,
    })
}

/// mariadb-slap, one client, the same grant then release SQL; the release
/// reads the token with `last_insert_id()` on the same connection. Pairs/s.
async fn mariadb_slap(port: u16, url: &str, secs: Duration) -> anyhow::Result<f64> {
    let db = url.rsplit('/').next().context("mysql url")?;
    let grant = MYSQL_ACQUIRE
        .replacen('?', "'slap-holder'", 1)
        .replacen('?', "10000000", 1)
        .replacen('?', "'limit'", 1)
        .replacen('?', "0", 1);
    let release = MYSQL_RELEASE
        .replacen('?', "'limit'", 1)
        .replacen('?', "'slap-holder'", 1)
        .replacen('?', "last_insert_id()", 1);
    let query = format!("{};{}", one_line(&grant), one_line(&release));
    let slap = |pairs: u64| {
        let query = query.clone();
        async move {
            let out = output(Command::new("mariadb-slap").args([
                "--host=127.0.0.1",
                &format!("--port={port}"),
                "--user=root",
                &format!("--create-schema={db}"),
                "--concurrency=1",
                "--iterations=1",
                &format!("--number-of-queries={}", pairs * 2),
                "--delimiter=;",
                &format!("--query={query}"),
            ]))
            .await?;
            let secs: f64 = out
                .lines()
                .find(|l| l.contains("Average number of seconds"))
                .and_then(|l| l.split_whitespace().find_map(|w| w.parse().ok()))
                .with_context(|| format!("mariadb-slap output: {out}"))?;
            anyhow::Ok(pairs as f64 / secs)
        }
    };
    let probe = slap(500).await?;
    slap(((probe * secs.as_secs_f64()) as u64).max(500)).await
}

const PY_LOCK: &str = r#"
import json, sys, threading, time
import redis
port, clients, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
name = "py-%d" % clients
r = redis.Redis(port=port)
lat, guard = [], threading.Lock()
end = time.perf_counter() + secs
def work():
    mine = []
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        lock = r.lock(name, timeout=10, blocking_timeout=30)
        if not lock.acquire():
            raise SystemExit("not acquired")
        lock.release()
        mine.append(time.perf_counter() - t0)
    with guard:
        lat.extend(mine)
start = time.perf_counter()
threads = [threading.Thread(target=work) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"elapsed": time.perf_counter() - start, "lat": lat}))
"#;

/// The Python peer: `redis.Redis().lock(...)` acquire+release in a loop, by
/// `clients` threads on one lock.
async fn python_lock(
    python: &Path,
    port: u16,
    clients: usize,
    secs: Duration,
) -> anyhow::Result<Run> {
    let out = output(
        Command::new(python)
            .arg("-c")
            .arg(PY_LOCK)
            .arg(port.to_string())
            .arg(clients.to_string())
            .arg(secs.as_secs_f64().to_string()),
    )
    .await?;
    #[derive(serde::Deserialize)]
    struct Out {
        elapsed: f64,
        lat: Vec<f64>,
    }
    let o: Out = serde_json::from_str(out.trim()).context("python peer output")?;
    Ok(Run {
        ops: o.lat.len() as u64,
        elapsed: Duration::from_secs_f64(o.elapsed),
        latencies: o.lat.into_iter().map(Duration::from_secs_f64).collect(),
    })
}

/// A venv under `target/` with the pinned `redis` package, created on first use.
async fn python_venv() -> anyhow::Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let venv = target.join("lockbench-venv");
    let python = venv.join("bin/python");
    let has_redis = Command::new(&python)
        .args(["-c", "import redis"])
        .output()
        .await
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_redis {
        eprintln!("creating {} with {PY_REDIS} ...", venv.display());
        output(Command::new("python3").arg("-m").arg("venv").arg(&venv)).await?;
        output(Command::new(venv.join("bin/pip")).args(["install", "-q", PY_REDIS])).await?;
    }
    Ok(python)
}

async fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .await
        .with_context(|| format!("spawn {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn one_line(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn tempfile_dir(what: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("bench-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
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
