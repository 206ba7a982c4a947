//! The lock backends as real services, and the worker flags that reach them.
//!
//! ZooKeeper runs as a three-node ensemble by default, each server on its
//! own network namespace so that it can be partitioned
//! ([`harness::ZooKeeperHosts`]; needs root); `--zookeeper-standalone` gives
//! the single server of the earlier tables. `redis-sentinel` is a master, one
//! replica and three sentinels ([`harness::SentinelGroup`]).

use std::collections::HashMap;

use harness::{MariaDb, Redis, SentinelGroup, ZooKeeper, ZooKeeperHosts};

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
    /// Keeps the private MariaDB alive when one was started (unused today:
    /// the shared one from `harness::fresh_mysql_database` is used).
    pub mariadb: Option<MariaDb>,
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

    /// Kill every server (the whole service down).
    pub fn kill_all(&mut self) {
        match self {
            Zk::Standalone(z) => z.kill(),
            Zk::Ensemble(e) => (0..e.len()).for_each(|i| e.kill(i)),
        }
    }

    /// Start every server again and wait until the service serves.
    pub async fn start_all_again(&mut self) {
        match self {
            Zk::Standalone(z) => z.start_again().await,
            Zk::Ensemble(e) => {
                for i in 0..e.len() {
                    e.process(i).start().expect("restart zookeeper server");
                }
                e.wait_serving(std::time::Duration::from_secs(60)).await;
            }
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

impl Services {
    /// The services of `backend`; ZooKeeper as the three-node ensemble.
    pub async fn start(backend: Backend) -> Self {
        Self::start_with(backend, false).await
    }

    /// `zookeeper_standalone`: one ZooKeeper server instead of the ensemble.
    pub async fn start_with(backend: Backend, zookeeper_standalone: bool) -> Self {
        let mut me = Self {
            backend,
            redis: vec![],
            zookeeper: None,
            sentinel: None,
            mariadb: None,
            lease_url: None,
        };
        match backend {
            Backend::Redis => me.redis.push(Redis::start().await),
            Backend::Redlock => {
                for _ in 0..3 {
                    me.redis.push(Redis::start().await);
                }
            }
            Backend::RedisSentinel => me.sentinel = Some(SentinelGroup::start().await),
            Backend::Zookeeper if zookeeper_standalone => {
                me.zookeeper = Some(Zk::Standalone(ZooKeeper::start().await))
            }
            Backend::Zookeeper => me.zookeeper = Some(Zk::Ensemble(ZooKeeperHosts::start().await)),
            Backend::LeasePostgres => me.lease_url = Some(harness::fresh_database().await),
            Backend::LeaseMysql => me.lease_url = Some(harness::fresh_mysql_database().await),
        }
        me
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
    /// and URL): the very server the workers take their locks from. `None`
    /// for Redlock, which mints no token.
    pub fn issuer(&self) -> Option<(String, String)> {
        match self.backend {
            Backend::Redis => Some(("redis".into(), self.redis[0].url())),
            Backend::Redlock => None,
            Backend::Zookeeper => {
                let zk = self.zookeeper.as_ref().expect("zookeeper started");
                Some((
                    "zookeeper".into(),
                    format!("zookeeper://{}", zk.connect_string()),
                ))
            }
            Backend::RedisSentinel => {
                let group = self.sentinel.as_ref().expect("sentinel group started");
                Some((
                    "redis-sentinel".into(),
                    format!(
                        "redis-sentinel://{}/{}",
                        group.sentinel_addrs().join(","),
                        group.master_name()
                    ),
                ))
            }
            Backend::LeasePostgres => Some((
                "lease-postgres".into(),
                self.lease_url.clone().expect("lease db created"),
            )),
            Backend::LeaseMysql => Some((
                "lease-mysql".into(),
                self.lease_url.clone().expect("lease db created"),
            )),
        }
    }

    /// The worker flags that select this backend. `via` maps a server port to
    /// the port the worker should use instead (a delay proxy), if any.
    pub fn worker_args(&self, via: &HashMap<u16, u16>) -> Vec<(String, String)> {
        let map = |url: String, port: u16| match via.get(&port) {
            Some(p) => harness::proxy::via_proxy(&url, port, *p),
            None => url,
        };
        let mut args = vec![("--backend".to_string(), self.backend.name().to_string())];
        match self.backend {
            Backend::Redis => {
                let r = &self.redis[0];
                args.push(("--redis-url".into(), map(r.url(), r.port())));
            }
            Backend::Redlock => {
                let urls: Vec<String> = self.redis.iter().map(|r| map(r.url(), r.port())).collect();
                args.push(("--redlock-urls".into(), urls.join(",")));
            }
            Backend::Zookeeper => {
                let zk = self.zookeeper.as_ref().expect("zookeeper started");
                let mut connect = zk.connect_string();
                for port in zk.ports() {
                    connect = map(connect, port);
                }
                args.push(("--zookeeper-connect".into(), connect));
            }
            Backend::RedisSentinel => {
                let group = self.sentinel.as_ref().expect("sentinel group started");
                args.push(("--redis-sentinels".into(), group.sentinel_addrs().join(",")));
                args.push((
                    "--redis-sentinel-master".into(),
                    group.master_name().to_string(),
                ));
            }
            Backend::LeasePostgres | Backend::LeaseMysql => {
                let url = self.lease_url.clone().expect("lease db created");
                let port = url_port(&url).unwrap_or(0);
                let flag = if self.backend == Backend::LeasePostgres {
                    "--database-url"
                } else {
                    "--mysql-url"
                };
                args.push((flag.into(), map(url, port)));
            }
        }
        args
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
