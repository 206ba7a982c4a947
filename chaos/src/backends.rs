//! The lock backends as real services, and the worker flags that reach them.
//!
//! ZooKeeper runs as a three-node ensemble by default, each server on its
//! own network namespace so that it can be partitioned
//! ([`harness::ZooKeeperHosts`]; needs root); `--zookeeper-standalone` gives
//! the single server of the earlier tables. `redis-sentinel` is a master, one
//! replica and three sentinels ([`harness::SentinelGroup`]).

use std::collections::HashMap;

use anyhow::bail;
use harness::faults::Restartable;
use harness::{MariaDb, Persistence, Postgres, Redis, SentinelGroup, ZooKeeper, ZooKeeperHosts};

/// A lock backend of the worker (`--backend`).
pub use fencelock::Backend;

/// The running services one backend needs. Shared by the scenarios of that
/// backend (each scenario uses its own page, hence its own lock name).
pub struct Services {
    pub backend: Backend,
    /// One instance for `redis`, three for `redlock`.
    pub redis: Vec<Redis>,
    pub zookeeper: Option<Zk>,
    pub sentinel: Option<SentinelGroup>,
    /// The lease table's own server, when it has one ([`Services::start_owned`]).
    postgres: Option<Postgres>,
    mariadb: Option<MariaDb>,
    lease_url: Option<String>,
}

/// The ZooKeeper service of a run.
pub enum Zk {
    /// One server (`--zookeeper-standalone`).
    Standalone(ZooKeeper),
    /// Three servers on three network namespaces (the default).
    Ensemble(ZooKeeperHosts),
}

impl Zk {
    pub async fn start(standalone: bool) -> Self {
        if standalone {
            Zk::Standalone(ZooKeeper::start().await)
        } else {
            Zk::Ensemble(ZooKeeperHosts::start().await)
        }
    }

    pub fn connect_string(&self) -> String {
        match self {
            Zk::Standalone(z) => z.connect_string(),
            Zk::Ensemble(e) => e.connect_string(),
        }
    }

    pub fn ports(&self) -> Vec<u16> {
        match self {
            Zk::Standalone(z) => vec![z.port()],
            Zk::Ensemble(e) => e.ports(),
        }
    }

    /// The ensemble, for the rows that need one.
    pub fn ensemble(&mut self) -> anyhow::Result<&mut ZooKeeperHosts> {
        match self {
            Zk::Ensemble(e) => Ok(e),
            Zk::Standalone(_) => {
                anyhow::bail!(
                    "this row needs the three-node ensemble (run without --zookeeper-standalone)"
                )
            }
        }
    }
}

/// The whole service: every server of the ensemble.
impl Restartable for Zk {
    fn crash(&mut self) {
        match self {
            Zk::Standalone(z) => z.crash(),
            Zk::Ensemble(e) => e.crash(),
        }
    }

    async fn recover(&mut self) -> anyhow::Result<()> {
        match self {
            Zk::Standalone(z) => z.recover().await,
            Zk::Ensemble(e) => e.recover().await,
        }
    }
}

impl Services {
    /// The services of `backend`; ZooKeeper as the three-node ensemble.
    pub async fn start(backend: Backend) -> Self {
        Self::start_with(backend, false).await
    }

    /// `zookeeper_standalone`: one ZooKeeper server instead of the ensemble.
    /// The lease tables live on the shared database servers.
    pub async fn start_with(backend: Backend, zookeeper_standalone: bool) -> Self {
        let mut me = Self::empty(backend);
        match backend {
            Backend::Redis => me.redis.push(Redis::start().await),
            Backend::Redlock => {
                for _ in 0..3 {
                    me.redis.push(Redis::start().await);
                }
            }
            Backend::RedisSentinel => me.sentinel = Some(SentinelGroup::start().await),
            Backend::Zookeeper => me.zookeeper = Some(Zk::start(zookeeper_standalone).await),
            Backend::LeasePostgres => me.lease_url = Some(harness::fresh_database().await),
            Backend::LeaseMysql => me.lease_url = Some(harness::fresh_mysql_database().await),
        }
        me
    }

    /// Services of its own, to be killed and restarted as a whole (the
    /// soak): Redis with `appendfsync always` (a Redis that forgets its
    /// counter is the separate, deliberately stuck row `redis-restart`), a
    /// PostgreSQL or MariaDB server for the lease table. Fenced backends
    /// with one service only.
    pub async fn start_owned(backend: Backend, zookeeper_standalone: bool) -> anyhow::Result<Self> {
        let mut me = Self::empty(backend);
        match backend {
            Backend::Redis => me
                .redis
                .push(Redis::start_with(Persistence::AofAlways).await),
            Backend::Zookeeper => {
                if !zookeeper_standalone && !harness::netns::available() {
                    bail!(
                        "the ZooKeeper ensemble runs in network namespaces, which need \
                         root and `unshare`; run as root or pass --zookeeper-standalone"
                    );
                }
                me.zookeeper = Some(Zk::start(zookeeper_standalone).await)
            }
            Backend::LeasePostgres => {
                let pg = Postgres::start().await;
                me.lease_url = Some(pg.create_database().await);
                me.postgres = Some(pg);
            }
            Backend::LeaseMysql => {
                let db = MariaDb::start().await;
                me.lease_url = Some(db.create_database().await);
                me.mariadb = Some(db);
            }
            Backend::Redlock => bail!("Redlock mints no token: there is nothing to fence"),
            Backend::RedisSentinel => {
                bail!("the Sentinel group is not one service (see the sentinel-failover rows)")
            }
        }
        Ok(me)
    }

