//! The lock services the gateway trusts, asked before every fenced access
//! whether the token is current: the storage's half of Chubby's
//! `CheckSequencer`, through [`fencelock::HolderLookup`].
//!
//! An issuer is configured as `NAME=URL`; `NAME` is the `Fencing-Issuer`
//! value its tokens arrive with, the URL's scheme picks the backend. Each
//! issuer is connected in the background, with retries, so the gateway starts
//! (and serves everything else) while a lock service is still down; until it
//! is connected, and whenever a lookup fails or is slower than the issuer
//! timeout, requests fenced by it are answered 503 `issuer_unavailable`
//! (fail closed). Once connected, the backends reconnect by themselves (Redis
//! reconnects its connection, ZooKeeper its session, the lease tables their
//! pools), so the gateway recovers without a restart.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use fencelock::lease_table::{LeaseTable, LeaseTableOptions};
use fencelock::redis::RedisLock;
use fencelock::redis_sentinel::RedisSentinelLock;
use fencelock::zookeeper::{self, Access, ZooKeeperLock};
use fencelock::{Backend, Holder, HolderLookup, LockError, LockState};
use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use fencelock::{redact_url, scrub_secrets};

/// Default for `--issuer-timeout`.
pub const DEFAULT_ISSUER_TIMEOUT: Duration = Duration::from_millis(500);

/// Default for `--max-token-jump`: 2^20. A Redis lock's counter counts its
/// grants; a page whose fence is a million grants behind its lock is not
/// one that honest writers left behind.
pub const DEFAULT_MAX_TOKEN_JUMP: u64 = 1 << 20;

/// The ZooKeeper session timeout the gateway asks for (its lookups are reads;
/// the session only needs to outlive short disconnects).
const ZOOKEEPER_SESSION: Duration = Duration::from_secs(10);
/// Connections of a lease table's pool, for lookups only.
const LEASE_TABLE_CONNECTIONS: u32 = 4;
/// How long one connection attempt may take in the background.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(5);
/// Longest pause between connection attempts.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

/// The lock name a page's writers hold: `page:<id>`.
pub fn lock_name(page: &str) -> String {
    format!("page:{page}")
}

/// One configured issuer: `NAME=URL`.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuerSpec {
    pub name: String,
    pub url: String,
    /// Picked by the URL's scheme: `redis://host:port[/db]`;
    /// `zookeeper://[user:password@]host:port[,host:port...]` (or `zk://`:
    /// with a user, the lookups read as that digest user);
    /// `redis-sentinel://[user:password@]host:port[,host:port...]/MASTER`
    /// (or `sentinel://`: the sentinels and the name of the master they
    /// watch; the lookup asks whichever server they name as master now, and
    /// logs in to the sentinels and the master as that user); `postgres://` (or
    /// `postgresql://`) and `mysql://` (or `mariadb://`): the lease table
    /// `fencelock_leases`. Never Redlock, which mints no token.
    pub backend: Backend,
}

impl IssuerSpec {
    /// Whether its tokens count the grants of one lock and nothing
    /// enforces who writes that count but the lock's clients themselves
    /// (Redis, Redis Sentinel): then a token far above the page's fence is
    /// refused as a suspected forgery. Not ZooKeeper (a zxid jumps by 2^32
    /// at each leader election) nor the lease tables (their database lets
    /// clients write a lease only through the recipe's functions).
    pub fn bounds_jumps(&self) -> bool {
        matches!(self.backend, Backend::Redis | Backend::RedisSentinel)
    }
}

impl fmt::Debug for IssuerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, redact_url(&self.url))
    }
}

/// Whether `name` can be a `Fencing-Issuer` value: `[a-z0-9._:-]{1,64}`.
pub fn valid_issuer_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b':' | b'-')
        })
}

impl FromStr for IssuerSpec {
    type Err = String;

