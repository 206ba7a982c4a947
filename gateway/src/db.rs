//! A minimal connection pool that keeps each request at ONE database round trip.
//!
//! Why not `sqlx::PgPool` for requests: sqlx 0.8 pings every connection when it
//! goes back to the pool (`return_to_pool` sends a Sync and waits for
//! ReadyForQuery), a second round trip per request. Here a connection goes
//! back to the idle list as it is, unless its last use failed or was cancelled
//! midway; then it is dropped and a new one is opened on demand. That is also
//! how the pool heals after a PostgreSQL outage: each dead connection fails
//! one request (503) and is replaced.
//!
//! # Several servers: following the primary
//! `DATABASE_URL` may name several servers the way libpq does,
//! `postgres://user@host1:5432,host2:5432/pages?target_session_attrs=read-write`
//! (sqlx 0.8 does not parse that form, so [`parse_url`] does). A new
//! connection then tries the servers in turn, starting with the one that
//! last worked, and keeps the first whose `transaction_read_only` is `off`:
//! the primary. After a failover the old primary's connections fail one
//! request each (503) and are dropped, and their replacements land on the
//! promoted standby. While no server accepts writes (the primary is gone and
//! nothing is promoted yet) every request that needs a new connection is a
//! 503, and so is `/readyz`, so a balancer stops sending traffic here. A
//! statement refused because the server is read-only (SQLSTATE 25006: a
//! single-host URL that points at a standby) is a 503 too, and drops its
//! connection.

use std::ops::{Deref, DerefMut};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// One entry per server of the URL, in its order.
    targets: Vec<PgConnectOptions>,
    /// `target_session_attrs=read-write`: only a server that accepts writes will do.
    read_write: bool,
    /// The target that gave the last good connection: tried first.
    preferred: AtomicUsize,
    idle: Mutex<Vec<PgConnection>>,
    permits: Arc<Semaphore>,
}

impl Db {
    /// Up to `max_connections` connections opened with `options`, lazily.
    pub fn new(options: PgConnectOptions, max_connections: u32) -> Self {
        Self::with_targets(vec![options], false, max_connections)
    }

    /// Up to `max_connections` connections to the server(s) `url` names; see
    /// the module docs for several servers.
    pub fn from_url(url: &str, max_connections: u32) -> Result<Self, sqlx::Error> {
        let (targets, read_write) = parse_url(url)?;
        Ok(Self::with_targets(targets, read_write, max_connections))
    }

    fn with_targets(targets: Vec<PgConnectOptions>, read_write: bool, max: u32) -> Self {
        Self {
            inner: Arc::new(Inner {
                targets,
                read_write,
                preferred: AtomicUsize::new(0),
                idle: Mutex::new(Vec::new()),
                permits: Arc::new(Semaphore::new(max.max(1) as usize)),
            }),
        }
    }

    /// The connect options of a server that takes our connections now (with
    /// `read-write`: the primary), after trying them like a new connection.
    pub async fn writable_target(&self) -> Result<PgConnectOptions, sqlx::Error> {
        if self.inner.targets.len() == 1 && !self.inner.read_write {
            return Ok(self.inner.targets[0].clone());
        }
        let (conn, i) = self.inner.open().await?;
        let _ = sqlx::Connection::close(conn).await;
        Ok(self.inner.targets[i].clone())
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
            None => self.inner.open().await?.0,
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

impl Inner {
    /// A new connection, and the index of the target it went to.
    async fn open(&self) -> Result<(PgConnection, usize), sqlx::Error> {
        let n = self.targets.len();
        if n == 1 && !self.read_write {
            return Ok((self.targets[0].connect().await?, 0));
        }
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut refused = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let target = &self.targets[i];
            let name = format!("{}:{}", target.get_host(), target.get_port());
            let mut conn = match target.connect().await {
                Ok(conn) => conn,
                Err(e) => {
                    refused.push(format!("{name}: {e}"));
                    continue;
                }
            };
            if self.read_write {
                // What libpq's target_session_attrs=read-write asks every server.
                let read_only: Result<(String,), _> = sqlx::query_as("show transaction_read_only")
                    .fetch_one(&mut conn)
                    .await;
                match read_only {
                    Ok((ro,)) if ro == "off" => {}
                    Ok(_) => {
                        refused.push(format!("{name}: read-only (a standby)"));
                        let _ = sqlx::Connection::close(conn).await;
                        continue;
                    }
                    Err(e) => {
                        refused.push(format!("{name}: {e}"));
                        continue;
                    }
                }
            }
            if i != first {
                tracing::info!(server = %name, "database connections now go to {name}");
            }
            self.preferred.store(i, Ordering::Relaxed);
            return Ok((conn, i));
        }
        Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            format!(
                "no database server {}: {}",
                if self.read_write {
                    "accepts writes (target_session_attrs=read-write)"
                } else {
                    "answers"
                },
                refused.join("; ")
            ),
        )))
    }
}

/// The servers a `postgres://` URL names, and whether it asks for one that
/// accepts writes. `host1:p1,host2:p2` and `target_session_attrs` (`any`,
/// `read-write`, `primary`) follow libpq; everything else is sqlx's.
pub fn parse_url(url: &str) -> Result<(Vec<PgConnectOptions>, bool), sqlx::Error> {
    let bad = |m: String| sqlx::Error::Configuration(m.into());
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("the database URL has no scheme".into()))?;
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
                return Err(bad(format!(
                    "target_session_attrs={other} is not supported (use read-write or any)"
                )))
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
    let targets = hosts
        .split(',')
        .map(|host| {
            PgConnectOptions::from_str(&format!("{scheme}://{userinfo}{host}{path}{query}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((targets, read_write))
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
        // 25006 read_only_sql_transaction: this server is a standby, not the
        // primary. Drop the connection (the next one may find the primary)
        // and answer like an unreachable database.
        let result = result.map_err(|e| match e {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("25006") => {
                sqlx::Error::Io(std::io::Error::other(format!(
                    "the database server is read-only (a standby, not the primary): {db}"
                )))
            }
            e => e,
        });
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
    fn unsupported_session_attrs_are_a_configuration_error() {
        let err = parse_url("postgres://u@a,b/p?target_session_attrs=standby").unwrap_err();
        assert!(err.to_string().contains("standby"), "{err}");
    }
}
