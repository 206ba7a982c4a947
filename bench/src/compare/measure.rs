//! One function per figure of the comparison. Every figure is a real run
//! against the real service started here; an error is returned, never a number
//! made up.
//!
//! The limits and peers run the same invocations as the per-backend benchmarks,
//! through the functions they share: `tools.rs` (redis-benchmark, pgbench,
//! mariadb-slap), `peers.rs` (the Python peers, here with one thread),
//! `redlock.rs` (bare SET NX PX + DEL on every node, rslock) and
//! `zookeeper.rs` (raw create + getChildren + delete).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use chaos::Backend;
use clap::Parser;
use fencelock::lease_table::LeaseTable;
use fencelock::{AcquireOptions, LockService};
use tokio::time::Instant;
use zookeeper_client as zk;

use super::report::{Commands, Figure, Settings};
use super::services::{worker_key, Services};
use crate::stats::Run;
use crate::{locks, peers, redlock, tools, zookeeper};

/// Pinned versions of the Python peers.
const PY_PACKAGES: [&str; 2] = [peers::REDIS, peers::KAZOO];
/// Grants in the speed runs outlive any run; nobody renews them.
const TTL: Duration = Duration::from_secs(10);

pub struct Ctx {
    pub settings: Settings,
    pub commands: Commands,
    pub python: Option<PathBuf>,
    pub python_error: Option<String>,
}

pub fn limit_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Redis => "redis-benchmark: EVALSHA grant + release scripts",
        Backend::Redlock => "bare SET NX PX + DEL on the 5 nodes",
        Backend::Zookeeper => "raw create EPHEMERAL_SEQUENTIAL + getChildren + delete",
        Backend::LeasePostgres => "pgbench -M prepared: the lease SQL",
        Backend::LeaseMysql => "mariadb-slap: the lease SQL",
        Backend::RedisSentinel => "redis-benchmark: EVALSHA grant + release scripts, on the master",
    }
}

pub fn peer_name(backend: Backend) -> Option<&'static str> {
    match backend {
        Backend::Redis => Some("Python redis 8.1.0 Lock"),
        Backend::Redlock => Some("rslock 0.10.0 (N=5)"),
        Backend::Zookeeper => Some("Python kazoo 2.11.0 Lock"),
        Backend::LeasePostgres | Backend::LeaseMysql | Backend::RedisSentinel => None,
    }
}

fn opts() -> AcquireOptions {
    AcquireOptions::new(TTL)
        .wait(Duration::from_secs(30))
        .auto_renew(false)
}

/// A few grants so that connections, scripts and tables exist before timing.
pub async fn warm_up(svc: &Arc<dyn LockService>) -> anyhow::Result<()> {
    for _ in 0..20 {
        svc.acquire_with("cmp-warmup", opts())
            .await?
            .release()
            .await?;
    }
    Ok(())
}

/// Each client in its own task acquires and releases `lock` for `secs`; one
/// client is the uncontended figure, several on one lock the contended one.
/// The latency of an operation includes any wait for the lock.
pub async fn ours(
    clients: &[Arc<dyn LockService>],
    lock: &str,
    secs: Duration,
) -> anyhow::Result<Figure> {
    let start = Instant::now();
    let end = start + secs;
    let tasks = clients
        .iter()
        .map(|svc| {
            let svc = svc.clone();
            let lock = lock.to_string();
            tokio::spawn(
                async move { locks::acquire_release_until(&*svc, &lock, opts(), end).await },
            )
        })
        .collect();
    Ok(Figure::from(&Run::joined(start, tasks).await?))
}

/// Uncontended acquire+release on a client of its own, connected for this
/// measurement (fair or not) and warmed up: a new connection each repeat.
/// With one client kept for every repeat, the repeats of one run moved
/// together by up to a third (7,000 against 10,000/s on Redis, the same
/// build), with where the runtime had placed that connection's driver task
/// (`scripts/ab-uncontended` shows the spread, docs/BENCHMARKS.md "The
/// uncontended bound"); a fresh client draws it afresh, and the median of
/// the repeats is then a median over placements.
pub async fn uncontended(
    services: &Services,
    fair: bool,
    lock: &str,
    secs: Duration,
) -> anyhow::Result<Figure> {
    let client = services.lock_clients_variant(1, fair).await?;
    warm_up(&client[0]).await?;
    ours(&client, lock, secs).await
}

