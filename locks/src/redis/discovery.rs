//! Finding the master through Redis Sentinel, each step within a short
//! deadline (see the sentinel module, "Finding the master, following a
//! failover"). Errors are plain text: the caller names its issuer.

use std::fmt;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client};

use crate::LockError;

/// Deadline of each step of master discovery (connect, ask, check `ROLE`).
const STEP_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a holder lookup waits for the other sentinels' answers after the
/// first one ([`Discovery::freshest_master`]): a sentinel that answers at
/// all answers in well under a millisecond here, and a frozen one must not
/// hold up a storage that waits at most 500 ms for the whole lookup.
const FRESHEST_GRACE: Duration = Duration::from_millis(50);

/// Where the sentinels are and which master they watch.
#[derive(Debug, Clone)]
pub(super) struct Discovery {
    sentinels: Vec<String>,
    master_name: String,
}

impl fmt::Display for Discovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "master {:?} via sentinels {}",
            self.master_name,
            self.sentinels.join(",")
        )
    }
}

impl Discovery {
    /// The sentinels (`host:port` each; entries may also be comma-separated
    /// lists) watching master `master_name`. `InvalidConfig` for a malformed
    /// list or an empty name.
    pub(super) fn new(sentinels: &[String], master_name: &str) -> Result<Discovery, LockError> {
        let sentinels = parse_sentinels(sentinels)?;
        if master_name.trim().is_empty() {
            return Err(LockError::InvalidConfig(
                "sentinel master name is empty".into(),
            ));
        }
        Ok(Discovery {
            sentinels,
            master_name: master_name.trim().to_string(),
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

    /// The master's address and its `config-epoch` as `sentinel` names them
    /// (`SENTINEL MASTER`).
    async fn master_epoch(&self, sentinel: &str) -> Result<(u64, String), String> {
        let mut conn = connect(sentinel, &step_config()).await?;
        let fields: Vec<String> = step(
            redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(&self.master_name)
                .query_async(&mut conn),
        )
        .await?;
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
    /// sentinel is asked at once, and of the answers that come within
    /// [`FRESHEST_GRACE`] of the first, the one with the highest
    /// `config-epoch` wins (on a tie, the sentinel listed first). A sentinel
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
            .map(|(i, s)| async move { (i, self.master_epoch(s).await) })
            .collect();
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
                    deadline.get_or_insert(tokio::time::Instant::now() + FRESHEST_GRACE);
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
        let mut conn = connect(sentinel, &step_config()).await?;
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
                    return Client::open(format!("redis://{addr}/")).map_err(|e| e.to_string())
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
        let mut conn = connect(&addr, config)
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

/// A new connection to `addr` (`host:port`, a sentinel or a master),
/// within [`STEP_TIMEOUT`].
pub(super) async fn connect(
    addr: &str,
    config: &AsyncConnectionConfig,
) -> Result<MultiplexedConnection, String> {
    let client = Client::open(format!("redis://{addr}/")).map_err(|e| format!("{addr}: {e}"))?;
    step(client.get_multiplexed_async_connection_with_config(config))
        .await
        .map_err(|e| format!("{addr}: {e}"))
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

/// Check `host:port` entries (no scheme): what `REDIS_SENTINELS` holds.
fn parse_sentinels(sentinels: &[String]) -> Result<Vec<String>, LockError> {
    let list: Vec<String> = sentinels
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    if list.is_empty() {
        return Err(LockError::InvalidConfig(
            "no sentinel given (host:port list)".into(),
        ));
    }
    for s in &list {
        let ok = s
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !ok {
            return Err(LockError::InvalidConfig(format!(
                "sentinel {s:?} is not host:port"
            )));
        }
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_lists_are_host_port_entries() {
        let list = parse_sentinels(&["127.0.0.1:26379, s2:26380".into(), "s3:1".into()]);
        assert_eq!(
            list,
            Ok(vec![
                "127.0.0.1:26379".to_string(),
                "s2:26380".into(),
                "s3:1".into()
            ])
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
}
