//! The connection pool requests use: tokio-postgres connections, each
//! request's statement in ONE round trip, and connections that are known to
//! be alive when they are handed out.
//!
//! Why its own pool, and why tokio-postgres rather than sqlx (which still runs
//! the migrations, see [`crate::migrate`]):
//! - one round trip per statement: sqlx 0.8's `PgPool` pings every connection
//!   when it goes back to the pool (a second round trip per request); here a
//!   connection goes back as it is. Statements are prepared once per
//!   connection ([`Sql`]), like pgbench's `-M prepared`.
//! - a connection whose server vanished without closing it (a half-open TCP
//!   connection: a crashed host, a failover, a dropped NAT entry) must not
//!   hang requests. sqlx 0.8 cannot set TCP keepalive; tokio-postgres can:
//!   - **liveness on reuse, where it is cheap**: a connection idle for longer
//!     than [`PoolOptions::check_after_idle`] is pinged (one Sync) before it is
//!     handed out, within [`PoolOptions::ping_timeout`]; a busy connection is
//!     reused without a ping. One that fails is closed and the next is tried.
//!   - **a maximum lifetime** ([`PoolOptions::max_lifetime`]): older
//!     connections are closed instead of reused, so that none outlives a
//!     change on the server side (failover, configuration) for long.
//!   - **TCP keepalive and a TCP user timeout**: the kernel probes an idle
//!     connection and gives up on one whose peer stopped answering, so a
//!     statement waiting on a dead server fails instead of waiting forever.
//!   - a connect timeout, all of it within [`PoolOptions::acquire_timeout`]:
//!     a request that cannot get a live connection in time is answered 503.
//! - A connection whose last use failed, or was abandoned midway, is closed,
//!   never reused. After a PostgreSQL restart, idle connections older than
//!   the idle check are replaced before use; younger ones fail one request
//!   each (503) and are replaced.
//!
//! # Several servers: following the primary
//! `DATABASE_URL` may name several servers the way libpq does,
//! `postgres://user@host1:5432,host2:5432/pages?target_session_attrs=read-write`
//! (sqlx 0.8, which runs the migrations, does not parse that form, so
//! [`parse_url`] does). A new connection then tries the servers in turn,
//! starting with the one that last worked, and keeps the first whose
//! `transaction_read_only` is `off` (tokio-postgres asks it, as libpq does):
//! the primary. After a failover the old primary's connections fail one
//! request each (503) or their liveness check, and are dropped; their
//! replacements land on the promoted standby. While no server accepts writes
//! (the primary is gone and nothing is promoted yet) every request that needs
//! a new connection is a 503, and so is `/readyz`, so a balancer stops sending
//! traffic here. A statement refused because the server is read-only
//! (SQLSTATE 25006: a single-host URL that points at a standby) is a 503 too,
//! and drops its connection.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_postgres::config::TargetSessionAttrs;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Connection, NoTls, Row, Socket, Statement};

/// Why a database call failed: [`DbError::Unavailable`] is answered 503 (retry
/// later), [`DbError::Failed`] 500 (a bug: an SQL error, a protocol error, a
/// value of an unexpected type).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DbError {
    /// PostgreSQL cannot be reached or is going away: no connection in time,
    /// connection refused or broken, no server that accepts writes (with
    /// `target_session_attrs=read-write`), SQLSTATE class 08 (connection), 53
    /// (insufficient resources) or 57 (operator intervention: shutdown), or
    /// 25006 (read-only transaction: the server is a standby, not the primary).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// Anything else: the statement or the conversation with the server is wrong.
    #[error("database error: {0}")]
    Failed(String),
    /// The caller withdrew before the statement was sent (its request was
    /// already answered): nothing was sent.
    #[error("not sent: the request was given up before its statement was sent")]
    NotSent,
}

