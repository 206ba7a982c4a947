//! Finding the master through Redis Sentinel, each step within a short
//! deadline (see the sentinel module, "Finding the master, following a
//! failover"), authenticated as one ACL user on the sentinels and the
//! master when the sentinel list names one. Errors are plain text, never
//! with the password: the caller names its issuer.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo,
    RedisConnectionInfo,
};

use super::pending::{answered, unanswered};
use crate::LockError;

/// Deadline of each step of master discovery (connect, ask, check `ROLE`).
const STEP_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a holder lookup waits at least for the other sentinels'
/// answers after the first one ([`Discovery::freshest_master`]); it waits
/// longer when the first answer itself was slow (see there). A frozen
/// sentinel must not hold up a storage that waits at most 500 ms for the
/// whole lookup.
const FRESHEST_GRACE: Duration = Duration::from_millis(50);

/// An ACL user (or the `default` one, when only a password is given) and
/// its password. `Debug` shows the user only.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Credentials {
    username: Option<String>,
    password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:***", self.username.as_deref().unwrap_or(""))
    }
}

impl Credentials {
    /// `user:password` (or `:password`), percent-encoded as in a URL's
    /// userinfo. Errors do not repeat it.
    fn parse(userinfo: &str) -> Result<Credentials, LockError> {
        let bad = |why: &str| {
            LockError::InvalidConfig(format!(
                "sentinel credentials {:?}: {why}",
                crate::redact_url(&format!("{userinfo}@"))
            ))
        };
        // The same decoding as REDIS_URL's userinfo.
        let info = format!("redis://{userinfo}@sentinel:1/")
            .into_connection_info()
            .map_err(|_| bad("not user:password (percent-encode special characters)"))?;
        let password = info
            .redis
            .password
            .ok_or_else(|| bad("no password (user:password@host:port)"))?;
        Ok(Credentials {
            username: info.redis.username,
            password,
        })
    }
}

/// Where the sentinels are, which master they watch, and as whom to ask.
#[derive(Debug, Clone)]
pub(super) struct Discovery {
    sentinels: Vec<String>,
    master_name: String,
    /// For the sentinels and the master alike; `None`: anonymous.
    credentials: Option<Credentials>,
    /// A connection kept per sentinel for the lookups.
    kept: Kept,
}

/// One connection per sentinel, in the list's order, kept between holder
/// lookups: each lookup asks every sentinel, and a new connection each
/// time (name resolution, TCP, `AUTH`) took more than the storage's 500 ms
/// on a loaded machine, so the lookup failed closed. A connection whose
/// request fails, times out or is abandoned is forgotten; the next lookup
/// connects anew.
#[derive(Clone, Default)]
struct Kept(Arc<Vec<tokio::sync::Mutex<Option<MultiplexedConnection>>>>);

impl fmt::Debug for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} kept sentinel connections", self.0.len())
    }
}

impl fmt::Display for Discovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "master {:?} via sentinels {}",
            self.master_name,
            self.sentinels.join(",")
        )?;
        match &self.credentials {
            Some(Credentials {
                username: Some(user),
                ..
            }) => write!(f, " as {user:?}"),
            _ => Ok(()),
        }
    }
}

impl Discovery {
    /// The sentinels (`[user:password@]host:port` each; entries may also be
    /// comma-separated lists) watching master `master_name`. Credentials
    /// on any entry are those of every sentinel and of the master.
    /// `InvalidConfig` for a malformed list, two different credentials or
    /// an empty name.
    pub(super) fn new(sentinels: &[String], master_name: &str) -> Result<Discovery, LockError> {
        let (sentinels, credentials) = parse_sentinels(sentinels)?;
        if master_name.trim().is_empty() {
            return Err(LockError::InvalidConfig(
                "sentinel master name is empty".into(),
            ));
        }
        let kept = Kept(Arc::new(
            sentinels
                .iter()
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
        ));
        Ok(Discovery {
            sentinels,
            master_name: master_name.trim().to_string(),
            credentials,
            kept,
        })
    }