    /// `NAME=URL`. Errors show the URL without its password.
    fn from_str(s: &str) -> Result<Self, String> {
        let Some((name, url)) = s.trim().split_once('=') else {
            return Err(format!(
                "issuer {:?}: expected NAME=URL, e.g. redis=redis://127.0.0.1:6379",
                redact_url(s)
            ));
        };
        let (name, url) = (name.trim(), url.trim());
        if !valid_issuer_name(name) {
            return Err(format!(
                "issuer name {name:?}: must match [a-z0-9._:-]{{1,64}} (it is the Fencing-Issuer value)"
            ));
        }
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        let backend = match scheme.as_deref() {
            Some("redis") => Backend::Redis,
            Some("zookeeper") | Some("zk") => Backend::Zookeeper,
            Some("redis-sentinel") | Some("sentinel") => Backend::RedisSentinel,
            Some("postgres") | Some("postgresql") => Backend::LeasePostgres,
            Some("mysql") | Some("mariadb") => Backend::LeaseMysql,
            Some("redlock") => Backend::Redlock,
            _ => {
                return Err(format!(
                    "issuer {name:?}: its URL must start with redis://, zookeeper://, \
                     redis-sentinel://, postgres:// or mysql://"
                ))
            }
        };
        if !backend.mints_tokens() {
            return Err(format!(
                "issuer {name:?}: Redlock cannot be an issuer: it mints no fencing token \
                 (its leases are unfenced), so there is nothing to check a token against"
            ));
        }
        if backend == Backend::Zookeeper {
            zookeeper::parse_url(url).map_err(|e| format!("issuer {name:?}: {e}"))?;
        }
        if backend == Backend::RedisSentinel {
            let (sentinels, master) = sentinel_parts(url);
            if sentinels.is_empty() || master.is_empty() {
                return Err(format!(
                    "issuer {name:?}: redis-sentinel://host:port[,host:port...]/MASTER needs \
                     at least one sentinel and the master's name"
                ));
            }
        }
        Ok(IssuerSpec {
            name: name.to_owned(),
            url: url.to_owned(),
            backend,
        })
    }
}

/// `redis-sentinel://a:26379,b:26379/mymaster` to (`[a:26379, b:26379]`,
/// `mymaster`); with `user:password@` before the hosts, that userinfo
/// starts each entry (fencelock's form: the sentinels and the master are
/// all logged in to as that user).
fn sentinel_parts(url: &str) -> (Vec<String>, &str) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    // The userinfo ends at the last `@`: its password may hold `/` or `,`.
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((userinfo, rest)) => (format!("{userinfo}@"), rest),
        None => (String::new(), rest),
    };
    let (hosts, master) = rest.split_once('/').unwrap_or((rest, ""));
    let sentinels = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{userinfo}{h}"))
        .collect();
    (sentinels, master.trim_matches('/').trim())
}

async fn connect(spec: &IssuerSpec) -> Result<Arc<dyn HolderLookup>, LockError> {
    // The issuer's login may only read the lease table (`gateway setup`
    // grants it SELECT): the lookup's own select, nothing created.
    let lease_table = LeaseTableOptions::default()
        .max_connections(LEASE_TABLE_CONNECTIONS)
        .read_only(true);
    Ok(match spec.backend {
        Backend::Redis => Arc::new(RedisLock::connect(&spec.url).await?),
        // One lookup finds the holder of either variant (the fair queue's
        // head, or the non-fair lock's fixed node): fencelock's lookup.
        // With a user in the URL, the session reads as that digest user
        // (the gateway's own, which the lock nodes' ACLs let read).
        Backend::Zookeeper => {
            let (hosts, user) = zookeeper::parse_url(&spec.url)?;
            let access = user.map_or_else(Access::open, Access::reader);
            Arc::new(ZooKeeperLock::connect_with(&hosts, ZOOKEEPER_SESSION, &access).await?)
        }
        Backend::RedisSentinel => {
            let (sentinels, master) = sentinel_parts(&spec.url);
            Arc::new(RedisSentinelLock::connect(&sentinels, master).await?)
        }
        Backend::LeasePostgres => {
            Arc::new(LeaseTable::postgres_with(&spec.url, lease_table).await?)
        }
        Backend::LeaseMysql => Arc::new(LeaseTable::mysql_with(&spec.url, lease_table).await?),
        // Refused when the spec was parsed.
        Backend::Redlock => {
            return Err(LockError::InvalidConfig(
                "Redlock cannot be an issuer: it mints no fencing token".into(),
            ))
        }
    })
}