impl DbError {
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DbError::Unavailable(_))
    }

    fn of(e: &tokio_postgres::Error) -> Self {
        if let Some(db) = e.as_db_error() {
            let code = db.code().code();
            if code == "25006" {
                return DbError::Unavailable(format!(
                    "the database server is read-only (a standby, not the primary): {} ({code})",
                    db.message()
                ));
            }
            return if ["08", "53", "57"].iter().any(|c| code.starts_with(c)) {
                DbError::Unavailable(format!("{} ({code})", db.message()))
            } else {
                DbError::Failed(format!("{} ({code})", db.message()))
            };
        }
        let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
        if e.is_closed() || io {
            DbError::Unavailable(e.to_string())
        } else {
            DbError::Failed(e.to_string())
        }
    }
}

/// A statement the gateway runs: prepared once per connection, on first use,
/// with its parameter types given (so a parameter a statement does not use
/// needs no type inference).
#[derive(Debug)]
pub struct Sql {
    pub text: &'static str,
    pub types: &'static [Type],
}

/// Default of [`PoolOptions::max_waiting`] (`--db-max-waiting`).
pub const DEFAULT_MAX_WAITING: u32 = 128;

/// How the pool treats its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// Most PostgreSQL connections open at once (`--db-pool-size`).
    pub max_connections: u32,
    /// Longest a request waits for a live connection (a free one, pinged if
    /// it was idle, or a new one) before it is answered 503.
    pub acquire_timeout: Duration,
    /// Most requests waiting for a connection while all are taken; one
    /// more is answered 503 at once (load shedding) instead of waiting
    /// `acquire_timeout` in a queue that cannot drain in time.
    pub max_waiting: u32,
    /// Longest one connection attempt may take (TCP, startup, authentication).
    pub connect_timeout: Duration,
    /// A connection idle for longer than this is pinged before it is reused.
    pub check_after_idle: Duration,
    /// How long that ping may take before the connection is given up.
    pub ping_timeout: Duration,
    /// Connections older than this are closed rather than reused.
    pub max_lifetime: Duration,
    /// TCP keepalive: first probe after this much silence on the connection...
    pub keepalive_idle: Duration,
    /// ...then one probe per interval...
    pub keepalive_interval: Duration,
    /// ...and the connection is dropped after this many unanswered probes.
    pub keepalive_retries: u32,
    /// Sent data unacknowledged for this long drops the connection
    /// (`TCP_USER_TIMEOUT`).
    pub tcp_user_timeout: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            max_connections: crate::DEFAULT_POOL_SIZE,
            acquire_timeout: Duration::from_secs(2),
            max_waiting: DEFAULT_MAX_WAITING,
            connect_timeout: Duration::from_secs(2),
            check_after_idle: Duration::from_secs(5),
            ping_timeout: Duration::from_secs(1),
            max_lifetime: Duration::from_secs(30 * 60),
            keepalive_idle: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(2),
            keepalive_retries: 3,
            tcp_user_timeout: Duration::from_secs(15),
        }
    }
}

/// The pool; cheap to clone, shared by all handlers.
#[derive(Clone)]
pub struct Db {
    inner: Arc<Inner>,
}

struct Inner {
    /// One entry per server of the URL, in its order.
    targets: Vec<Target>,
    /// `target_session_attrs=read-write`: only a server that accepts writes will do.
    read_write: bool,
    /// The target that gave the last good connection: tried first.
    preferred: AtomicUsize,
    options: PoolOptions,
    idle: Mutex<Vec<Idle>>,
    permits: Arc<Semaphore>,
    /// Requests in [`Db::acquire`] now, served or waiting.
    acquiring: AtomicUsize,
}

/// One request counted in [`Inner::acquiring`] until dropped.
struct Acquiring<'a>(&'a AtomicUsize);

impl Drop for Acquiring<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One server to connect to.
struct Target {
    /// `host:port`, for logs and errors.
    name: String,
    /// Everything tokio-postgres needs, with the pool's socket options and,
    /// with `read-write`, the check that the server accepts writes.
    config: tokio_postgres::Config,
    /// This server's own URL (the multi-host URL cut down to it), for
    /// [`Db::writable_target`]; `None` for a libpq `key=value` string.
    url: Option<String>,
}

struct Idle {
    conn: PgConn,
    since: Instant,
}

