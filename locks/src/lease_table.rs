//! A lease table in SQL: `locks(name primary key, holder, token, expires_at,
//! released, granted_at)`, on PostgreSQL (issuer `lease-postgres`) or on
//! MySQL/MariaDB (issuer `lease-mysql`).
//!
//! # Grant
//! One atomic statement takes the row when it is free and adds one to its
//! token (see the comments beside [`PG_ACQUIRE`] and [`MYSQL_ACQUIRE`] for why
//! each is atomic). Expiry is judged by the database's own clock (`now()`),
//! never the worker's, so workers with skewed clocks still agree.
//!
//! # Release, renew
//! Release expires the row but keeps it, so the token never restarts; a lock's
//! tokens keep growing across database restarts because they are ordinary
//! committed rows. Renew and release match holder AND token, and only while
//! the lease has not lapsed, so a late holder can neither extend nor free the
//! next holder's grant (they answer `NotHeld`).
//!
//! # Lock-delay (Chubby)
//! With [`LeaseTable::with_lock_delay`], a lease that lapsed WITHOUT a release
//! (its holder crashed, froze or lost the network, and may still have writes
//! in flight) keeps the lock from everybody until `expires_at + delay`. A
//! proper release frees it at once: the `released` column tells the two apart.
//!
//! # Validity
//! A lease is trusted for the TTL counted from the moment the request was sent,
//! less a drift allowance (1% + 2 ms) for the two clocks' rates.
//!
//! # Failures
//! Dropping an acquire future midway leaves at worst a granted row nobody
//! knows about; it lapses after the TTL (plus any lock-delay). A database that
//! goes away during a hold fails the renewals; the lease's validity passes and
//! its lost signal fires.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::time::Instant;

use super::{
    poll_until_granted, AcquireOptions, Fencing, Grant, Lease, LockError, LockService, NewLease,
};

pub const ISSUER_POSTGRES: &str = "lease-postgres";
pub const ISSUER_MYSQL: &str = "lease-mysql";

/// Connections per lease table's pool; also bounds the retries on dead ones.
const MAX_CONNECTIONS: u32 = 16;

/// How long connecting may take before the constructor says unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Postgres grant. `$1` name, `$2` holder, `$3` TTL in seconds, `$4` lock-delay
/// in seconds. Returns the new token, or no row when the lock is taken.
///
/// Atomic because `insert ... on conflict do update` either inserts the row
/// (the primary key lets exactly one concurrent insert win) or locks the
/// existing row and evaluates the `where` against its latest committed
/// version: of two concurrent acquirers, the second waits for the first's row
/// lock, then sees the new `expires_at` and updates nothing.
pub const PG_ACQUIRE: &str = "
insert into locks as l (name, holder, token, expires_at, released, granted_at)
values ($1, $2, 1, now() + make_interval(secs => $3), false, now())
on conflict (name) do update
   set holder = excluded.holder,
       token = l.token + 1,
       expires_at = excluded.expires_at,
       released = false,
       granted_at = excluded.granted_at
 where (l.released and l.expires_at <= now())
    or (not l.released and l.expires_at + make_interval(secs => $4) <= now())
returning token";

/// Postgres renew: `$1` name, `$2` holder, `$3` token, `$4` TTL in seconds.
pub const PG_RENEW: &str = "
update locks set expires_at = now() + make_interval(secs => $4)
 where name = $1 and holder = $2 and token = $3
   and not released and expires_at > now()";

/// Postgres release: `$1` name, `$2` holder, `$3` token. Keeps the row.
pub const PG_RELEASE: &str = "
update locks set expires_at = now(), released = true
 where name = $1 and holder = $2 and token = $3
   and not released and expires_at > now()";