/// Why an issuer could not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// Not connected yet (down at start, or still connecting).
    NotConnected { last_error: Option<String> },
    /// No answer within the issuer timeout.
    TimedOut(Duration),
    /// The lock service answered with an error.
    Failed(String),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NotConnected { last_error: None } => write!(f, "not connected yet"),
            Unavailable::NotConnected {
                last_error: Some(e),
            } => write!(f, "not connected yet: {e}"),
            Unavailable::TimedOut(d) => write!(f, "no answer within {d:?}"),
            Unavailable::Failed(e) => write!(f, "{e}"),
        }
    }
}

#[derive(Clone)]
enum Connection {
    Connecting {
        last_error: Option<String>,
    },
    Ready(Arc<dyn HolderLookup>),
    /// The URL can never work (malformed): no more attempts.
    Broken(String),
}

/// One issuer, connected in the background.
pub struct Issuer {
    spec: IssuerSpec,
    state: watch::Receiver<Connection>,
    task: JoinHandle<()>,
}

impl Drop for Issuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Issuer {
    /// Start connecting to `spec` in the background (needs a tokio runtime).
    fn start(spec: IssuerSpec) -> Self {
        let (tx, rx) = watch::channel(Connection::Connecting { last_error: None });
        let task = tokio::spawn(keep_connecting(spec.clone(), tx));
        Issuer {
            spec,
            state: rx,
            task,
        }
    }

    pub fn spec(&self) -> &IssuerSpec {
        &self.spec
    }

    /// Whether the background connection has been made.
    pub fn is_connected(&self) -> bool {
        matches!(*self.state.borrow(), Connection::Ready(_))
    }

    /// Who holds `lock` right now, asked within `timeout` (waiting, within
    /// that same bound, for the first connection if it is being made).
    pub async fn current_holder(
        &self,
        lock: &str,
        timeout: Duration,
    ) -> Result<Option<Holder>, Unavailable> {
        self.ask(timeout, |lookup| {
            Box::pin(async move { lookup.current_holder(lock).await })
        })
        .await
    }

    /// Who holds `lock` and, where the issuer says so in the same answer,
    /// the highest token it minted for it ([`HolderLookup::state`]); asked
    /// as [`Issuer::current_holder`] is.
    pub async fn state(&self, lock: &str, timeout: Duration) -> Result<LockState, Unavailable> {
        self.ask(timeout, |l| Box::pin(async move { l.state(lock).await }))
            .await
    }

    /// Ask `question` of the connected lookup within `timeout` (waiting,
    /// within that same bound, for the first connection if it is being
    /// made), e.g. [`HolderLookup::minted`]. Errors are scrubbed of the
    /// issuer's URL and its secrets (a library's message may quote the URL
    /// it was given).
    pub async fn ask<'a, T>(
        &self,
        timeout: Duration,
        question: impl FnOnce(Arc<dyn HolderLookup>) -> BoxFuture<'a, Result<T, LockError>>,
    ) -> Result<T, Unavailable> {
        let mut state = self.state.clone();
        let url = self.spec.url.as_str();
        let ask = async {
            let connection = state
                .wait_for(|c| !matches!(c, Connection::Connecting { .. }))
                .await
                .map(|c| c.clone());
            match connection {
                Ok(Connection::Ready(lookup)) => question(lookup)
                    .await
                    .map_err(|e| Unavailable::Failed(scrub_secrets(&e.to_string(), url))),
                Ok(Connection::Broken(e)) => Err(Unavailable::Failed(e)),
                // The connecting task is gone (the gateway is shutting down).
                Ok(Connection::Connecting { .. }) | Err(_) => {
                    Err(Unavailable::NotConnected { last_error: None })
                }
            }
        };
        match tokio::time::timeout(timeout, ask).await {
            Ok(answer) => answer,
            Err(_) => match &*self.state.borrow() {
                Connection::Connecting { last_error } => Err(Unavailable::NotConnected {
                    last_error: last_error.clone(),
                }),
                _ => Err(Unavailable::TimedOut(timeout)),
            },
        }
    }
}

