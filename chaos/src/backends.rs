//! The five lock backends as real services, and the worker flags that reach them.

use std::collections::HashMap;
use std::fmt;

use harness::{MariaDb, Redis, ZooKeeper};

/// A lock backend of the worker (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    Redis,
    Redlock,
    Zookeeper,
    LeasePostgres,
    LeaseMysql,
}

impl Backend {
    pub const ALL: [Backend; 5] = [
        Backend::Redis,
        Backend::Redlock,
        Backend::Zookeeper,
        Backend::LeasePostgres,
        Backend::LeaseMysql,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::Redlock => "redlock",
            Backend::Zookeeper => "zookeeper",
            Backend::LeasePostgres => "lease-postgres",
            Backend::LeaseMysql => "lease-mysql",
        }
    }

    /// Whether grants carry a fencing token. Redlock's do not: it has no
    /// counter that all nodes agree on, so it appears only with the fence off.
    pub fn fenced(self) -> bool {
        self != Backend::Redlock
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The running services one backend needs. Shared by the scenarios of that
/// backend (each scenario uses its own page, hence its own lock name).
pub struct Services {
    pub backend: Backend,
    /// One instance for `redis`, three for `redlock`.
    pub redis: Vec<Redis>,
    pub zookeeper: Option<ZooKeeper>,
    /// Keeps the private MariaDB alive when one was started (unused today:
    /// the shared one from `harness::fresh_mysql_database` is used).
    pub mariadb: Option<MariaDb>,
    lease_url: Option<String>,
}

impl Services {
    pub async fn start(backend: Backend) -> Self {
        let mut me = Self {
            backend,
            redis: vec![],
            zookeeper: None,
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
            Backend::Zookeeper => me.zookeeper = Some(ZooKeeper::start().await),
            Backend::LeasePostgres => me.lease_url = Some(harness::fresh_database().await),
            Backend::LeaseMysql => me.lease_url = Some(harness::fresh_mysql_database().await),
        }
        me
    }

    /// The TCP ports of the lock servers (what a delay proxy sits in front of).
    pub fn ports(&self) -> Vec<u16> {
        match self.backend {
            Backend::Redis | Backend::Redlock => self.redis.iter().map(Redis::port).collect(),
            Backend::Zookeeper => self.zookeeper.iter().map(ZooKeeper::port).collect(),
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
            Some(p) => crate::proxy::via_proxy(&url, port, *p),
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
                args.push((
                    "--zookeeper-connect".into(),
                    map(zk.connect_string(), zk.port()),
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