    /// A connection to the server the sentinels name as master now, checked
    /// with `ROLE`; every sentinel's answer when none leads to a master.
    pub(super) async fn master_connection(
        &self,
        config: &AsyncConnectionConfig,
    ) -> Result<MultiplexedConnection, String> {
        let mut failures = vec![];
        for sentinel in &self.sentinels {
            match self.master_via(sentinel, config).await {
                Ok(conn) => return Ok(conn),
                Err(e) => failures.push(format!("{sentinel}: {e}")),
            }
        }
        Err(format!(
            "no sentinel led to a master {:?}: {}",
            self.master_name,
            failures.join("; ")
        ))
    }

    /// The master's address and its `config-epoch` as the `i`th sentinel
    /// names them (`SENTINEL MASTER`), on its kept connection.
    async fn master_epoch(&self, i: usize) -> Result<(u64, String), String> {
        let kept = &self.kept.0[i];
        let cached = kept.lock().await.clone();
        let mut conn = match cached {
            Some(conn) => conn,
            None => {
                let conn = self.connect(&self.sentinels[i], &step_config()).await?;
                *kept.lock().await = Some(conn.clone());
                conn
            }
        };
        // Abandoned before its answer (the storage gave up): forget the
        // connection, which may have stopped answering.
        let pending = unanswered(|| {
            if let Ok(mut k) = kept.try_lock() {
                *k = None;
            }
        });
        let asked = step(
            redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(&self.master_name)
                .query_async::<Vec<String>>(&mut conn),
        )
        .await;
        answered(pending);
        let fields = match asked {
            Ok(fields) => fields,
            Err(e) => {
                *kept.lock().await = None;
                return Err(e);
            }
        };
        let field = |name: &str| {
            fields
                .chunks(2)
                .find(|kv| kv.len() == 2 && kv[0] == name)
                .map(|kv| kv[1].clone())
                .ok_or_else(|| format!("SENTINEL MASTER has no {name:?}"))
        };
        let epoch = field("config-epoch")?
            .parse::<u64>()
            .map_err(|e| format!("config-epoch: {e}"))?;
        Ok((epoch, format!("{}:{}", field("ip")?, field("port")?)))
    }

    /// The master's `host:port` as the best-informed sentinel names it: every
    /// sentinel is asked at once, and of the answers that come soon after the
    /// first, the one with the highest `config-epoch` wins (on a tie, the
    /// sentinel listed first). "Soon" is [`FRESHEST_GRACE`], or twice as long
    /// as the first answer took if that is more: on a loaded machine every
    /// answer is slow, and a 50 ms grace once missed the one sentinel that
    /// knew of a failover, so the lookup went to the old, frozen master and
    /// failed closed. Never past [`STEP_TIMEOUT`] from the start. A sentinel
    /// that has not heard of a failover yet (they learn it from each other's
    /// hello messages, every 2 s) still names the old master with the old
    /// epoch; asking only the first that answers, a storage's lookup went
    /// there and failed closed (the old master frozen) right after a client
    /// had been granted the lock by the new one. Only a failover that a
    /// majority of sentinels voted for raises the epoch, so the highest one
    /// names the newest master. A sentinel that does not answer within the
    /// grace is not waited for.
    pub(super) async fn freshest_master(&self) -> Result<String, String> {
        let mut asked: FuturesUnordered<_> = self
            .sentinels
            .iter()
            .enumerate()
            .map(|(i, _)| async move { (i, self.master_epoch(i).await) })
            .collect();
        let started = tokio::time::Instant::now();
        let mut best: Option<(u64, usize, String)> = None;
        let mut failures = vec![];
        let mut deadline = None;
        loop {
            let next = match deadline {
                None => asked.next().await,
                Some(at) => match tokio::time::timeout_at(at, asked.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
            };
            let Some((i, answer)) = next else { break };
            match answer {
                Ok((epoch, addr)) => {
                    deadline.get_or_insert_with(|| {
                        let grace = FRESHEST_GRACE.max(started.elapsed() * 2);
                        (tokio::time::Instant::now() + grace).min(started + STEP_TIMEOUT)
                    });
                    let better = best
                        .as_ref()
                        .is_none_or(|(e, j, _)| epoch > *e || (epoch == *e && i < *j));
                    if better {
                        best = Some((epoch, i, addr));
                    }
                }
                Err(e) => failures.push(format!("{}: {e}", self.sentinels[i])),
            }
        }
        best.map(|(_, _, addr)| addr)
            .ok_or_else(|| failures.join("; "))
    }

    /// The master's address as `sentinel` names it.
    async fn master_addr(&self, sentinel: &str) -> Result<String, String> {
        let mut conn = self.connect(sentinel, &step_config()).await?;
        let addr: Option<(String, u16)> = step(
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.master_name)
                .query_async(&mut conn),
        )
        .await?;
        let (host, port) =
            addr.ok_or_else(|| format!("does not monitor a master named {:?}", self.master_name))?;
        Ok(format!("{host}:{port}"))
    }

