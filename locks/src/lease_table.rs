//! A lease table in SQL, on PostgreSQL (issuer `lease-postgres`, feature
//! `lease-postgres`) or on MySQL/MariaDB (issuer `lease-mysql`, feature
//! `lease-mysql`): one row per lock name,
//! `(name primary key, holder, client_id, token, expires_at, released, granted_at)`.
//!
//! # The table
//! The constructors create the table if it is missing (`create table if not
//! exists`, nothing else: no migration bookkeeping that could clash with the
//! host application's own). Its name is `fencelock_leases` unless
//! [`LeaseTableOptions::table`] says otherwise. To create it yourself (with
//! your own migrations), take the DDL from [`Statements::postgres_ddl`] /
//! [`Statements::mysql_ddl`] and turn creation off with
//! [`LeaseTableOptions::create_table`].
//!
//! # Grant
//! One atomic statement takes the row when it is free and adds one to its
//! token (see the comments in [`Statements`] for why each is atomic). Expiry
//! is judged by the database's own clock (`now()`), never the client's, so
//! clients with skewed clocks still agree. `holder` is a random id of the
//! grant (what renew and release match); `client_id` is the
//! [`LockService::client_id`] of the holder, which [`HolderLookup`] reports.
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
//! less the crate's drift allowance ([`crate::validity_for`]).
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
#[cfg(feature = "lease-mysql")]
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
#[cfg(feature = "lease-postgres")]
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::time::Instant;

use crate::{
    default_client_id, poll_until_granted, validate_client_id, validity_for, AcquireOptions,
    Fencing, Grant, Holder, HolderLookup, Lease, LockError, LockService, NewLease, Token,
};

pub const ISSUER_POSTGRES: &str = "lease-postgres";
pub const ISSUER_MYSQL: &str = "lease-mysql";

/// The table's name unless [`LeaseTableOptions::table`] says otherwise.
pub const DEFAULT_TABLE: &str = "fencelock_leases";

/// Connections per lease table's pool; also bounds the retries on dead ones.
const MAX_CONNECTIONS: u32 = 16;

/// How long connecting may take before the constructor says unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How to set up a [`LeaseTable`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTableOptions {
    table: String,
    create_table: bool,
    max_connections: u32,
}

