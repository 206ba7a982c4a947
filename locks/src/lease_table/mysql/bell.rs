//! The bells: user locks (`GET_LOCK`) held on a pool connection, on which
//! MariaDB's waiters block, and the acquire's connection that holds them.

use std::time::Duration;

use sqlx::mysql::{MySql, MySqlConnection, MySqlPool};
use sqlx::pool::PoolConnection;
use tokio::time::Instant;

use super::{micros, MyDialect};
use crate::lease_table::{LeaseTable, ISSUER_MYSQL};
use crate::{LockError, Waiter};

/// How often a waiter polls while the holder rings no bell.
const BELL_LESS_POLL: Duration = Duration::from_millis(20);

/// The pool connection that holds an acquire's or a lease's bells (the
/// name's, and the waiter's own), kept from the first try to the release.
/// Dropped while still holding it (the lease was never released, or the
/// acquire was dropped), the connection is closed rather than returned to
/// the pool, so the server lets the bells go.
#[derive(Default)]
pub(super) struct Bell(Option<PoolConnection<MySql>>);

impl Bell {
    /// A connection to close (not to pool) when this is dropped.
    pub(super) fn closing(conn: PoolConnection<MySql>) -> Bell {
        Bell(Some(conn))
    }

    /// The connection, to return to the pool (drop it) or to use and then
    /// close ([`Bell::closing`]).
    pub(super) fn take(&mut self) -> Option<PoolConnection<MySql>> {
        self.0.take()
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(conn.detach());
        }
    }
}

/// What one acquire keeps between its tries and waits.
#[derive(Default)]
pub(super) struct MyWait {
    /// The acquire's connection: its tries, its place (with its own bell)
    /// and its waits run on it, and a grant keeps it for the lease. Closed
    /// if dropped here (a dropped acquire), which lets its bells go.
    pub(super) conn: Bell,
    /// When our place was taken or last renewed, with our bell held on
    /// `conn`; `None` while we have no place (or lost it with a connection).
    pub(super) joined: Option<Instant>,
    /// The holder's token when the name's bell was last found free while the
    /// lease was held: seen twice for the same token, that holder has no bell.
    free_bell_seen: Option<i64>,
    /// A wait of this acquire ended because the bell it waited on was let
    /// go by its holder (a release, or the waiter before us going on).
    pub(super) rang: bool,
    /// The last wait rang, and found no live place before ours but the one
    /// whose bell it waited on (`first_now` in [`super::Statements::wait`]):
    /// the next try is the plain grant, without the queue's subquery (and
    /// takes this back to false).
    pub(super) first_in_line: bool,
}

impl MyWait {
    /// The acquire's connection, taken from the pool when it has none.
    pub(super) async fn connection(
        &mut self,
        pool: &MySqlPool,
    ) -> Result<&mut MySqlConnection, sqlx::Error> {
        if self.conn.0.is_none() {
            self.conn.0 = Some(pool.acquire().await?);
        }
        Ok(&mut **self.conn.0.as_mut().expect("connection just taken"))
    }

    /// The connection failed: close it (the server lets its bells go, so
    /// our place is no longer live) and join again at the next try.
    pub(super) fn lost(&mut self) {
        self.conn = Bell::default();
        self.joined = None;
        self.first_in_line = false;
    }
}

/// Run `$statement` (an `async` block using `$conn`, the acquire's
/// connection, taken from the pool when it has none), once. On failure the
/// connection is closed, with the bells it held (so the waiter's place is no
/// longer live: it joins again on its next try), and the answer says whether
/// another try can help: `Result<T, (LockError, bool)>`.
macro_rules! on_conn_once {
    ($table:expr, $st:expr, $pool:expr, |$conn:ident| $statement:expr) => {{
        let st: &mut $crate::lease_table::mysql::bell::MyWait = $st;
        let ran = async {
            let $conn = st.connection($pool).await.map_err(|e| $table.err(e))?;
            $statement.await.map_err(|e| $table.err(e))
        }
        .await;
        if ran.is_err() {
            st.lost();
        }
        ran
    }};
}
pub(super) use on_conn_once;