    /// A client for the server the first answering sentinel names as the
    /// master (for the pub/sub connection of waiters; a `PUBLISH` on the
    /// master also reaches subscribers of its replicas, so a stale answer
    /// costs nothing but a fallback poll).
    pub(super) async fn master_client(&self) -> Result<Client, String> {
        let mut failures = vec![];
        for sentinel in &self.sentinels {
            match self.master_addr(sentinel).await {
                Ok(addr) => {
                    return Client::open(self.connection_info(&addr)?).map_err(|e| e.to_string())
                }
                Err(e) => failures.push(format!("{sentinel}: {e}")),
            }
        }
        Err(failures.join("; "))
    }

    async fn master_via(
        &self,
        sentinel: &str,
        config: &AsyncConnectionConfig,
    ) -> Result<MultiplexedConnection, String> {
        let addr = self.master_addr(sentinel).await?;
        let mut conn = self
            .connect(&addr, config)
            .await
            .map_err(|e| format!("master {e}"))?;
        let role: Vec<redis::Value> = step(redis::cmd("ROLE").query_async(&mut conn))
            .await
            .map_err(|e| format!("master {addr}: ROLE: {e}"))?;
        let role = role_of(&role);
        if role != "master" {
            return Err(format!(
                "named {addr}, which is a {role:?}, not the master (failover in progress?)"
            ));
        }
        Ok(conn)
    }
}

/// What every discovery step connects with: [`STEP_TIMEOUT`] for the
/// connection and each reply.
pub(super) fn step_config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(STEP_TIMEOUT)
        .set_response_timeout(STEP_TIMEOUT)
}

impl Discovery {
    /// How to reach `addr` (`host:port`, a sentinel or a master) as this
    /// discovery's user.
    fn connection_info(&self, addr: &str) -> Result<ConnectionInfo, String> {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .ok_or_else(|| format!("{addr:?} is not host:port"))?;
        let credentials = self.credentials.clone();
        Ok(ConnectionInfo {
            addr: ConnectionAddr::Tcp(host.to_string(), port),
            redis: RedisConnectionInfo {
                username: credentials.as_ref().and_then(|c| c.username.clone()),
                password: credentials.map(|c| c.password),
                ..RedisConnectionInfo::default()
            },
        })
    }

    /// A new connection to `addr` (`host:port`, a sentinel or a master),
    /// authenticated, within [`STEP_TIMEOUT`].
    pub(super) async fn connect(
        &self,
        addr: &str,
        config: &AsyncConnectionConfig,
    ) -> Result<MultiplexedConnection, String> {
        let client =
            Client::open(self.connection_info(addr)?).map_err(|e| format!("{addr}: {e}"))?;
        step(client.get_multiplexed_async_connection_with_config(config))
            .await
            .map_err(|e| format!("{addr}: {e}"))
    }
}

/// One discovery step within [`STEP_TIMEOUT`].
pub(super) async fn step<T>(
    fut: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(STEP_TIMEOUT, fut).await {
        Err(_) => Err(format!("no answer within {STEP_TIMEOUT:?}")),
        Ok(r) => r.map_err(|e| e.to_string()),
    }
}

