//! The real services of each backend, started by this command, and the
//! lock clients on them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail};
use chaos::Backend;
use fencelock::lease_table::LeaseTable;
use fencelock::redis::RedisLock;
use fencelock::redis_sentinel::RedisSentinelLock;
use fencelock::redlock::Redlock;
use fencelock::zookeeper::ZooKeeperLock;
use fencelock::{LockService, WaitStats};
use harness::zookeeper::ZooKeeperEnsemble;
use harness::{MariaDb, Postgres, Redis, SentinelGroup, ZooKeeper};

/// Redlock's N in the comparison.
pub const REDLOCK_N: usize = 5;

/// The API key of the comparison's worker `i` (client `cmp-i`).
pub fn worker_key(i: usize) -> String {
    format!("cmp-{i}-key-not-secret")
}

/// A worker's lock service and its wait counters, if it keeps any.
pub struct HotClient {
    pub locks: Arc<dyn LockService>,
    pub stats: Option<Box<dyn Fn() -> WaitStats + Send + Sync>>,
}

/// The real services one backend needs, started by this command.
pub enum Services {
    Redis(Redis),
    Redlock(Vec<Redis>),
    ZooKeeper(ZooKeeper),
    /// Three servers on loopback, quorum 2: every grant is a quorum write.
    ZooKeeperEnsemble(ZooKeeperEnsemble),
    /// A master, one replica and three sentinels.
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
    pub fn zookeeper_connect(&self) -> Option<String> {
        match self {
            Services::ZooKeeper(z) => Some(z.connect_string()),
            Services::ZooKeeperEnsemble(e) => Some(e.connect_string()),
            _ => None,
        }
    }

    pub fn redis_urls(&self) -> Vec<String> {
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
            Services::Redlock(_) => Arc::new(Redlock::connect(&self.redis_urls()).await?),
            _ => self.fencing_client(None, fair).await?.locks,
        })
    }

    /// A hot-page worker's lock service: fair or not, recording `client_id`.
    pub async fn hot_client(&self, client_id: &str, fair: bool) -> anyhow::Result<HotClient> {
        self.fencing_client(Some(client_id), fair).await
    }

    /// A lock service that mints tokens, fair or not, recording `client_id`
    /// if given, with its wait counters where it keeps some.
    async fn fencing_client(
        &self,
        client_id: Option<&str>,
        fair: bool,
    ) -> anyhow::Result<HotClient> {
        /// The variant asked for, with the client id.
        macro_rules! variant {
            ($connect:expr) => {{
                let mut locks = $connect;
                if let Some(id) = client_id {
                    locks = locks
                        .with_client_id(id)
                        .map_err(|e| anyhow!("client id: {e}"))?;
                }
                if fair {
                    locks
                } else {
                    locks.non_fair()
                }
            }};
        }
        /// A lock that counts its waits.
        macro_rules! counted {
            ($locks:expr) => {{
                let locks = $locks;
                let counted = locks.clone();
                HotClient {
                    locks: Arc::new(locks),
                    stats: Some(Box::new(move || counted.wait_stats())),
                }
            }};
        }
        Ok(match self {
            Services::Redis(r) => counted!(variant!(RedisLock::connect(&r.url()).await?)),
            Services::ZooKeeper(_) | Services::ZooKeeperEnsemble(_) => {
                let connect = self.zookeeper_connect().expect("zookeeper");
                let locks =
                    variant!(ZooKeeperLock::connect(&connect, Duration::from_secs(6)).await?);
                HotClient {
                    locks: Arc::new(locks),
                    stats: None,
                }
            }
            Services::Sentinel(g) => counted!(variant!(
                RedisSentinelLock::connect(&g.sentinel_addrs(), g.master_name()).await?
            )),
            Services::Postgres { db, .. } => counted!(variant!(LeaseTable::postgres(db).await?)),
            Services::MariaDb { db, .. } => counted!(variant!(LeaseTable::mysql(db).await?)),
            Services::Redlock(_) => bail!("Redlock mints no token: no hot page"),
        })
    }

    /// An in-process gateway on a fresh database with the fence enforced and
    /// trust on, as in the demo: the keys of `workers` workers (`cmp-0`...)
    /// required and, for a backend with tokens, each token checked with this
    /// service.
    pub async fn gateway(&self, workers: usize) -> anyhow::Result<gateway::RunningGateway> {
        let db = guarded("postgres for the gateway", harness::fresh_database()).await?;
        let mut options = gateway::GatewayOptions::new(gateway::FenceCheck::Enforce);
        for i in 0..workers {
            options = options.api_key(&format!("cmp-{i}"), &worker_key(i));
        }
        if let Some((name, url)) = self.issuer() {
            options = options.issuer(name, &url);
        }
        gateway::spawn_with_options(&db, options).await
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
    pub fn worker_args(&self) -> Vec<String> {
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
pub async fn guarded<T, F>(what: &str, fut: F) -> anyhow::Result<T>
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
