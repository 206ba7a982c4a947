//! One function per figure of the comparison. Every figure is a real run
//! against the real service started here; an error is returned, never a number
//! made up.
//!
//! The limits and peers run the same invocations as the per-backend benchmarks,
//! through the functions they share: `tools.rs` (redis-benchmark, pgbench,
//! mariadb-slap, the Python venv peers), `redlock.rs` (bare SET NX PX + DEL on
//! every node, rslock) and `zookeeper.rs` (raw create + getChildren + delete).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use chaos::Backend;
use clap::Parser;
use fencelock::lease_table::LeaseTable;
use fencelock::redis::RedisLock;
use fencelock::redis_sentinel::RedisSentinelLock;
use fencelock::redlock::Redlock;
use fencelock::zookeeper::ZooKeeperLock;
use fencelock::{AcquireOptions, LockService};
use futures::future::join_all;
use harness::zookeeper::ZooKeeperEnsemble;
use harness::{MariaDb, Postgres, Redis, SentinelGroup, ZooKeeper};
use tokio::time::Instant;
use zookeeper_client as zk;

use super::{Commands, Figure, Settings};
use crate::stats::Run;
use crate::{locks, redlock, tools, zookeeper};

/// Redlock's N in the comparison.
pub const REDLOCK_N: usize = 5;
/// Pinned versions of the Python peers.
const PY_PACKAGES: [&str; 2] = ["redis==8.1.0", "kazoo==2.11.0"];
/// Grants in the speed runs outlive any run; nobody renews them.
const TTL: Duration = Duration::from_secs(10);

pub struct Ctx {
    pub settings: Settings,
    pub commands: Commands,
    pub python: Option<PathBuf>,
    pub python_error: Option<String>,
}

/// The real services one backend needs, started by this command.
pub enum Services {
    Redis(Redis),
    Redlock(Vec<Redis>),
    ZooKeeper(ZooKeeper),
    /// Three servers on loopback, quorum 2 (issue 14): every grant is a quorum write.
    ZooKeeperEnsemble(ZooKeeperEnsemble),
    /// A master, one replica and three sentinels (issue 14).
    Sentinel(SentinelGroup),
    Postgres {
        _server: Postgres,
        db: String,
    },
    MariaDb {
        server: MariaDb,
        db: String,
    },
}

impl Services {
    /// Start them; a harness panic (binary missing, no readiness) becomes an error.
    pub async fn start(backend: Backend) -> anyhow::Result<Services> {
        Ok(match backend {
            Backend::Redis => Services::Redis(guarded("redis-server", Redis::start()).await?),
            Backend::Redlock => {
                let mut nodes = vec![];
                for _ in 0..REDLOCK_N {
                    nodes.push(guarded("redis-server", Redis::start()).await?);
                }
                Services::Redlock(nodes)
            }
            Backend::Zookeeper => {
                Services::ZooKeeper(guarded("zookeeper", ZooKeeper::start()).await?)
            }
            Backend::LeasePostgres => {
                let server = guarded("postgres", Postgres::start()).await?;
                let db = server.create_database().await;
                Services::Postgres {
                    _server: server,
                    db,
                }
            }
            Backend::LeaseMysql => {
                let server = guarded("mariadb", MariaDb::start()).await?;
                let db = server.create_database().await;
                Services::MariaDb { server, db }
            }
            Backend::RedisSentinel => {
                Services::Sentinel(guarded("redis sentinel group", SentinelGroup::start()).await?)
            }
        })
    }

    /// The three-node ZooKeeper ensemble on loopback, measured beside the
    /// standalone server so that the price of the quorum shows.
    pub async fn start_zookeeper_ensemble() -> anyhow::Result<Services> {
        Ok(Services::ZooKeeperEnsemble(
            guarded("zookeeper ensemble", ZooKeeperEnsemble::start()).await?,
        ))
    }