/// The role a `ROLE` reply names (`master`, `slave`, `sentinel`).
pub(super) fn role_of(reply: &[redis::Value]) -> String {
    reply
        .first()
        .and_then(|v| redis::from_redis_value::<String>(v).ok())
        .unwrap_or_default()
}

/// Check `[user:password@]host:port` entries (no scheme): what
/// `REDIS_SENTINELS` holds. The `host:port` of each, and the credentials
/// (the same on every entry that gives them).
fn parse_sentinels(sentinels: &[String]) -> Result<(Vec<String>, Option<Credentials>), LockError> {
    let mut list = vec![];
    let mut credentials: Option<Credentials> = None;
    let entries = sentinels
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty());
    for entry in entries {
        let addr = match entry.rsplit_once('@') {
            Some((userinfo, addr)) => {
                let given = Credentials::parse(userinfo)?;
                if credentials.as_ref().is_some_and(|c| *c != given) {
                    return Err(LockError::InvalidConfig(
                        "the sentinel list gives two different credentials: give them once, \
                         they are used for every sentinel and for the master"
                            .into(),
                    ));
                }
                credentials = Some(given);
                addr
            }
            None => entry,
        };
        let ok = addr
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !ok {
            return Err(LockError::InvalidConfig(format!(
                "sentinel {:?} is not [user:password@]host:port",
                crate::redact_url(entry)
            )));
        }
        list.push(addr.to_string());
    }
    if list.is_empty() {
        return Err(LockError::InvalidConfig(
            "no sentinel given (host:port list)".into(),
        ));
    }
    Ok((list, credentials))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_lists_are_host_port_entries() {
        let list = parse_sentinels(&["127.0.0.1:26379, s2:26380".into(), "s3:1".into()]);
        assert_eq!(
            list,
            Ok((
                vec![
                    "127.0.0.1:26379".to_string(),
                    "s2:26380".into(),
                    "s3:1".into()
                ],
                None
            ))
        );
        assert!(matches!(
            parse_sentinels(&["redis://x".into()]),
            Err(LockError::InvalidConfig(_))
        ));
        assert!(matches!(
            parse_sentinels(&[" ".into()]),
            Err(LockError::InvalidConfig(_))
        ));
    }

    #[test]
    fn credentials_in_the_list_hold_for_every_sentinel_and_never_show() {
        let worker = Some(Credentials {
            username: Some("worker".into()),
            password: "p@ss:w/rd".into(),
        });
        let (list, credentials) =
            parse_sentinels(&["worker:p%40ss%3Aw%2Frd@s1:1,s2:2".into()]).unwrap();
        assert_eq!(
            (list, &credentials),
            (vec!["s1:1".into(), "s2:2".into()], &worker)
        );
        let discovery = Discovery::new(&["worker:p%40ss%3Aw%2Frd@s1:1".into()], "m").unwrap();
        for shown in [format!("{discovery}"), format!("{discovery:?}")] {
            assert!(shown.contains("worker") && !shown.contains("ss"), "{shown}");
        }
        let info = discovery.connection_info("m1:6379").unwrap();
        assert_eq!(info.redis.username.as_deref(), Some("worker"));
        assert_eq!(info.redis.password.as_deref(), Some("p@ss:w/rd"));
        let (_, default_user) = parse_sentinels(&[":secret@s1:1".into()]).unwrap();
        assert_eq!(default_user.and_then(|c| c.username), None);
        for (list, said) in [
            ("a:pw1@s1:1,b:pw2@s2:2", "two different credentials"),
            ("worker@s1:1", "no password"),
            ("worker:secret@s1", "host:port"),
        ] {
            let e = parse_sentinels(&[list.into()]).unwrap_err().to_string();
            assert!(e.contains(said), "{list}: {e}");
            assert!(!e.contains("pw1") && !e.contains("secret"), "{e}");
        }
    }
}
