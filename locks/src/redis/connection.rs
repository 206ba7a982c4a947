//! The kept connection to the lock's server: where connections come from
//! (one fixed server, or the master Sentinel names), reconnecting once for
//! all callers, and forgetting a connection that broke, stopped answering,
//! leads to a demoted master, or was abandoned mid-request.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, RedisResult, ScriptInvocation};

#[cfg(feature = "redis-sentinel")]
use super::discovery::Discovery;
use super::pending::{answered, unanswered};
use crate::LockError;

/// How long connecting (and the first PING) may take before we say unavailable.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Backstop for any reply; each operation also has its own shorter deadline.
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where connections come from: one fixed server, or (feature
/// `redis-sentinel`) the master that the sentinels name at connect time.
pub(super) enum Source {
    Fixed(Client),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(Discovery),
}

impl Source {
    /// A new multiplexed connection; errors name `issuer`.
    async fn connect(
        &self,
        config: &AsyncConnectionConfig,
        issuer: &str,
    ) -> Result<MultiplexedConnection, LockError> {
        match self {
            Source::Fixed(client) => tokio::time::timeout(
                CONNECT_TIMEOUT,
                client.get_multiplexed_async_connection_with_config(config),
            )
            .await
            .map_err(|_| LockError::unavailable(issuer, "connect timed out"))?
            .map_err(|e| LockError::unavailable(issuer, e)),
            #[cfg(feature = "redis-sentinel")]
            Source::Sentinel(discovery) => discovery
                .master_connection(config)
                .await
                .map_err(|e| LockError::unavailable(issuer, e)),
        }
    }

    /// A client for the waiters' pub/sub connection.
    pub(super) async fn pubsub_client(&self) -> Result<Client, String> {
        match self {
            Source::Fixed(client) => Ok(client.clone()),
            #[cfg(feature = "redis-sentinel")]
            Source::Sentinel(discovery) => discovery.master_client().await,
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Fixed(client) => write!(f, "{}", client.get_connection_info().addr),
            #[cfg(feature = "redis-sentinel")]
            Source::Sentinel(discovery) => write!(f, "{discovery}"),
        }
    }
}

/// A connection being made, for every caller that waits for it.
type Connecting = Shared<BoxFuture<'static, Result<MultiplexedConnection, LockError>>>;

/// The server a lock service talks to, and the one connection it keeps.
pub(super) struct Server {
    source: Arc<Source>,
    /// `redis`, or `redis-sentinel`: what every lease and error names.
    pub(super) issuer: &'static str,
    config: AsyncConnectionConfig,
    /// The live connection; `None` after it broke, until the next call reconnects.
    conn: Mutex<Option<MultiplexedConnection>>,
    /// The connection being made, once for all callers, in a task of its
    /// own: a caller that gives up (the gateway asks an issuer for at most
    /// 500 ms) does not cancel it, and the next caller takes it over.
    /// Otherwise a server that takes longer to connect to than every caller
    /// waits (a slow name lookup or handshake) could never be reached again.
    connecting: Mutex<Option<Connecting>>,
}

impl Server {
    pub(super) fn new(source: Source, issuer: &'static str) -> Server {
        Server {
            source: Arc::new(source),
            issuer,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(CONNECT_TIMEOUT)
                .set_response_timeout(RESPONSE_TIMEOUT),
            conn: Mutex::new(None),
            connecting: Mutex::new(None),
        }
    }

    pub(super) fn source(&self) -> &Source {
        &self.source
    }

    /// The live connection, reconnecting (once for all callers) if it broke.
    pub(super) async fn connection(&self) -> Result<MultiplexedConnection, LockError> {
        if let Some(c) = self.conn.lock().expect("redis conn mutex").clone() {
            return Ok(c);
        }
        let connecting = {
            let mut slot = self.connecting.lock().expect("redis connecting mutex");
            // Another caller may have kept a fresh connection since the check
            // above (it does so under this lock): use it, make none more.
            if let Some(c) = self.conn.lock().expect("redis conn mutex").clone() {
                return Ok(c);
            }
            slot.get_or_insert_with(|| {
                let (source, config, issuer) =
                    (self.source.clone(), self.config.clone(), self.issuer);
                let task = tokio::spawn(async move { source.connect(&config, issuer).await });
                async move {
                    task.await.unwrap_or_else(|e| {
                        Err(LockError::unavailable(issuer, format!("connecting: {e}")))
                    })
                }
                .boxed()
                .shared()
            })
            .clone()
        };
        let made = connecting.clone().await;
        // The first caller back keeps the connection (or, after a failure,
        // lets the next call try afresh).
        let mut slot = self.connecting.lock().expect("redis connecting mutex");
        if slot.as_ref().is_some_and(|s| s.ptr_eq(&connecting)) {
            *slot = None;
            if let Ok(c) = &made {
                *self.conn.lock().expect("redis conn mutex") = Some(c.clone());
            }
        }
        made
    }

    /// Map a driver error, forgetting the connection if it is broken, timed
    /// out, or leads to a server that is no longer the master (`READONLY`:
    /// demoted by a failover): the next call reconnects, through the
    /// sentinels when there are any.
    ///
    /// A server that does not let this client in (`NOAUTH`: no user given
    /// where the `default` user is off; a wrong password) is `Unavailable`
    /// too: the operator may be setting up its users, so callers retry.
    pub(super) fn failed(&self, e: RedisError) -> LockError {
        let demoted = e.kind() == ErrorKind::ReadOnly;
        let not_let_in = e.kind() == ErrorKind::AuthenticationFailed || e.code() == Some("NOAUTH");
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_unrecoverable_error()
            || e.is_timeout()
            || demoted
        {
            self.forget();
        }
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.is_unrecoverable_error()
            || demoted
            || not_let_in
        {
            LockError::unavailable(self.issuer, e)
        } else {
            LockError::protocol(self.issuer, e)
        }
    }

    /// Drop the connection; the next call opens a new one.
    pub(super) fn forget(&self) {
        *self.conn.lock().expect("redis conn mutex") = None;
    }

    /// The answer to `request`, sent on the kept connection, within `limit`
    /// (`Err` when none came; the driver's own error is the caller's to map).
    ///
    /// No answer in time forgets the connection: a server that stopped
    /// answering (frozen, partitioned) keeps the socket open, so reconnect
    /// next time instead of waiting on it. So does a request whose caller
    /// gives up on it first (the gateway asks an issuer for at most 500 ms,
    /// and drops the lookup then): otherwise a connection that stopped
    /// answering would stay in place for every later request, each of them
    /// abandoned in turn before anything notices. After a `docker compose
    /// restart redis`, the gateway answered `issuer_unavailable` to every
    /// check until it was restarted.
    pub(super) async fn answer<T>(
        &self,
        what: &str,
        limit: Duration,
        request: impl Future<Output = RedisResult<T>>,
    ) -> Result<RedisResult<T>, LockError> {
        let pending = unanswered(|| self.forget());
        let answer = tokio::time::timeout(limit, request).await;
        answered(pending);
        match answer {
            Err(_) => {
                self.forget();
                Err(LockError::unavailable(
                    self.issuer,
                    format!("{what}: no reply within {limit:?}"),
                ))
            }
            Ok(answer) => Ok(answer),
        }
    }

    /// Run one script within `limit` (at least 100 ms): a reply later than the
    /// TTL is useless anyway, and the watchdog must get control back.
    pub(super) async fn run<T: redis::FromRedisValue>(
        &self,
        limit: Duration,
        script: ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        let mut conn = self.connection().await?;
        let limit = limit.max(Duration::from_millis(100));
        self.answer("script", limit, script.invoke_async(&mut conn))
            .await?
            .map_err(|e| self.failed(e))
    }
}