/// One PostgreSQL connection with its prepared statements.
struct PgConn {
    client: Client,
    prepared: Vec<(&'static str, Statement)>,
    born: Instant,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl Db {
    /// A pool for `database_url` (`postgres://user:password@host:port/db`,
    /// several `host:port` separated by commas to follow the primary (see the
    /// module docs), or libpq's `key=value` form). Connects lazily: nothing is
    /// opened here.
    pub fn new(database_url: &str, options: PoolOptions) -> Result<Self, DbError> {
        let bad = |e: String| DbError::Failed(format!("database URL: {e}"));
        let (targets, read_write) = if database_url.contains("://") {
            let (urls, read_write) = split_url(database_url).map_err(bad)?;
            let targets = urls
                .into_iter()
                .map(|url| {
                    let mut config: tokio_postgres::Config =
                        url.parse().map_err(|e| bad(format!("{e}")))?;
                    if read_write {
                        config.target_session_attrs(TargetSessionAttrs::ReadWrite);
                    }
                    Ok(Target::new(config, Some(url), options))
                })
                .collect::<Result<Vec<_>, DbError>>()?;
            (targets, read_write)
        } else {
            // libpq's key=value form: one target; with several hosts,
            // tokio-postgres tries them in order itself.
            let config: tokio_postgres::Config =
                database_url.parse().map_err(|e| bad(format!("{e}")))?;
            let read_write = config.get_target_session_attrs() == TargetSessionAttrs::ReadWrite;
            (vec![Target::new(config, None, options)], read_write)
        };
        Ok(Self {
            inner: Arc::new(Inner {
                targets,
                read_write,
                preferred: AtomicUsize::new(0),
                options,
                idle: Mutex::new(Vec::new()),
                permits: Arc::new(Semaphore::new(options.max_connections.max(1) as usize)),
                acquiring: AtomicUsize::new(0),
            }),
        })
    }

    /// [`Db::new`] with `max_connections` and the default checks.
    pub fn from_url(database_url: &str, max_connections: u32) -> Result<Self, DbError> {
        Self::new(
            database_url,
            PoolOptions {
                max_connections,
                ..PoolOptions::default()
            },
        )
    }

    /// sqlx's connect options (for the migration connection, see
    /// [`crate::connect`]) of a server that takes our connections now: with
    /// `read-write`, the primary, after trying the servers like a new
    /// connection does.
    pub async fn writable_target(&self) -> Result<PgConnectOptions, DbError> {
        let i = if self.inner.targets.len() == 1 && !self.inner.read_write {
            0
        } else {
            let limit = self.inner.options.acquire_timeout;
            let (client, connection, i) = tokio::time::timeout(limit, self.inner.open())
                .await
                .map_err(|_| {
                DbError::Unavailable(format!("no database server answered within {limit:?}"))
            })??;
            // Dropping the client ends the connection task with a Terminate.
            tokio::spawn(connection);
            drop(client);
            i
        };
        let url = self.inner.targets[i].url.as_deref().ok_or_else(|| {
            DbError::Failed("the migrations need a postgres:// URL, not key=value".into())
        })?;
        PgConnectOptions::from_str(url).map_err(|e| DbError::Failed(format!("database URL: {e}")))
    }

    pub fn options(&self) -> &PoolOptions {
        &self.inner.options
    }

    /// A live connection, within [`PoolOptions::acquire_timeout`] in all;
    /// 503 at once when [`PoolOptions::max_waiting`] requests wait already.
    pub async fn acquire(&self) -> Result<Conn, DbError> {
        let options = &self.inner.options;
        // With every connection taken, the requests in here all wait.
        let waiting = self.inner.acquiring.fetch_add(1, Ordering::SeqCst);
        let _counted = Acquiring(&self.inner.acquiring);
        if waiting >= options.max_waiting as usize && self.inner.permits.available_permits() == 0 {
            return Err(DbError::Unavailable(format!(
                "{waiting} requests wait for a database connection already"
            )));
        }
        let limit = options.acquire_timeout;
        tokio::time::timeout(limit, self.acquire_inner())
            .await
            .map_err(|_| {
                DbError::Unavailable(format!("no live database connection within {limit:?}"))
            })?
    }

    async fn acquire_inner(&self) -> Result<Conn, DbError> {
        let permit = self
            .inner
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| DbError::Unavailable("the pool is closed".into()))?;
        let options = &self.inner.options;
        // Most recently used first: busy connections are reused without a
        // ping, and the ones left idle at the bottom age out.
        loop {
            let Some(Idle { conn, since }) = self.inner.idle.lock().expect("idle list").pop()
            else {
                break;
            };
            if conn.client.is_closed() || conn.born.elapsed() > options.max_lifetime {
                continue; // dropped: its connection task ends and closes the socket
            }
            if since.elapsed() > options.check_after_idle {
                let ping =
                    tokio::time::timeout(options.ping_timeout, conn.client.check_connection());
                if !matches!(ping.await, Ok(Ok(()))) {
                    tracing::info!("an idle database connection did not answer a ping: closed");
                    continue;
                }
            }
            return Ok(self.checked_out(conn, permit));
        }
        // Made in a task of its own: a request that gives up (its deadline)
        // does not throw a connection away half made; it goes to the idle
        // list for the next request. Otherwise a server slower to connect
        // to than every request waits could never be reached again.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let opened = inner.open().await.map(|(client, connection, _)| {
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!("database connection ended: {e}");
                    }
                });
                PgConn {
                    client,
                    prepared: Vec::new(),
                    born: Instant::now(),
                }
            });
            if let Err(Ok(conn)) = tx.send(opened) {
                let mut idle = inner.idle.lock().expect("idle list");
                if !inner.permits.is_closed() && idle.len() < inner.options.max_connections as usize
                {
                    idle.push(Idle {
                        conn,
                        since: Instant::now(),
                    });
                }
            }
        });
        let conn = rx
            .await
            .map_err(|_| DbError::Unavailable("the connecting task ended".into()))??;
        Ok(self.checked_out(conn, permit))
    }

    fn checked_out(&self, conn: PgConn, permit: OwnedSemaphorePermit) -> Conn {
        Conn {
            conn: Some(conn),
            db: self.inner.clone(),
            clean: true,
            _permit: permit,
        }
    }

    /// Close the idle connections and refuse new acquisitions.
    pub fn close(&self) {
        self.inner.permits.close();
        self.inner.idle.lock().expect("idle list").clear();
    }

    /// Connections open and idle right now.
    pub fn idle_connections(&self) -> usize {
        self.inner.idle.lock().expect("idle list").len()
    }
}