/// MySQL/MariaDB grant of an existing row. Binds: holder, TTL in µs, name,
/// lock-delay in µs. Granted when one row is affected. The token comes back
/// through `last_insert_id(expr)`, which the server returns in the
/// statement's OK packet, so the grant and the token
/// read are the same statement.
///
/// Atomic because an InnoDB `update` takes the row's exclusive lock and
/// evaluates its `where` on the latest committed version (a locking read, not
/// the snapshot): of two concurrent acquirers, the second waits for the
/// first's lock, then sees the new `expires_at` and matches nothing. The `set`
/// list reads only the row's old values (MySQL assigns left to right, so no
/// assignment here refers to a column assigned before it).
pub const MYSQL_ACQUIRE: &str = "
update locks
   set token = last_insert_id(token + 1),
       holder = ?,
       expires_at = now(6) + interval ? microsecond,
       released = false,
       granted_at = now(6)
 where name = ?
   and ((released and expires_at <= now(6))
     or (not released and expires_at + interval ? microsecond <= now(6)))";

/// MySQL/MariaDB first grant of a name: the primary key lets exactly one
/// concurrent insert win; the others are ignored (0 rows) and retry the
/// update above on their next attempt.
pub const MYSQL_CREATE: &str = "
insert ignore into locks (name, holder, token, expires_at, released, granted_at)
values (?, ?, 1, now(6) + interval ? microsecond, false, now(6))";

/// MySQL/MariaDB renew: holder, token and not lapsed.
pub const MYSQL_RENEW: &str = "
update locks set expires_at = now(6) + interval ? microsecond
 where name = ? and holder = ? and token = ?
   and not released and expires_at > now(6)";

/// MySQL/MariaDB release: keeps the row.
pub const MYSQL_RELEASE: &str = "
update locks set expires_at = now(6), released = true
 where name = ? and holder = ? and token = ?
   and not released and expires_at > now(6)";

#[derive(Clone)]
enum Db {
    Postgres(PgPool),
    MySql(MySqlPool),
}

/// A lock service on a SQL lease table. Cheap to clone (shares the pool).
#[derive(Clone)]
pub struct LeaseTable {
    db: Db,
    lock_delay: Duration,
}

impl std::fmt::Debug for LeaseTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseTable")
            .field("issuer", &self.issuer_name())
            .field("lock_delay", &self.lock_delay)
            .finish()
    }
}

impl LeaseTable {
    /// Connect to PostgreSQL at `url` and run the migrations in
    /// `migrations/postgres`. Fails fast: a malformed URL is `InvalidConfig`,
    /// an unreachable server `Unavailable` within a few seconds.
    pub async fn postgres(url: &str) -> Result<LeaseTable, LockError> {
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(CONNECT_TIMEOUT)
            // No ping before every statement (it doubles the round trips); a
            // connection that died is found by its statement failing, dropped
            // by the pool, and the statement retried (see `with_reconnect`).
            .test_before_acquire(false)
            .connect(url)
            .await
            .map_err(|e| connect_error(ISSUER_POSTGRES, url, e))?;
        sqlx::migrate!("../migrations/postgres")
            .run(&pool)
            .await
            .map_err(|e| LockError::unavailable(ISSUER_POSTGRES, format!("migrations: {e}")))?;
        Ok(LeaseTable {
            db: Db::Postgres(pool),
            lock_delay: Duration::ZERO,
        })
    }

    /// Connect to MySQL/MariaDB at `url` and run the migrations in
    /// `migrations/mysql`. Same errors as [`LeaseTable::postgres`].
    pub async fn mysql(url: &str) -> Result<LeaseTable, LockError> {
        let pool = MySqlPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(CONNECT_TIMEOUT)
            // No ping before every statement (it doubles the round trips); a
            // connection that died is found by its statement failing, dropped
            // by the pool, and the statement retried (see `with_reconnect`).
            .test_before_acquire(false)
            .connect(url)
            .await
            .map_err(|e| connect_error(ISSUER_MYSQL, url, e))?;
        sqlx::migrate!("../migrations/mysql")
            .run(&pool)
            .await
            .map_err(|e| LockError::unavailable(ISSUER_MYSQL, format!("migrations: {e}")))?;
        Ok(LeaseTable {
            db: Db::MySql(pool),
            lock_delay: Duration::ZERO,
        })
    }

