//! A minimal connection pool that keeps each request at ONE database round trip.
//!
//! Why not `sqlx::PgPool` for requests: sqlx 0.8 pings every connection when it
//! goes back to the pool (`return_to_pool` sends a Sync and waits for
//! ReadyForQuery), a second round trip per request. Here a connection goes
//! back to the idle list as it is, unless its last use failed or was cancelled
//! midway; then it is dropped and a new one is opened on demand. That is also
//! how the pool heals after a PostgreSQL outage: each dead connection fails
//! one request (503) and is replaced.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, PgPool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a request waits for a free connection (or a new one) before 503.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// Cheap to clone; shared by all handlers.
#[derive(Clone)]
pub struct Db {
    inner: Arc<Inner>,
}

struct Inner {
    options: PgConnectOptions,
    idle: Mutex<Vec<PgConnection>>,
    permits: Arc<Semaphore>,
}

impl Db {
    /// Up to `max_connections` connections opened with `options`, lazily.
    pub fn new(options: PgConnectOptions, max_connections: u32) -> Self {
        Self {
            inner: Arc::new(Inner {
                options,
                idle: Mutex::new(Vec::new()),
                permits: Arc::new(Semaphore::new(max_connections.max(1) as usize)),
            }),
        }
    }

    /// The same server, credentials and size as an sqlx pool.
    pub fn like(pool: &PgPool) -> Self {
        Self::new(
            (*pool.connect_options()).clone(),
            pool.options().get_max_connections(),
        )
    }

    /// A connection, waiting at most [`ACQUIRE_TIMEOUT`] in all.
    pub async fn acquire(&self) -> Result<Conn, sqlx::Error> {
        tokio::time::timeout(ACQUIRE_TIMEOUT, self.acquire_inner())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
    }

    async fn acquire_inner(&self) -> Result<Conn, sqlx::Error> {
        let permit = self
            .inner
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let idle = self.inner.idle.lock().expect("idle list").pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.inner.options.connect().await?,
        };
        Ok(Conn {
            conn: Some(conn),
            db: self.inner.clone(),
            clean: false,
            _permit: permit,
        })
    }

    /// Close the idle connections and refuse new acquisitions.
    pub fn close(&self) {
        self.inner.permits.close();
        self.inner.idle.lock().expect("idle list").clear();
    }
}

/// A checked-out connection. Call [`Conn::finish`] with the query's result:
/// only a connection whose last query completed without a connection-level
/// error goes back to the idle list.
pub struct Conn {
    conn: Option<PgConnection>,
    db: Arc<Inner>,
    clean: bool,
    _permit: OwnedSemaphorePermit,
}

impl Conn {
    /// Keep the connection for reuse unless `result` says it is broken.
    pub fn finish<T>(mut self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        self.clean = match &result {
            Ok(_) => true,
            // The server answered with an SQL error: the connection is fine.
            Err(sqlx::Error::Database(db)) => !db
                .code()
                .is_some_and(|c| c.starts_with("57") || c.starts_with("08")),
            Err(_) => false,
        };
        result
    }
}

impl Deref for Conn {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        self.conn.as_ref().expect("present until drop")
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("present until drop")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Not finished (a cancelled request) or failed: drop the connection,
        // its state is unknown.
        if let (true, Some(conn)) = (self.clean, self.conn.take()) {
            if !self.db.permits.is_closed() {
                self.db.idle.lock().expect("idle list").push(conn);
            }
        }
    }
}