impl Target {
    fn new(mut config: tokio_postgres::Config, url: Option<String>, options: PoolOptions) -> Self {
        config
            .connect_timeout(options.connect_timeout)
            .keepalives(true)
            .keepalives_idle(options.keepalive_idle)
            .keepalives_interval(options.keepalive_interval)
            .keepalives_retries(options.keepalive_retries)
            .tcp_user_timeout(options.tcp_user_timeout);
        if config.get_application_name().is_none() {
            config.application_name("gateway");
        }
        let ports = config.get_ports();
        let name = config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                match host {
                    tokio_postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
                    #[cfg(unix)]
                    tokio_postgres::config::Host::Unix(p) => format!("{}:{port}", p.display()),
                }
            })
            .collect::<Vec<_>>()
            .join(",");
        Target { name, config, url }
    }
}

type Opened = (
    Client,
    Connection<Socket, tokio_postgres::tls::NoTlsStream>,
    usize,
);

impl Inner {
    /// A new connection, and the index of the target it went to: the
    /// targets in turn, from the one that last worked; with `read-write`,
    /// tokio-postgres refuses a server whose `transaction_read_only` is on.
    async fn open(&self) -> Result<Opened, DbError> {
        let n = self.targets.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut refused = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let target = &self.targets[i];
            // tokio-postgres's own connect timeout covers the TCP connect
            // only; this one also covers the startup, authentication and
            // read-write exchange.
            let limit = self.options.connect_timeout;
            let error = match tokio::time::timeout(limit, target.config.connect(NoTls)).await {
                Ok(Ok((client, connection))) => {
                    if i != first {
                        tracing::info!(server = %target.name, "database connections now go to {}", target.name);
                    }
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok((client, connection, i));
                }
                Ok(Err(e)) => DbError::of(&e),
                Err(_) => DbError::Unavailable(format!("connecting took longer than {limit:?}")),
            };
            refused.push((target.name.as_str(), error));
        }
        if n == 1 && !self.read_write {
            return Err(refused.pop().expect("one target tried").1);
        }
        let detail = refused
            .iter()
            .map(|(name, e)| format!("{name}: {e}"))
            .collect::<Vec<_>>()
            .join("; ");
        let what = if self.read_write {
            "accepts writes (target_session_attrs=read-write)"
        } else {
            "answers"
        };
        let message = format!("no database server {what}: {detail}");
        // Down, unreachable or read-only: retry later. Only when every server
        // answered with something else (a wrong password, say) is it a 500.
        if refused.iter().any(|(_, e)| e.is_unavailable()) {
            Err(DbError::Unavailable(message))
        } else {
            Err(DbError::Failed(message))
        }
    }
}

