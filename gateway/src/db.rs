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

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Row, Statement};

/// Why a database call failed: [`DbError::Unavailable`] is answered 503 (retry
/// later), [`DbError::Failed`] 500 (a bug: an SQL error, a protocol error, a
/// value of an unexpected type).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DbError {
    /// PostgreSQL cannot be reached or is going away: no connection in time,
    /// connection refused or broken, SQLSTATE class 08 (connection), 53
    /// (insufficient resources) or 57 (operator intervention: shutdown).
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

/// How the pool treats its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// Most PostgreSQL connections open at once (`--db-pool-size`).
    pub max_connections: u32,
    /// Longest a request waits for a live connection (a free one, pinged if
    /// it was idle, or a new one) before it is answered 503.
    pub acquire_timeout: Duration,
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
    config: tokio_postgres::Config,
    options: PoolOptions,
    idle: Mutex<Vec<Idle>>,
    permits: Arc<Semaphore>,
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
    /// A pool for `database_url` (`postgres://user:password@host:port/db`, or
    /// libpq's `key=value` form). Connects lazily: nothing is opened here.
    pub fn new(database_url: &str, options: PoolOptions) -> Result<Self, DbError> {
        let mut config: tokio_postgres::Config = database_url
            .parse()
            .map_err(|e| DbError::Failed(format!("database URL: {e}")))?;
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
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                options,
                idle: Mutex::new(Vec::new()),
                permits: Arc::new(Semaphore::new(options.max_connections.max(1) as usize)),
            }),
        })
    }

    pub fn options(&self) -> &PoolOptions {
        &self.inner.options
    }

    /// A live connection, within [`PoolOptions::acquire_timeout`] in all.
    pub async fn acquire(&self) -> Result<Conn, DbError> {
        let limit = self.inner.options.acquire_timeout;
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
        // tokio-postgres's own connect timeout covers the TCP connect only;
        // this one also covers the startup and authentication exchange.
        let limit = options.connect_timeout;
        let (client, connection) = tokio::time::timeout(limit, self.inner.config.connect(NoTls))
            .await
            .map_err(|_| DbError::Unavailable(format!("connecting took longer than {limit:?}")))?
            .map_err(|e| DbError::of(&e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("database connection ended: {e}");
            }
        });
        let conn = PgConn {
            client,
            prepared: Vec::new(),
            born: Instant::now(),
        };
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