    /// After a lease lapses without a release, nobody gets the lock until
    /// `expires_at + delay` (by the database's clock). Zero by default.
    pub fn with_lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = delay;
        self
    }

    fn issuer_name(&self) -> &'static str {
        match self.db {
            Db::Postgres(_) => ISSUER_POSTGRES,
            Db::MySql(_) => ISSUER_MYSQL,
        }
    }

    /// The typed error, and whether the connection it happened on is dead.
    fn err(&self, e: sqlx::Error) -> (LockError, bool) {
        let dead = matches!(e, sqlx::Error::Io(_))
            || matches!(&e, sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("57P")));
        (db_error(self.issuer_name(), e), dead)
    }

    /// One grant attempt: the token if the row was free, `None` if held.
    async fn grant_once(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<u64>, LockError> {
        with_reconnect(|| self.grant_statement(name, holder, ttl)).await
    }

    async fn grant_statement(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<u64>, (LockError, bool)> {
        match &self.db {
            Db::Postgres(pool) => {
                let token: Option<i64> = sqlx::query_scalar(PG_ACQUIRE)
                    .bind(name)
                    .bind(holder)
                    .bind(ttl.as_secs_f64())
                    .bind(self.lock_delay.as_secs_f64())
                    .fetch_optional(pool)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(token.map(|t| t as u64))
            }
            Db::MySql(pool) => {
                let updated = sqlx::query(MYSQL_ACQUIRE)
                    .bind(holder)
                    .bind(micros(ttl))
                    .bind(name)
                    .bind(micros(self.lock_delay))
                    .execute(pool)
                    .await
                    .map_err(|e| self.err(e))?;
                if updated.rows_affected() == 1 {
                    return Ok(Some(updated.last_insert_id()));
                }
                let created = sqlx::query(MYSQL_CREATE)
                    .bind(name)
                    .bind(holder)
                    .bind(micros(ttl))
                    .execute(pool)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok((created.rows_affected() == 1).then_some(1))
            }
        }
    }

    async fn try_grant(
        &self,
        name: &str,
        opts: AcquireOptions,
    ) -> Result<Option<Lease>, LockError> {
        let holder = uuid::Uuid::new_v4().simple().to_string();
        let requested_at = Instant::now();
        let Some(token) = self.grant_once(name, &holder, opts.ttl).await? else {
            return Ok(None);
        };
        tracing::debug!(
            lock = name,
            token,
            issuer = self.issuer_name(),
            "lease granted"
        );
        Ok(Some(Lease::new(NewLease {
            name: name.to_string(),
            issuer: self.issuer_name().to_string(),
            fencing: Fencing::Token(token),
            ttl: opts.ttl,
            requested_at,
            validity: Some(validity_for(opts.ttl)),
            auto_renew: opts.auto_renew,
            grant: Arc::new(LeaseGrant {
                table: self.clone(),
                name: name.to_string(),
                holder,
                token,
            }),
            lost_trigger: None,
        })))
    }
}

impl LockService for LeaseTable {
    fn issuer(&self) -> &str {
        self.issuer_name()
    }

    fn acquire_with<'a>(
        &'a self,
        name: &'a str,
        opts: AcquireOptions,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        async move {
            opts.validate(name)?;
            if name.len() > 255 {
                return Err(LockError::InvalidConfig(
                    "lock name longer than 255 bytes".into(),
                ));
            }
            poll_until_granted(name, opts.wait, || self.try_grant(name, opts)).await
        }
        .boxed()
    }
}

struct LeaseGrant {
    table: LeaseTable,
    name: String,
    holder: String,
    token: u64,
}

impl LeaseGrant {
    fn not_held(&self, when: &str) -> LockError {
        LockError::NotHeld {
            name: self.name.clone(),
            reason: format!(
                "{when}: lease row no longer ours (lapsed, or token {} superseded)",
                self.token
            ),
        }
    }