    /// The ZooKeeper connect string, standalone or ensemble.
    fn zookeeper_connect(&self) -> Option<String> {
        match self {
            Services::ZooKeeper(z) => Some(z.connect_string()),
            Services::ZooKeeperEnsemble(e) => Some(e.connect_string()),
            _ => None,
        }
    }

    fn redis_urls(&self) -> Vec<String> {
        match self {
            Services::Redis(r) => vec![r.url()],
            Services::Redlock(nodes) => nodes.iter().map(Redis::url).collect(),
            _ => vec![],
        }
    }

    /// `n` lock services, each with its own connection (or session, or
    /// pool), of the default variant (fair, for the locks that have both).
    pub async fn lock_clients(&self, n: usize) -> anyhow::Result<Vec<Arc<dyn LockService>>> {
        self.lock_clients_variant(n, true).await
    }

    /// `n` lock services of the fair variant or not (Redlock has only one).
    pub async fn lock_clients_variant(
        &self,
        n: usize,
        fair: bool,
    ) -> anyhow::Result<Vec<Arc<dyn LockService>>> {
        let mut out: Vec<Arc<dyn LockService>> = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.client(fair).await?);
        }
        Ok(out)
    }

    /// Whether a waiter's wait is itself a round trip to the service
    /// (MariaDB's bell); a notification or a message costs none.
    pub fn waits_are_round_trips(&self) -> bool {
        matches!(self, Services::MariaDb { .. })
    }

    /// One lock service, fair or not.
    async fn client(&self, fair: bool) -> anyhow::Result<Arc<dyn LockService>> {
        Ok(match self {
            Services::Redis(r) => {
                let l = RedisLock::connect(&r.url()).await?;
                Arc::new(if fair { l } else { l.non_fair() })
            }
            Services::Redlock(_) => Arc::new(Redlock::connect(&self.redis_urls()).await?),
            Services::ZooKeeper(_) | Services::ZooKeeperEnsemble(_) => {
                let l = ZooKeeperLock::connect(
                    &self.zookeeper_connect().expect("zookeeper"),
                    Duration::from_secs(6),
                )
                .await?;
                Arc::new(if fair { l } else { l.non_fair() })
            }
            Services::Sentinel(g) => {
                let l = RedisSentinelLock::connect(&g.sentinel_addrs(), g.master_name()).await?;
                Arc::new(if fair { l } else { l.non_fair() })
            }
            Services::Postgres { db, .. } => {
                let l = LeaseTable::postgres(db).await?;
                Arc::new(if fair { l } else { l.non_fair() })
            }
            Services::MariaDb { db, .. } => {
                let l = LeaseTable::mysql(db).await?;
                Arc::new(if fair { l } else { l.non_fair() })
            }
        })
    }

    /// A hot-page worker's lock service: fair or not, recording `client_id`.
    pub async fn hot_client(
        &self,
        client_id: &str,
        fair: bool,
    ) -> anyhow::Result<super::hot::HotClient> {
        use super::hot::HotClient;
        let with_id = |e: fencelock::LockError| anyhow::anyhow!("client id: {e}");
        Ok(match self {
            Services::Redis(r) => {
                let l = RedisLock::connect(&r.url())
                    .await?
                    .with_client_id(client_id)
                    .map_err(with_id)?;
                let l = if fair { l } else { l.non_fair() };
                let counted = l.clone();
                HotClient {
                    locks: Arc::new(l),
                    stats: Some(Box::new(move || counted.wait_stats())),
                }
            }
            Services::ZooKeeper(_) | Services::ZooKeeperEnsemble(_) => {
                let l = ZooKeeperLock::connect(
                    &self.zookeeper_connect().expect("zookeeper"),
                    Duration::from_secs(6),
                )
                .await?
                .with_client_id(client_id)
                .map_err(with_id)?;
                HotClient {
                    locks: Arc::new(if fair { l } else { l.non_fair() }),
                    stats: None,
                }
            }
            Services::Sentinel(g) => {
                let l = RedisSentinelLock::connect(&g.sentinel_addrs(), g.master_name())
                    .await?
                    .with_client_id(client_id)
                    .map_err(with_id)?;
                let l = if fair { l } else { l.non_fair() };
                let counted = l.clone();
                HotClient {
                    locks: Arc::new(l),
                    stats: Some(Box::new(move || counted.wait_stats())),
                }
            }
            Services::Postgres { db, .. } | Services::MariaDb { db, .. } => {
                let l = if matches!(self, Services::Postgres { .. }) {
                    LeaseTable::postgres(db).await?
                } else {
                    LeaseTable::mysql(db).await?
                }
                .with_client_id(client_id)
                .map_err(with_id)?;
                let l = if fair { l } else { l.non_fair() };
                let counted = l.clone();
                HotClient {
                    locks: Arc::new(l),
                    stats: Some(Box::new(move || counted.wait_stats())),
                }
            }
            Services::Redlock(_) => anyhow::bail!("Redlock mints no token: no hot page"),
        })
    }

    /// The gateway's issuer for this service's tokens (name, URL); `None`
    /// for Redlock, which mints none.
    pub fn issuer(&self) -> Option<(&'static str, String)> {
        match self {
            Services::Redis(r) => Some(("redis", r.url())),
            Services::Redlock(_) => None,
            Services::ZooKeeper(_) | Services::ZooKeeperEnsemble(_) => Some((
                "zookeeper",
                format!(
                    "zookeeper://{}",
                    self.zookeeper_connect().expect("zookeeper")
                ),
            )),
            Services::Sentinel(g) => Some((
                "redis-sentinel",
                format!(
                    "redis-sentinel://{}/{}",
                    g.sentinel_addrs().join(","),
                    g.master_name()
                ),
            )),
            Services::Postgres { db, .. } => Some(("lease-postgres", db.clone())),
            Services::MariaDb { db, .. } => Some(("lease-mysql", db.clone())),
        }
    }

    /// The worker flags that reach this service.
    fn worker_args(&self) -> Vec<String> {
        let (backend, flag, value) = match self {
            Services::Redis(r) => ("redis", "--redis-url", r.url()),
            Services::Redlock(_) => ("redlock", "--redlock-urls", self.redis_urls().join(",")),
            Services::ZooKeeper(_) | Services::ZooKeeperEnsemble(_) => (
                "zookeeper",
                "--zookeeper-connect",
                self.zookeeper_connect().expect("zookeeper"),
            ),
            Services::Sentinel(g) => (
                "redis-sentinel",
                "--redis-sentinels",
                g.sentinel_addrs().join(","),
            ),
            Services::Postgres { db, .. } => ("lease-postgres", "--database-url", db.clone()),
            Services::MariaDb { db, .. } => ("lease-mysql", "--mysql-url", db.clone()),
        };
        vec!["--backend".into(), backend.into(), flag.into(), value]
    }
}