impl Default for LeaseTableOptions {
    fn default() -> Self {
        Self {
            table: DEFAULT_TABLE.into(),
            create_table: true,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

impl LeaseTableOptions {
    /// The table's name: `[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes (checked
    /// by the constructor, since it is written into the SQL).
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// Whether the constructor runs `create table if not exists` (default
    /// true). Turn it off when your own migrations create the table from
    /// [`Statements::postgres_ddl`] or [`Statements::mysql_ddl`].
    pub fn create_table(mut self, on: bool) -> Self {
        self.create_table = on;
        self
    }

    /// Size of the connection pool (default 16).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }
}

fn validate_table(name: &str) -> Result<(), LockError> {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if first_ok && name.len() <= 63 && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        Ok(())
    } else {
        Err(LockError::InvalidConfig(format!(
            "lease table name {name:?}: must match [A-Za-z_][A-Za-z0-9_]{{0,62}}"
        )))
    }
}

/// Every statement of the lease table, for one table name. The grant texts
/// are also what the benchmarks run through pgbench and mariadb-slap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statements {
    /// PostgreSQL grant. `$1` name, `$2` holder, `$3` TTL in seconds, `$4`
    /// lock-delay in seconds, `$5` client id. Returns the new token, or no
    /// row when the lock is taken.
    ///
    /// Atomic because `insert ... on conflict do update` either inserts the
    /// row (the primary key lets exactly one concurrent insert win) or locks
    /// the existing row and evaluates the `where` against its latest committed
    /// version: of two concurrent acquirers, the second waits for the first's
    /// row lock, then sees the new `expires_at` and updates nothing.
    pub pg_acquire: String,
    /// PostgreSQL renew: `$1` name, `$2` holder, `$3` token, `$4` TTL in seconds.
    pub pg_renew: String,
    /// PostgreSQL release: `$1` name, `$2` holder, `$3` token. Keeps the row.
    pub pg_release: String,
    /// PostgreSQL holder lookup: `$1` name. The client id and token of a lease
    /// that is neither released nor lapsed, by the database's clock.
    pub pg_holder: String,
    /// MySQL/MariaDB grant of an existing row. Binds: holder, client id, TTL
    /// in µs, name, lock-delay in µs. Granted when one row is affected. The
    /// token comes back through `last_insert_id(expr)`, which the server
    /// returns in the statement's OK packet, so the grant and the token read
    /// are the same statement.
    ///
    /// Atomic because an InnoDB `update` takes the row's exclusive lock and
    /// evaluates its `where` on the latest committed version (a locking read,
    /// not the snapshot): of two concurrent acquirers, the second waits for
    /// the first's lock, then sees the new `expires_at` and matches nothing.
    /// The `set` list reads only the row's old values (MySQL assigns left to
    /// right, so no assignment here refers to a column assigned before it).
    pub mysql_acquire: String,
    /// MySQL/MariaDB first grant of a name: the primary key lets exactly one
    /// concurrent insert win; the others are ignored (0 rows) and retry the
    /// update above on their next attempt. Binds: name, holder, client id,
    /// TTL in µs.
    pub mysql_create: String,
    /// MySQL/MariaDB renew: TTL in µs, name, holder, token; only while not lapsed.
    pub mysql_renew: String,
    /// MySQL/MariaDB release: name, holder, token. Keeps the row.
    pub mysql_release: String,
    /// MySQL/MariaDB holder lookup: name.
    pub mysql_holder: String,
}

impl Statements {
    /// The statements for table `table` (not validated here; the
    /// constructors validate it).
    pub fn for_table(table: &str) -> Statements {
        let t = table;
        Statements {
            pg_acquire: format!(
                "
insert into {t} as l (name, holder, client_id, token, expires_at, released, granted_at)
values ($1, $2, $5, 1, now() + make_interval(secs => $3), false, now())
on conflict (name) do update
   set holder = excluded.holder,
       client_id = excluded.client_id,
       token = l.token + 1,
       expires_at = excluded.expires_at,
       released = false,
       granted_at = excluded.granted_at
 where (l.released and l.expires_at <= now())
    or (not l.released and l.expires_at + make_interval(secs => $4) <= now())
returning token"
            ),
            pg_renew: format!(
                "
update {t} set expires_at = now() + make_interval(secs => $4)
 where name = $1 and holder = $2 and token = $3
   and not released and expires_at > now()"
            ),
            pg_release: format!(
                "
update {t} set expires_at = now(), released = true
 where name = $1 and holder = $2 and token = $3
   and not released and expires_at > now()"
            ),
            pg_holder: format!(
                "
select client_id, token from {t}
 where name = $1 and not released and expires_at > now()"
            ),
            mysql_acquire: format!(
                "
update {t}
   set token = last_insert_id(token + 1),
       holder = ?,
       client_id = ?,
       expires_at = now(6) + interval ? microsecond,
       released = false,
       granted_at = now(6)
 where name = ?
   and ((released and expires_at <= now(6))
     or (not released and expires_at + interval ? microsecond <= now(6)))"
            ),
            mysql_create: format!(
                "
insert ignore into {t} (name, holder, client_id, token, expires_at, released, granted_at)
values (?, ?, ?, 1, now(6) + interval ? microsecond, false, now(6))"
            ),
            mysql_renew: format!(
                "
update {t} set expires_at = now(6) + interval ? microsecond
 where name = ? and holder = ? and token = ?
   and not released and expires_at > now(6)"
            ),
            mysql_release: format!(
                "
update {t} set expires_at = now(6), released = true
 where name = ? and holder = ? and token = ?
   and not released and expires_at > now(6)"
            ),
            mysql_holder: format!(
                "
select client_id, token from {t}
 where name = ? and not released and expires_at > now(6)"
            ),
        }
    }

    /// The PostgreSQL table, for your own migrations.
    pub fn postgres_ddl(table: &str) -> String {
        format!(
            "-- One row per lock name, kept forever once created: releasing or
-- expiring a lease only moves expires_at, so token never restarts.
create table if not exists {table} (
    name       text        primary key,
    -- Random id of the current (or last) grant: what renew and release match.
    holder     text        not null,
    -- Who holds it (the client id), for a storage asking who holds the lock.
    client_id  text        not null,
    -- The fencing counter: every grant adds one, in the same statement.
    token      bigint      not null,
    -- Judged against the database's own clock (now()), never a client's.
    expires_at timestamptz not null,
    -- True when the last holder released; false while held or after its
    -- lease lapsed without a release (then a lock-delay applies, as in Chubby).
    released   boolean     not null default false,
    granted_at timestamptz not null
)"
        )
    }

    /// The MySQL/MariaDB table, for your own migrations.
    pub fn mysql_ddl(table: &str) -> String {
        format!(
            "create table if not exists {table} (
    name       varchar(255)    not null primary key,
    holder     varchar(64)     not null,
    client_id  varchar(128)    not null,
    token      bigint unsigned not null,
    expires_at datetime(6)     not null,
    released   boolean         not null default false,
    granted_at datetime(6)     not null
) engine = InnoDB"
        )
    }
}