/// Connect, retrying with a growing pause until it works; log the first
/// failure and the success (not every retry).
async fn keep_connecting(spec: IssuerSpec, tx: watch::Sender<Connection>) {
    let mut delay = Duration::from_millis(100);
    let mut failures = 0_u64;
    loop {
        let started = Instant::now();
        let result = match tokio::time::timeout(CONNECT_ATTEMPT, connect(&spec)).await {
            Ok(r) => r,
            Err(_) => Err(LockError::unavailable(
                spec.backend.name(),
                format!("connecting took longer than {CONNECT_ATTEMPT:?}"),
            )),
        };
        // The library's messages may quote the URL: scrubbed before they
        // are logged or kept.
        let url = redact_url(&spec.url);
        match result {
            Ok(lookup) => {
                tracing::info!(issuer = %spec.name, %url, after_failures = failures, "connected to issuer");
                tx.send_replace(Connection::Ready(lookup));
                return;
            }
            Err(LockError::InvalidConfig(e)) => {
                let e = scrub_secrets(&e, &spec.url);
                tracing::error!(issuer = %spec.name, "issuer URL is unusable, requests it fences will be answered 503: {e}");
                tx.send_replace(Connection::Broken(format!("misconfigured: {e}")));
                return;
            }
            Err(e) => {
                let e = scrub_secrets(&e.to_string(), &spec.url);
                failures += 1;
                if failures == 1 {
                    tracing::warn!(issuer = %spec.name, %url, error = %e, "issuer not reachable yet; requests it fences are answered 503 until it is (retrying)");
                } else {
                    tracing::debug!(issuer = %spec.name, error = %e, failures, "issuer still not reachable");
                }
                tx.send_replace(Connection::Connecting {
                    last_error: Some(e),
                });
            }
        }
        tokio::time::sleep_until(started + delay).await;
        delay = (delay * 2).min(MAX_RETRY_DELAY);
    }
}

/// Every configured issuer, by `Fencing-Issuer` name.
pub struct Issuers {
    by_name: BTreeMap<String, Issuer>,
    timeout: Duration,
    /// See [`Issuers::max_token_jump`].
    max_token_jump: Option<u64>,
}

impl fmt::Debug for Issuers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issuers")
            .field(
                "issuers",
                &self.by_name.values().map(|i| &i.spec).collect::<Vec<_>>(),
            )
            .field("timeout", &self.timeout)
            .field("max_token_jump", &self.max_token_jump)
            .finish()
    }
}

impl Issuers {
    /// No issuer: tokens are not checked with anybody.
    pub fn none() -> Self {
        Issuers {
            by_name: BTreeMap::new(),
            timeout: DEFAULT_ISSUER_TIMEOUT,
            max_token_jump: Some(DEFAULT_MAX_TOKEN_JUMP),
        }
    }