/// Run a harness start in a task so that its panic is an error here.
async fn guarded<T, F>(what: &str, fut: F) -> anyhow::Result<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    tokio::spawn(fut).await.map_err(|e| {
        let text = if e.is_panic() {
            let p = e.into_panic();
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into())
        } else {
            e.to_string()
        };
        anyhow!("{what} did not start: {text}")
    })
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
    let tasks = clients.iter().map(|svc| {
        let svc = svc.clone();
        let lock = lock.to_string();
        tokio::spawn(async move { locks::acquire_release_until(&*svc, &lock, opts(), end).await })
    });
    let mut run = Run::default();
    for t in join_all(tasks).await {
        run.latencies.extend(t.context("bench task panicked")??);
    }
    run.ops = run.latencies.len() as u64;
    run.elapsed = start.elapsed();
    Ok(Figure::from(&run))
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
    let db = guarded("postgres for the gateway", harness::fresh_database()).await?;
    // Trust on, as in the demo: each worker's key required and, for a
    // backend with tokens, every token checked with its issuer.
    let key = |i: usize| format!("cmp-{i}-key-not-secret");
    let mut options = gateway::GatewayOptions::new(gateway::FenceCheck::Enforce);
    for i in 0..s.workers {
        options = options.api_key(&format!("cmp-{i}"), &key(i));
    }
    if let Some((name, url)) = services.issuer() {
        options = options.issuer(name, &url);
    }
    let gw = gateway::spawn_with_options(&db, options).await?;
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
            &key(i),
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
            let port = r.port().to_string();
            python_peer(&ctx.commands, &python()?, PY_REDIS_LOCK, &port, secs).await
        }
        Services::Redlock(_) => rslock(&services.redis_urls(), secs, repeat).await,
        Services::ZooKeeper(_) | Services::ZooKeeperEnsemble(_) => {
            let cs = services.zookeeper_connect().expect("zookeeper");
            python_peer(&ctx.commands, &python()?, PY_KAZOO_LOCK, &cs, secs).await
        }
        _ => bail!("no peer for this backend"),
    }
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
async fn timed<F, Fut>(secs: Duration, mut op: F) -> anyhow::Result<Figure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let start = Instant::now();
    let end = start + secs;
    let mut run = Run::default();
    while Instant::now() < end {
        let t0 = Instant::now();
        op().await?;
        run.latencies.push(t0.elapsed());
    }
    run.ops = run.latencies.len() as u64;
    run.elapsed = start.elapsed();
    Ok(Figure::from(&run))
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