#[derive(Clone)]
enum Pool {
    #[cfg(feature = "lease-postgres")]
    Postgres(PgPool),
    #[cfg(feature = "lease-mysql")]
    MySql(MySqlPool),
}

/// A lock service on a SQL lease table. Cheap to clone (shares the pool).
#[derive(Clone)]
pub struct LeaseTable {
    pool: Pool,
    sql: Arc<Statements>,
    lock_delay: Duration,
    client_id: Arc<str>,
}

impl std::fmt::Debug for LeaseTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseTable")
            .field("issuer", &self.issuer_name())
            .field("client_id", &self.client_id)
            .field("lock_delay", &self.lock_delay)
            .finish()
    }
}

impl LeaseTable {
    /// Connect to PostgreSQL at `url` and create the table `fencelock_leases` if it is
    /// missing. Fails fast: a malformed URL is `InvalidConfig`, an unreachable
    /// server `Unavailable` within a few seconds.
    #[cfg(feature = "lease-postgres")]
    pub async fn postgres(url: &str) -> Result<LeaseTable, LockError> {
        Self::postgres_with(url, LeaseTableOptions::default()).await
    }

    /// [`LeaseTable::postgres`] with options (table name, creation, pool size).
    #[cfg(feature = "lease-postgres")]
    pub async fn postgres_with(
        url: &str,
        options: LeaseTableOptions,
    ) -> Result<LeaseTable, LockError> {
        validate_table(&options.table)?;
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(CONNECT_TIMEOUT)
            // No ping before every statement (it doubles the round trips); a
            // connection that died is found by its statement failing, dropped
            // by the pool, and the statement retried (see `with_reconnect`).
            .test_before_acquire(false)
            .connect(url)
            .await
            .map_err(|e| connect_error(ISSUER_POSTGRES, url, e))?;
        if options.create_table {
            // Concurrent `create table if not exists` can still collide in
            // PostgreSQL's catalog (a unique violation on pg_type): serialise
            // the creators on an advisory lock, in one transaction.
            let ddl = Statements::postgres_ddl(&options.table);
            let create = async {
                let mut tx = pool.begin().await?;
                sqlx::query("select pg_advisory_xact_lock(hashtext($1))")
                    .bind(format!("fencelock create {}", options.table))
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(&ddl).execute(&mut *tx).await?;
                tx.commit().await
            };
            create.await.map_err(|e| {
                LockError::unavailable(ISSUER_POSTGRES, format!("create lease table: {e}"))
            })?;
        }
        Ok(LeaseTable {
            pool: Pool::Postgres(pool),
            sql: Arc::new(Statements::for_table(&options.table)),
            lock_delay: Duration::ZERO,
            client_id: default_client_id().into(),
        })
    }

    /// Connect to MySQL/MariaDB at `url` and create the table `fencelock_leases` if it is
    /// missing. Same errors as [`LeaseTable::postgres`].
    #[cfg(feature = "lease-mysql")]
    pub async fn mysql(url: &str) -> Result<LeaseTable, LockError> {
        Self::mysql_with(url, LeaseTableOptions::default()).await
    }

    /// [`LeaseTable::mysql`] with options (table name, creation, pool size).
    #[cfg(feature = "lease-mysql")]
    pub async fn mysql_with(
        url: &str,
        options: LeaseTableOptions,
    ) -> Result<LeaseTable, LockError> {
        validate_table(&options.table)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(CONNECT_TIMEOUT)
            // No ping before every statement; see `postgres_with`.
            .test_before_acquire(false)
            .connect(url)
            .await
            .map_err(|e| connect_error(ISSUER_MYSQL, url, e))?;
        if options.create_table {
            // MySQL serialises concurrent DDL on the table's metadata lock.
            sqlx::query(&Statements::mysql_ddl(&options.table))
                .execute(&pool)
                .await
                .map_err(|e| {
                    LockError::unavailable(ISSUER_MYSQL, format!("create lease table: {e}"))
                })?;
        }
        Ok(LeaseTable {
            pool: Pool::MySql(pool),
            sql: Arc::new(Statements::for_table(&options.table)),
            lock_delay: Duration::ZERO,
            client_id: default_client_id().into(),
        })
    }