/// `settings.workers` workers (the worker library's own edit loop, in this
/// process, each with its own lock-service connection) edit one page through
/// an in-process gateway with the fence enforced, for `e2e_secs`, with no
/// simulated work between read and write. The rate is acknowledged edits per
/// second; the note says what else happened.
pub async fn e2e(services: &Services, page: &str, s: Settings) -> anyhow::Result<(Figure, String)> {
    let gw = services.gateway(s.workers).await?;
    let start = Instant::now();
    let mut joins = vec![];
    for i in 0..s.workers {
        let mut argv: Vec<String> = [
            "worker",
            "--gateway",
            &gw.url(),
            "--page",
            page,
            "--client-id",
            &format!("cmp-{i}"),
            "--duration",
            &format!("{}ms", s.e2e_secs.as_millis()),
            "--work-ms",
            "0",
            "--ttl",
            "2s",
            "--wait",
            "10s",
            "--fencing",
            "on",
            "--api-key",
            &worker_key(i),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        argv.extend(services.worker_args());
        let config = worker::config::Config::try_parse_from(argv)?;
        joins.push(tokio::spawn(worker::run(config, std::future::pending())));
    }
    let mut total = worker::events::Summary::default();
    for j in joins {
        let s = j.await.context("worker task panicked")??;
        total.attempted += s.attempted;
        total.acknowledged += s.acknowledged;
        total.rejected += s.rejected;
        total.abandoned += s.abandoned;
        total.errors += s.errors;
    }
    let elapsed = start.elapsed();
    let _ = gw.shutdown().await;
    if total.acknowledged == 0 {
        bail!("no edit acknowledged in {elapsed:?}: {total:?}");
    }
    let note = if total.acknowledged == total.attempted {
        String::new()
    } else {
        format!(
            "{} edits: {} acknowledged, {} rejected (fence or issuer check), {} abandoned, {} errors",
            total.attempted, total.acknowledged, total.rejected, total.abandoned, total.errors
        )
    };
    Ok((
        Figure {
            rate: total.acknowledged as f64 / elapsed.as_secs_f64(),
            p50: None,
            p99: None,
        },
        note,
    ))
}

/// The limit of this backend's service, one client, `secs`.
pub async fn limit(ctx: &Ctx, services: &Services, repeat: usize) -> anyhow::Result<Figure> {
    let secs = ctx.settings.secs;
    match services {
        Services::Redis(r) => redis_benchmark(&ctx.commands, r.port(), secs).await,
        Services::Redlock(_) => bare_redis_nodes(&services.redis_urls(), secs, repeat).await,
        Services::ZooKeeper(_) | Services::ZooKeeperEnsemble(_) => {
            let connect = services.zookeeper_connect().expect("zookeeper");
            raw_zookeeper(&connect, secs, repeat).await
        }
        Services::Sentinel(g) => {
            let master = g
                .named_master()
                .await
                .context("the sentinels name no master")?;
            redis_benchmark(&ctx.commands, g.node_port(master), secs).await
        }
        Services::Postgres { db, .. } => pgbench(&ctx.commands, db, secs).await,
        Services::MariaDb { server, db } => {
            mariadb_slap(&ctx.commands, server.port(), db, secs).await
        }
    }
}

/// The peer library on the same service, one client, `secs`, uncontended.
pub async fn peer(ctx: &Ctx, services: &Services, repeat: usize) -> anyhow::Result<Figure> {
    let secs = ctx.settings.secs;
    let python = || {
        ctx.python.clone().ok_or_else(|| {
            anyhow!(
                "Python peers unavailable: {}",
                ctx.python_error.as_deref().unwrap_or("no venv")
            )
        })
    };
    match services {
        Services::Redis(r) => {
            record_peer(ctx, "REDIS_LOCK", ["PORT", ""], REDIS_PEER, secs);
            let run = peers::redis_lock(&python()?, r.port(), 1, secs).await?;
            Ok(Figure::from(&run))
        }
        Services::Redlock(_) => rslock(&services.redis_urls(), secs, repeat).await,
        Services::ZooKeeper(_) | Services::ZooKeeperEnsemble(_) => {
            let cs = services.zookeeper_connect().expect("zookeeper");
            record_peer(ctx, "KAZOO_LOCK", ["HOSTS", " NAME"], KAZOO_PEER, secs);
            let name = format!("cmp-kazoo-{repeat}");
            let run = peers::kazoo_lock(&python()?, &cs, 1, secs, &name).await?;
            Ok(Figure::from(&run))
        }
        _ => bail!("no peer for this backend"),
    }
}

/// What the Python peers do, for the report.
const REDIS_PEER: &str =
    "redis: Redis(port).lock(name, timeout=10, blocking_timeout=30).acquire() + release()";
const KAZOO_PEER: &str = "kazoo: KazooClient(hosts).Lock(path).acquire(timeout=30) + release()";

/// Record a Python peer's command line: `script` of `bench/src/peers.rs`,
/// one thread; `args` are what its command line has before the thread
/// count and after the seconds.
fn record_peer(ctx: &Ctx, script: &str, args: [&str; 2], what: &str, secs: Duration) {
    let [before, after] = args;
    ctx.commands.record(format!(
        "target/compare-venv/bin/python -c <{script} in bench/src/peers.rs> {before} 1 {}{after} \
         ({what}, one thread)",
        secs.as_secs_f64()
    ));
}

/// The Redis limit ([`tools::redis_benchmark_pair`]).
async fn redis_benchmark(commands: &Commands, port: u16, secs: Duration) -> anyhow::Result<Figure> {
    commands.record(tools::REDIS_BENCHMARK_COMMAND);
    let (rate, p50, p99) = tools::redis_benchmark_pair(port, secs).await?;
    Ok(Figure {
        rate,
        p50: Some(p50),
        p99: Some(p99),
    })
}

/// One client: `SET name x NX PX ttl` on every node at once, then `DEL` on
/// every node at once: the round trips of Redlock with no lock logic.
async fn bare_redis_nodes(
    urls: &[String],
    secs: Duration,
    repeat: usize,
) -> anyhow::Result<Figure> {
    let mut conns = vec![];
    for url in urls {
        conns.push(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    let name = format!("cmp-bare-{repeat}");
    timed(secs, || {
        let conns = conns.clone();
        let name = name.clone();
        async move { redlock::set_del_all(&conns, &name, TTL).await }
    })
    .await
}

/// One session: create EPHEMERAL_SEQUENTIAL, getChildren of the parent,
/// delete: the three requests of the lock recipe with no recipe around them
/// (the same sequence as `bench zookeeper`'s limit).
async fn raw_zookeeper(connect: &str, secs: Duration, repeat: usize) -> anyhow::Result<Figure> {
    let client = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(6))
        .connect(connect)
        .await
        .map_err(|e| anyhow!("zookeeper connect: {e}"))?;
    let parent = format!("/cmp-raw/r{repeat}");
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client
        .mkdir(&parent, &persistent)
        .await
        .map_err(|e| anyhow!("zookeeper mkdir {parent}: {e}"))?;
    let prefix = format!("{parent}/n-");
    timed(secs, || {
        let client = client.clone();
        let (parent, prefix) = (parent.clone(), prefix.clone());
        async move {
            let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            zookeeper::raw_once(&client, &parent, &prefix, &mode, "zookeeper ").await
        }
    })
    .await
}

/// rslock's `lock` then `unlock` on the Redlock nodes, one client.
async fn rslock(urls: &[String], secs: Duration, repeat: usize) -> anyhow::Result<Figure> {
    let manager = rslock::LockManager::new(urls.to_vec());
    let name = format!("cmp-rslock-{repeat}");
    timed(secs, || {
        let manager = manager.clone();
        let name = name.clone();
        async move { redlock::rslock_once(&manager, &name, TTL).await }
    })
    .await
}

/// Run `op` back to back for `secs`; one sample per call.
async fn timed<F, Fut>(secs: Duration, op: F) -> anyhow::Result<Figure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    Ok(Figure::from(&Run::timed(secs, op).await?))
}

/// The PostgreSQL lease-table limit ([`tools::pgbench_lease`]).
async fn pgbench(commands: &Commands, url: &str, secs: Duration) -> anyhow::Result<Figure> {
    commands.record(tools::PGBENCH_COMMAND);
    Ok(Figure::from(&tools::pgbench_lease(url, secs).await?))
}

/// mariadb-slap, one client, the lease grant then release SQL on an existing
/// row; it reports no latencies, only the rate.
async fn mariadb_slap(
    commands: &Commands,
    port: u16,
    url: &str,
    secs: Duration,
) -> anyhow::Result<Figure> {
    // The grant updates an existing row: create it with one real grant.
    let lease = LeaseTable::mysql(url).await?;
    lease
        .acquire("limit", Duration::from_secs(1), Duration::ZERO)
        .await?
        .release()
        .await?;
    commands.record(tools::MARIADB_SLAP_COMMAND);
    let rate = tools::mariadb_slap_pairs(port, url, secs).await?;
    Ok(Figure {
        rate,
        p50: None,
        p99: None,
    })
}

/// A venv under `target/compare-venv` with the pinned peers, created on first use.
pub async fn python_venv(commands: &Commands) -> anyhow::Result<PathBuf> {
    commands.record(format!(
        "python3 -m venv target/compare-venv && target/compare-venv/bin/pip install {}",
        PY_PACKAGES.join(" ")
    ));
    let python = tools::python_venv("compare-venv", "redis, kazoo", &PY_PACKAGES).await?;
    Ok(python)
}