const PY_REDIS_LOCK: &str = r#"
import json, sys, time
import redis
port, secs = int(sys.argv[1]), float(sys.argv[2])
r = redis.Redis(port=port)
lat = []
start = time.perf_counter()
end = start + secs
while time.perf_counter() < end:
    t0 = time.perf_counter()
    lock = r.lock("cmp-py", timeout=10, blocking_timeout=30)
    if not lock.acquire():
        raise SystemExit("not acquired")
    lock.release()
    lat.append(time.perf_counter() - t0)
print(json.dumps({"elapsed": time.perf_counter() - start, "lat": lat}))
"#;

const PY_KAZOO_LOCK: &str = r#"
import json, sys, time
from kazoo.client import KazooClient
hosts, secs = sys.argv[1], float(sys.argv[2])
zk = KazooClient(hosts=hosts, timeout=6.0)
zk.start(timeout=15)
lock = zk.Lock("/cmp-kazoo/lock", "compare")
lat = []
start = time.perf_counter()
end = start + secs
while time.perf_counter() < end:
    t0 = time.perf_counter()
    if not lock.acquire(timeout=30):
        raise SystemExit("not acquired")
    lock.release()
    lat.append(time.perf_counter() - t0)
elapsed = time.perf_counter() - start
zk.stop()
print(json.dumps({"elapsed": elapsed, "lat": lat}))
"#;

/// A Python peer script: acquire+release in a loop for `secs`, one thread.
async fn python_peer(
    commands: &Commands,
    python: &Path,
    script: &str,
    target: &str,
    secs: Duration,
) -> anyhow::Result<Figure> {
    let which = if script == PY_KAZOO_LOCK {
        "kazoo: KazooClient(hosts).Lock(path).acquire(timeout=30) + release()"
    } else {
        "redis: Redis(port).lock(name, timeout=10, blocking_timeout=30).acquire() + release()"
    };
    commands.record(format!(
        "target/compare-venv/bin/python -c <script in bench/src/compare/measure.rs> TARGET {} \
         ({which}, one thread)",
        secs.as_secs_f64()
    ));
    let args = [target.to_string(), secs.as_secs_f64().to_string()];
    let run = tools::python_peer(python, script, &args).await?;
    Ok(Figure::from(&run))
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