/// [`on_conn_once`], on another connection while the failure is one that
/// another try can fix (see `with_reconnect`): `Result<T, LockError>`.
macro_rules! on_conn {
    ($table:expr, $st:expr, $pool:expr, |$conn:ident| $statement:expr) => {{
        let mut tries = 0;
        loop {
            tries += 1;
            match $crate::lease_table::mysql::bell::on_conn_once!(
                $table,
                &mut *$st,
                $pool,
                |$conn| $statement
            ) {
                Ok(v) => break Ok(v),
                Err((e, retry)) if retry && tries <= $crate::lease_table::MAX_CONNECTIONS => {
                    tracing::debug!("retrying on another connection: {e}");
                }
                Err((e, _)) => break Err(e),
            }
        }
    }};
}
pub(super) use on_conn;

/// [`super::Statements::wait`]'s answer (what it read before it blocked,
/// then whether the bell came).
struct Waited {
    token: u64,
    held: Option<i64>,
    pred: Option<String>,
    bell_free: Option<i64>,
    rang: Option<i64>,
    first_now: Option<i64>,
}

impl Waited {
    /// From the function's text, `token held bell_free rang first_now
    /// pred` (`-`: null).
    fn parse(text: &str) -> Option<Waited> {
        let mut fields = text.split(' ');
        let mut next = || fields.next().filter(|f| *f != "-");
        let number = |f: Option<&str>| f.and_then(|f| f.parse::<i64>().ok());
        let token = next()?.parse().ok()?;
        let (held, bell_free, rang, first_now) = (
            number(next()),
            number(next()),
            number(next()),
            number(next()),
        );
        Some(Waited {
            token,
            held,
            pred: next().map(str::to_string),
            bell_free,
            rang,
            first_now,
        })
    }
}

/// A waiter: blocks in `GET_LOCK` on the bell of the one before it (see
/// [`super::Statements::wait`]), on the acquire's connection.
pub(super) struct BellWaiter<'a> {
    pub(super) table: &'a LeaseTable,
    pub(super) my: &'a MyDialect,
    pub(super) name: &'a str,
    pub(super) waiter: &'a str,
    pub(super) state: &'a tokio::sync::Mutex<MyWait>,
}

impl Waiter for BellWaiter<'_> {
    const TRY_AFTER_SETUP: bool = false;

    fn arm(&mut self) {}

    /// One wait statement, blocking until the bell it waits on is let go
    /// (true: a release, or the waiter before us went away), or the bound.
    /// Only when the name's bell is found free while the lease is held does
    /// it ask again: the holder may be taking it right now; free twice for
    /// the same holder, that holder has no bell, and we poll.
    async fn wait(&mut self, bound: Duration) -> Result<bool, LockError> {
        let t = self.table;
        let deadline = Instant::now() + bound;
        let mut st = self.state.lock().await;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || (t.settings.is_fair() && st.joined.is_none()) {
                // Out of time, or our place was lost with a connection: try
                // (and join) again.
                return Ok(false);
            }
            let waited = on_conn_once!(t, &mut st, &self.my.pool, |conn| async {
                t.sent(1);
                sqlx::query_scalar::<_, Option<String>>(&self.my.sql.wait)
                    .bind(micros(t.lock_delay))
                    .bind(left.as_secs_f64())
                    .bind(self.waiter)
                    .bind(self.name)
                    .fetch_one(&mut *conn)
                    .await
            });
            let row = match waited {
                Ok(row) => row,
                // The connection failed (and was closed): try again.
                Err((_, true)) => return Ok(false),
                Err((e, false)) => return Err(e),
            };
            // No row: the lock was never granted (or its row was deleted);
            // try again, creating it.
            let Some(text) = row else {
                self.my.forget_row(self.name);
                return Ok(false);
            };
            let w = Waited::parse(&text).ok_or_else(|| {
                LockError::protocol(ISSUER_MYSQL, format!("wait answered {text:?}"))
            })?;
            let token = w.token.min(i64::MAX as u64) as i64;
            match (w.bell_free, w.rang) {
                // The bell was held and came to us: its holder let it go.
                (Some(0), Some(1)) => {
                    st.rang = true;
                    st.first_in_line = t.settings.is_fair() && w.first_now == Some(1);
                    return Ok(true);
                }
                // The bell was free: the waiter before us went away, or the
                // lock is free; try at once.
                (Some(1), Some(1)) if w.pred.is_some() || w.held != Some(1) => return Ok(false),
                // The name's bell free while the lease is held.
                (Some(1), Some(1)) => {
                    if st.free_bell_seen == Some(token) {
                        tokio::time::sleep(BELL_LESS_POLL.min(left)).await;
                        return Ok(false);
                    }
                    st.free_bell_seen = Some(token);
                }
                // Timed out (the bound), or the wait was interrupted.
                _ => return Ok(false),
            }
        }
    }
}