    /// After a lease lapses without a release, nobody gets the lock until
    /// `expires_at + delay` (by the database's clock). Zero by default.
    pub fn with_lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = delay;
        self
    }

    /// Record `id` as this client's id in every grant (see
    /// [`LockService::client_id`]).
    pub fn with_client_id(mut self, id: impl Into<String>) -> Result<Self, LockError> {
        let id = id.into();
        validate_client_id(&id)?;
        self.client_id = id.into();
        Ok(self)
    }

    /// The statements this table runs.
    pub fn statements(&self) -> &Statements {
        &self.sql
    }

    fn issuer_name(&self) -> &'static str {
        match self.pool {
            #[cfg(feature = "lease-postgres")]
            Pool::Postgres(_) => ISSUER_POSTGRES,
            #[cfg(feature = "lease-mysql")]
            Pool::MySql(_) => ISSUER_MYSQL,
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
    ) -> Result<Option<Token>, LockError> {
        let raw = with_reconnect(|| self.grant_statement(name, holder, ttl)).await?;
        raw.map(|t| {
            Token::try_from(t)
                .map_err(|e| LockError::protocol(self.issuer_name(), format!("token {t}: {e}")))
        })
        .transpose()
    }

    async fn grant_statement(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, (LockError, bool)> {
        match &self.pool {
            #[cfg(feature = "lease-postgres")]
            Pool::Postgres(pool) => sqlx::query_scalar(&self.sql.pg_acquire)
                .bind(name)
                .bind(holder)
                .bind(ttl.as_secs_f64())
                .bind(self.lock_delay.as_secs_f64())
                .bind(&*self.client_id)
                .fetch_optional(pool)
                .await
                .map_err(|e| self.err(e)),
            #[cfg(feature = "lease-mysql")]
            Pool::MySql(pool) => {
                let updated = sqlx::query(&self.sql.mysql_acquire)
                    .bind(holder)
                    .bind(&*self.client_id)
                    .bind(micros(ttl))
                    .bind(name)
                    .bind(micros(self.lock_delay))
                    .execute(pool)
                    .await
                    .map_err(|e| self.err(e))?;
                if updated.rows_affected() == 1 {
                    return Ok(Some(updated.last_insert_id() as i64));
                }
                let created = sqlx::query(&self.sql.mysql_create)
                    .bind(name)
                    .bind(holder)
                    .bind(&*self.client_id)
                    .bind(micros(ttl))
                    .execute(pool)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok((created.rows_affected() == 1).then_some(1))
            }
        }
    }

    async fn holder_statement(&self, name: &str) -> Result<Option<Holder>, (LockError, bool)> {
        let row: Option<(String, i64)> = match &self.pool {
            #[cfg(feature = "lease-postgres")]
            Pool::Postgres(pool) => sqlx::query_as(&self.sql.pg_holder)
                .bind(name)
                .fetch_optional(pool)
                .await
                .map_err(|e| self.err(e))?,
            #[cfg(feature = "lease-mysql")]
            Pool::MySql(pool) => sqlx::query_as::<_, (String, u64)>(&self.sql.mysql_holder)
                .bind(name)
                .fetch_optional(pool)
                .await
                .map_err(|e| self.err(e))?
                .map(|(c, t)| (c, t.min(i64::MAX as u64) as i64)),
        };
        match row {
            None => Ok(None),
            Some((client_id, token)) => {
                let token = Token::try_from(token).map_err(|e| {
                    (
                        LockError::protocol(self.issuer_name(), format!("token {token}: {e}")),
                        false,
                    )
                })?;
                Ok(Some(Holder { client_id, token }))
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
            %token,
            issuer = self.issuer_name(),
            "lease granted"
        );
        Ok(Some(Lease::new(NewLease {
            name: name.to_string(),
            issuer: self.issuer_name().to_string(),
            client_id: self.client_id.to_string(),
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

impl HolderLookup for LeaseTable {
    fn issuer(&self) -> &str {
        self.issuer_name()
    }

    /// One indexed `select` by primary key, judged by the database's clock.
    fn current_holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Holder>, LockError>> {
        async move { with_reconnect(|| self.holder_statement(name)).await }.boxed()
    }
}

impl LockService for LeaseTable {
    fn issuer(&self) -> &str {
        self.issuer_name()
    }

    fn client_id(&self) -> &str {
        &self.client_id
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
    token: Token,
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
        let sql = &self.table.sql;
        let rows = match (&self.table.pool, ttl) {
            #[cfg(feature = "lease-postgres")]
            (Pool::Postgres(pool), Some(ttl)) => sqlx::query(&sql.pg_renew)
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token.to_i64())
                .bind(ttl.as_secs_f64())
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            #[cfg(feature = "lease-postgres")]
            (Pool::Postgres(pool), None) => sqlx::query(&sql.pg_release)
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token.to_i64())
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            #[cfg(feature = "lease-mysql")]
            (Pool::MySql(pool), Some(ttl)) => sqlx::query(&sql.mysql_renew)
                .bind(micros(ttl))
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token.get())
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            #[cfg(feature = "lease-mysql")]
            (Pool::MySql(pool), None) => sqlx::query(&sql.mysql_release)
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token.get())
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

#[cfg(feature = "lease-mysql")]
fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
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