    /// Start connecting to each (needs a tokio runtime). Names must be
    /// unique. `max_token_jump` 0: no bound.
    pub fn start(
        specs: &[IssuerSpec],
        timeout: Duration,
        max_token_jump: u64,
    ) -> Result<Self, String> {
        let mut by_name = BTreeMap::new();
        for spec in specs {
            if by_name.contains_key(&spec.name) {
                return Err(format!("issuer {:?} is configured twice", spec.name));
            }
            by_name.insert(spec.name.clone(), Issuer::start(spec.clone()));
        }
        Ok(Issuers {
            by_name,
            timeout,
            max_token_jump: (max_token_jump > 0).then_some(max_token_jump),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How far above a page's fence a token of an issuer that
    /// [`IssuerSpec::bounds_jumps`] may be; `None`: unbounded.
    pub fn max_token_jump(&self) -> Option<u64> {
        self.max_token_jump
    }

    pub fn get(&self, name: &str) -> Option<&Issuer> {
        self.by_name.get(name)
    }

    /// The configured names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.by_name.keys().cloned().collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Issuer> {
        self.by_name.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issuer_specs_pick_their_backend_by_scheme() {
        for (spec, backend) in [
            ("redis=redis://r:6379", Backend::Redis),
            ("zk=zk://zk1:2181", Backend::Zookeeper),
            ("rs=sentinel://s1:26379/mymaster", Backend::RedisSentinel),
            ("lp=postgresql://u@db/pages", Backend::LeasePostgres),
            ("lease-mysql=mysql://root@m/locks", Backend::LeaseMysql),
            ("lm=mariadb://root@m/locks", Backend::LeaseMysql),
        ] {
            let parsed: IssuerSpec = spec.parse().unwrap();
            assert_eq!(parsed.backend, backend, "{spec}");
        }
        let spec: IssuerSpec = "zookeeper=zookeeper://zk1:2181,zk2:2181/".parse().unwrap();
        assert_eq!(spec.backend, Backend::Zookeeper);
        let (hosts, user) = zookeeper::parse_url(&spec.url).unwrap();
        assert_eq!((hosts.as_str(), user), ("zk1:2181,zk2:2181", None));
        let spec: IssuerSpec = "zookeeper=zookeeper://gateway:s%40cret@zk1:2181,zk2:2181/"
            .parse()
            .unwrap();
        let (hosts, user) = zookeeper::parse_url(&spec.url).unwrap();
        assert_eq!(hosts, "zk1:2181,zk2:2181");
        assert_eq!(user, Some("gateway:s@cret".parse().unwrap()));
        assert!(!format!("{spec:?}").contains("cret"), "{spec:?}");
        let spec: IssuerSpec = "lease-postgres=postgres://u:secret@db/pages"
            .parse()
            .unwrap();
        assert_eq!(spec.backend, Backend::LeasePostgres);
        assert!(!format!("{spec:?}").contains("secret"));
        let spec: IssuerSpec = "zookeeper=zookeeper://u:pw@zk1:2181".parse().unwrap();
        let (hosts, user) = zookeeper::parse_url(&spec.url).unwrap();
        assert_eq!(
            (hosts.as_str(), user),
            ("zk1:2181", Some("u:pw".parse().unwrap()))
        );
        let spec: IssuerSpec = "rs=redis-sentinel://:pw@s1:26379/mymaster".parse().unwrap();
        assert_eq!(
            sentinel_parts(&spec.url),
            (vec![":pw@s1:26379".into()], "mymaster")
        );
        let spec: IssuerSpec = "redis-sentinel=redis-sentinel://s1:26379,s2:26379/mymaster"
            .parse()
            .unwrap();
        assert_eq!(spec.backend, Backend::RedisSentinel);
        assert_eq!(
            sentinel_parts(&spec.url),
            (vec!["s1:26379".to_string(), "s2:26379".into()], "mymaster")
        );
        let spec: IssuerSpec = "rs=redis-sentinel://gateway:p%2Fw@d@s1:26379,s2:26379/mymaster"
            .parse()
            .unwrap();
        assert_eq!(
            sentinel_parts(&spec.url),
            (
                vec![
                    "gateway:p%2Fw@d@s1:26379".to_string(),
                    "gateway:p%2Fw@d@s2:26379".into()
                ],
                "mymaster"
            )
        );
        assert!(!format!("{spec:?}").contains("p%2F"), "{spec:?}");
    }

    #[test]
    fn redlock_and_unknown_schemes_are_refused_with_the_reason() {
        for (spec, said) in [
            ("redlock=redlock://a:6379", "mints no fencing token"),
            ("x=http://a", "must start with"),
            ("Redis=redis://a", "[a-z0-9._:-]"),
            ("rs=redis-sentinel://s1:26379", "master's name"),
            ("rs=redis-sentinel:///mymaster", "at least one sentinel"),
            ("zk=zookeeper:///", "names no server"),
            ("zk=zookeeper://gateway@zk1:2181/", "needs a password"),
            ("redis", "NAME=URL"),
        ] {
            let e = spec.parse::<IssuerSpec>().unwrap_err();
            assert!(e.contains(said), "{spec}: {e}");
        }
        let e = "lp=postgres:/u:pw@x".parse::<IssuerSpec>().unwrap_err();
        assert!(!e.contains("pw"), "{e}");
    }
}