    /// Run renew (`Some(ttl)`) or release (`None`); true when our row matched.
    async fn update(&self, ttl: Option<Duration>) -> Result<bool, LockError> {
        with_reconnect(|| self.update_statement(ttl)).await
    }

    async fn update_statement(&self, ttl: Option<Duration>) -> Result<bool, (LockError, bool)> {
        let rows = match (&self.table.db, ttl) {
            (Db::Postgres(pool), Some(ttl)) => sqlx::query(PG_RENEW)
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token as i64)
                .bind(ttl.as_secs_f64())
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            (Db::Postgres(pool), None) => sqlx::query(PG_RELEASE)
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token as i64)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            (Db::MySql(pool), Some(ttl)) => sqlx::query(MYSQL_RENEW)
                .bind(micros(ttl))
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            (Db::MySql(pool), None) => sqlx::query(MYSQL_RELEASE)
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
        };
        Ok(rows.map_err(|e| self.table.err(e))? == 1)
    }
}

impl Grant for LeaseGrant {
    fn renew(&self, ttl: Duration) -> BoxFuture<'_, Result<Duration, LockError>> {
        async move {
            // A reply later than the TTL is useless; give the watchdog control back.
            let limit = ttl.max(Duration::from_millis(100));
            match tokio::time::timeout(limit, self.update(Some(ttl))).await {
                Err(_) => Err(LockError::unavailable(
                    self.table.issuer_name(),
                    format!("renewal got no reply within {limit:?}"),
                )),
                Ok(Ok(true)) => Ok(validity_for(ttl)),
                Ok(Ok(false)) => Err(self.not_held("renew")),
                Ok(Err(e)) => Err(e),
            }
        }
        .boxed()
    }

    /// Expires our row now (keeping it and its token). When the row is no
    /// longer ours, nothing is touched and the answer is `NotHeld`: the caller
    /// learns its critical section outlived its lease. A late release does not
    /// cancel a lock-delay.
    fn release(&self) -> BoxFuture<'_, Result<(), LockError>> {
        async move {
            if self.update(None).await? {
                Ok(())
            } else {
                Err(self.not_held("release"))
            }
        }
        .boxed()
    }
}

/// Run `statement` again when it failed on a connection that turned out dead:
/// the pool does not ping before handing one out, and after a database restart
/// its idle connections are all dead, so up to one try per pooled connection
/// plus a fresh one (three tries were not enough after a MariaDB restart). A failed
/// connection is closed by the pool, so the next try gets another or a new one.
/// Retrying is safe: a grant that did reach the database under the same holder
/// id is seen as held (not granted twice) and lapses after its TTL; renew and
/// release are idempotent.
async fn with_reconnect<T, F, Fut>(mut statement: F) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, (LockError, bool)>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match statement().await {
            Ok(v) => return Ok(v),
            Err((e, dead_connection)) if dead_connection && tries <= MAX_CONNECTIONS => {
                tracing::debug!("retrying on another connection: {e}");
            }
            Err((e, _)) => return Err(e),
        }
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

fn validity_for(ttl: Duration) -> Duration {
    ttl.saturating_sub(ttl / 100 + Duration::from_millis(2))
}

fn connect_error(issuer: &str, url: &str, e: sqlx::Error) -> LockError {
    match e {
        sqlx::Error::Configuration(c) => {
            LockError::InvalidConfig(format!("{issuer} url {url:?}: {c}"))
        }
        other => db_error(issuer, other),
    }
}

fn db_error(issuer: &str, e: sqlx::Error) -> LockError {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => LockError::unavailable(issuer, e),
        // The server went away mid-statement (e.g. "terminating connection due
        // to administrator command"): also a reachability problem.
        sqlx::Error::Database(ref d) if d.code().is_some_and(|c| c.starts_with("57P")) => {
            LockError::unavailable(issuer, e)
        }
        other => LockError::protocol(issuer, other),
    }
}