/// The servers of a `postgres://` URL, each as a URL of its own, and whether
/// it asks for one that accepts writes. `host1:p1,host2:p2` and
/// `target_session_attrs` (`any`, `read-write`, `primary`) follow libpq; the
/// rest of the URL is kept as it is for each server.
pub(crate) fn split_url(url: &str) -> Result<(Vec<String>, bool), String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "the database URL has no scheme".to_string())?;
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => (&authority[..=i], &authority[i + 1..]),
        None => ("", authority),
    };
    let mut read_write = false;
    let mut params = Vec::new();
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        match pair.split_once('=') {
            Some(("target_session_attrs", "any")) => {}
            Some(("target_session_attrs", "read-write" | "primary")) => read_write = true,
            Some(("target_session_attrs", other)) => {
                return Err(format!(
                    "target_session_attrs={other} is not supported (use read-write or any)"
                ))
            }
            _ if !pair.is_empty() => params.push(pair),
            _ => {}
        }
    }
    let query = if params.is_empty() {
        String::new()
    } else {
        format!("?{}", params.join("&"))
    };
    let urls = hosts
        .split(',')
        .map(|host| format!("{scheme}://{userinfo}{host}{path}{query}"))
        .collect();
    Ok((urls, read_write))
}

/// The servers a `postgres://` URL names, as sqlx connect options, and
/// whether it asks for one that accepts writes (see [`split_url`]).
pub fn parse_url(url: &str) -> Result<(Vec<PgConnectOptions>, bool), sqlx::Error> {
    let (urls, read_write) = split_url(url).map_err(|m| sqlx::Error::Configuration(m.into()))?;
    let targets = urls
        .iter()
        .map(|u| PgConnectOptions::from_str(u))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((targets, read_write))
}

/// A checked-out connection. It goes back to the pool when dropped if every
/// call on it completed and none met a connection-level failure; otherwise it
/// is closed.
pub struct Conn {
    conn: Option<PgConn>,
    db: Arc<Inner>,
    clean: bool,
    _permit: OwnedSemaphorePermit,
}

impl Conn {
    fn conn(&mut self) -> &mut PgConn {
        self.conn.as_mut().expect("present until drop")
    }

    async fn statement(&mut self, sql: &'static Sql) -> Result<Statement, DbError> {
        let conn = self.conn();
        if let Some((_, s)) = conn
            .prepared
            .iter()
            .find(|(text, _)| std::ptr::eq(*text, sql.text))
        {
            return Ok(s.clone());
        }
        let statement = conn
            .client
            .prepare_typed(sql.text, sql.types)
            .await
            .map_err(|e| DbError::of(&e))?;
        conn.prepared.push((sql.text, statement.clone()));
        Ok(statement)
    }