    fn empty(backend: Backend) -> Self {
        Self {
            backend,
            redis: vec![],
            zookeeper: None,
            sentinel: None,
            postgres: None,
            mariadb: None,
            lease_url: None,
        }
    }

    /// Whether this is ZooKeeper on the three-node ensemble.
    pub fn is_ensemble(&self) -> bool {
        matches!(self.zookeeper, Some(Zk::Ensemble(_)))
    }

    /// The ensemble, if this is ZooKeeper on three servers.
    pub fn ensemble(&mut self) -> Option<&mut ZooKeeperHosts> {
        match self.zookeeper.as_mut()? {
            Zk::Ensemble(e) => Some(e),
            Zk::Standalone(_) => None,
        }
    }

    /// The TCP ports of the lock servers (what a delay proxy sits in front of).
    pub fn ports(&self) -> Vec<u16> {
        match self.backend {
            Backend::Redis | Backend::Redlock => self.redis.iter().map(Redis::port).collect(),
            Backend::Zookeeper => self.zookeeper.iter().flat_map(Zk::ports).collect(),
            // The workers reach the master through the sentinels' answers:
            // a proxy in front of the sentinels would not delay the lock.
            Backend::RedisSentinel => vec![],
            Backend::LeasePostgres | Backend::LeaseMysql => self
                .lease_url
                .as_deref()
                .and_then(url_port)
                .into_iter()
                .collect(),
        }
    }

    /// The gateway's issuer for this backend's tokens (`Fencing-Issuer` name
    /// and URL): the very server the workers take their locks from (for the
    /// ensemble: all three). `None` for Redlock, which mints no token.
    pub fn issuer(&self) -> Option<(String, String)> {
        let url = match self.backend {
            Backend::Redis => self.redis.first()?.url(),
            Backend::Redlock => return None,
            Backend::Zookeeper => format!(
                "zookeeper://{}",
                self.zookeeper.as_ref().map(Zk::connect_string)?
            ),
            Backend::RedisSentinel => {
                let group = self.sentinel.as_ref()?;
                format!(
                    "redis-sentinel://{}/{}",
                    group.sentinel_addrs().join(","),
                    group.master_name()
                )
            }
            Backend::LeasePostgres | Backend::LeaseMysql => self.lease_url.clone()?,
        };
        Some((self.backend.name().to_string(), url))
    }

    /// The worker flags that select this backend. `via` maps a server port to
    /// the port the worker should use instead (a delay proxy), if any; `pin`
    /// names the one ensemble server the worker may use (`None`: all three).
    pub fn worker_args(&self, via: &HashMap<u16, u16>, pin: Option<usize>) -> Vec<String> {
        let map = |url: String, port: u16| match via.get(&port) {
            Some(p) => harness::proxy::via_proxy(&url, port, *p),
            None => url,
        };
        let mut args = vec!["--backend".to_string(), self.backend.name().to_string()];
        let mut flag = |name: &str, value: String| args.extend([name.to_string(), value]);
        match self.backend {
            Backend::Redis => {
                let r = &self.redis[0];
                flag("--redis-url", map(r.url(), r.port()));
            }
            Backend::Redlock => {
                let urls: Vec<String> = self.redis.iter().map(|r| map(r.url(), r.port())).collect();
                flag("--redlock-urls", urls.join(","));
            }
            Backend::Zookeeper => {
                let zk = self.zookeeper.as_ref().expect("zookeeper started");
                let connect = match (zk, pin) {
                    (Zk::Ensemble(e), Some(i)) => e.connect_string_to(i),
                    _ => zk.connect_string(),
                };
                let connect = zk.ports().into_iter().fold(connect, map);
                flag("--zookeeper-connect", connect);
            }
            Backend::RedisSentinel => {
                let group = self.sentinel.as_ref().expect("sentinel group started");
                flag("--redis-sentinels", group.sentinel_addrs().join(","));
                flag("--redis-sentinel-master", group.master_name().to_string());
            }
            Backend::LeasePostgres | Backend::LeaseMysql => {
                let url = self.lease_url.clone().expect("lease db created");
                let port = url_port(&url).unwrap_or(0);
                let name = if self.backend == Backend::LeasePostgres {
                    "--database-url"
                } else {
                    "--mysql-url"
                };
                flag(name, map(url, port));
            }
        }
        args
    }
}

/// Every server the backend owns (the shared lease databases stay up).
impl Restartable for Services {
    fn crash(&mut self) {
        self.redis.iter_mut().for_each(Redis::crash);
        self.zookeeper.iter_mut().for_each(Zk::crash);
        self.postgres.iter_mut().for_each(Postgres::crash);
        self.mariadb.iter_mut().for_each(MariaDb::crash);
    }

    async fn recover(&mut self) -> anyhow::Result<()> {
        for r in &mut self.redis {
            r.recover().await?;
        }
        if let Some(z) = self.zookeeper.as_mut() {
            z.recover().await?;
        }
        if let Some(p) = self.postgres.as_mut() {
            p.recover().await?;
        }
        if let Some(m) = self.mariadb.as_mut() {
            m.recover().await?;
        }
        Ok(())
    }
}

/// The port of `scheme://user@host:PORT/db` or `host:PORT`.
pub fn url_port(url: &str) -> Option<u16> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    host_port.rsplit_once(':')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::url_port;

    #[test]
    fn ports_are_found_in_every_url_shape() {
        assert_eq!(
            url_port("postgres://postgres@127.0.0.1:5433/t_x"),
            Some(5433)
        );
        assert_eq!(url_port("mysql://root@127.0.0.1:3307/db?x=1"), Some(3307));
        assert_eq!(url_port("redis://127.0.0.1:6380/"), Some(6380));
        assert_eq!(url_port("127.0.0.1:2181"), Some(2181));
    }
}