    /// Run `sql`, return its rows. Prepares it first on this connection's
    /// first use of it (one more round trip, once).
    pub async fn query(
        &mut self,
        sql: &'static Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, DbError> {
        // Not clean until the call completes: a call abandoned midway (its
        // future dropped) leaves the connection closed, not reused.
        self.clean = false;
        let result = async {
            let statement = self.statement(sql).await?;
            self.conn()
                .client
                .query(&statement, params)
                .await
                .map_err(|e| DbError::of(&e))
        }
        .await;
        // An SQL error leaves the connection usable; anything else does not.
        self.clean = match &result {
            Ok(_) => true,
            Err(DbError::Failed(_)) => !self.conn().client.is_closed(),
            Err(DbError::Unavailable(_) | DbError::NotSent) => false,
        };
        result
    }

    /// [`Conn::query`] for at most one row.
    pub async fn query_opt(
        &mut self,
        sql: &'static Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, DbError> {
        let mut rows = self.query(sql, params).await?;
        if rows.len() > 1 {
            return Err(DbError::Failed(format!(
                "expected at most one row, got {}",
                rows.len()
            )));
        }
        Ok(rows.pop())
    }

    /// One round trip that only checks the connection.
    pub async fn ping(&mut self) -> Result<(), DbError> {
        self.clean = false;
        let result = self
            .conn()
            .client
            .check_connection()
            .await
            .map_err(|e| DbError::of(&e));
        self.clean = result.is_ok();
        result
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let (true, Some(conn)) = (self.clean, self.conn.take()) {
            if !self.db.permits.is_closed() && !conn.client.is_closed() {
                self.db.idle.lock().expect("idle list").push(Idle {
                    conn,
                    since: Instant::now(),
                });
            }
        }
    }
}

/// Read a column, a decoding failure being a bug (500).
pub fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    index: usize,
) -> Result<T, DbError> {
    row.try_get(index)
        .map_err(|e| DbError::Failed(format!("column {index}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::parse_url;

    fn hosts(url: &str) -> (Vec<String>, bool) {
        let (targets, rw) = parse_url(url).expect("parses");
        (
            targets
                .iter()
                .map(|t| {
                    format!(
                        "{}:{}/{}",
                        t.get_host(),
                        t.get_port(),
                        t.get_database().unwrap_or("")
                    )
                })
                .collect(),
            rw,
        )
    }

    #[test]
    fn one_host_is_one_target_in_any_mode() {
        assert_eq!(
            hosts("postgres://u:pw@db:5433/pages"),
            (vec!["db:5433/pages".to_string()], false)
        );
    }

    #[test]
    fn several_hosts_with_read_write_are_tried_in_order() {
        assert_eq!(
            hosts(
                "postgres://u@a:5432,b:5433/pages?target_session_attrs=read-write&sslmode=disable"
            ),
            (
                vec!["a:5432/pages".to_string(), "b:5433/pages".to_string()],
                true
            )
        );
        assert!(hosts("postgres://u@a,b/p?target_session_attrs=primary").1);
        assert!(!hosts("postgres://u@a,b/p?target_session_attrs=any").1);
    }

    #[test]
    fn the_pool_has_one_target_per_host_and_checks_writes() {
        use super::{Db, PoolOptions};
        let db = Db::new(
            "postgres://u:pw@a:5432,b:5433/pages?target_session_attrs=primary&sslmode=disable",
            PoolOptions::default(),
        )
        .expect("parses");
        let names: Vec<_> = db.inner.targets.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a:5432", "b:5433"]);
        assert!(db.inner.read_write);
        for t in &db.inner.targets {
            assert_eq!(
                t.config.get_target_session_attrs(),
                tokio_postgres::config::TargetSessionAttrs::ReadWrite
            );
            assert_eq!(t.config.get_dbname(), Some("pages"));
        }
        let one = Db::new("postgres://u@db/pages", PoolOptions::default()).expect("parses");
        assert_eq!(one.inner.targets.len(), 1);
        assert!(!one.inner.read_write);
    }

    #[test]
    fn unsupported_session_attrs_are_a_configuration_error() {
        let err = parse_url("postgres://u@a,b/p?target_session_attrs=standby").unwrap_err();
        assert!(err.to_string().contains("standby"), "{err}");
    }
}
