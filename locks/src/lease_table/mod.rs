//! A lease table in SQL, on PostgreSQL (issuer `lease-postgres`, feature
//! `lease-postgres`) or on MySQL/MariaDB (issuer `lease-mysql`, feature
//! `lease-mysql`): one row per lock name,
//! `(name primary key, holder, client_id, login, token, expires_at, released, granted_at)`,
//! and a queue of waiters beside it, `<table>_waiters`, reached only
//! through the table's functions.
//!
//! # The tables and their functions
//! Every statement of the lock is the body of a function of the table,
//! `<table>_<verb>` (PostgreSQL: PL/pgSQL, `SECURITY DEFINER`; MariaDB:
//! stored functions, `SQL SECURITY DEFINER`), and the library sends their
//! calls. The functions run with their owner's rights, so a lock client
//! needs EXECUTE on them and no privilege on the tables (see "Rights").
//! PL/pgSQL keeps each statement's plan across calls, as a prepared
//! statement does (a `language sql` function is planned again at every
//! call).
//!
//! [`install_postgres`] / [`install_mysql`] ([`Install`]) create the tables
//! and functions and grant them: the operator's step, run as their owner.
//! The constructors ([`LeaseTable::postgres`], [`LeaseTable::mysql`]) look
//! first: functions of this version are used as they are (nothing is
//! created, no catalog is touched); otherwise, with creation on (the
//! default), they install them as the login they connect with (so a
//! superuser or owner login just works), and a login that may not (a lock
//! client) gets `InvalidConfig` naming what its owner must run. Tables made
//! by an earlier version get their new columns (on MariaDB also names
//! compared byte for byte). Nothing else: no migration bookkeeping that
//! could clash with the host application's own. The lease table is
//! `fencelock_leases` unless [`LeaseTableOptions::table`] says otherwise;
//! its queue is the same name with `_waiters`. To create them yourself
//! (with your own migrations), take the DDL from
//! [`postgres::Statements::ddl`] / [`mysql::Statements::ddl`] and turn
//! creation off with [`LeaseTableOptions::create_table`].
//!
//! # Rights
//! - A lock client (EXECUTE on the functions) takes, waits for, renews and
//!   releases leases, and nothing else: the database refuses its own
//!   `select`, `insert`, `update` and `delete` on both tables. A grant
//!   records the login it was made to (PostgreSQL `session_user`, MariaDB
//!   the user name; a hand-over, the waiter's login kept in its place), and
//!   renew, release and give back require that login: a lock client that
//!   learns another's holder id and token (a notification's payload is
//!   heard by any connection that listens) cannot end or extend that lease
//!   (the function refuses: PostgreSQL SQLSTATE 42501, MariaDB 42000).
//! - A reader (SELECT on the lease table, EXECUTE on the holder lookup)
//!   looks holders up ([`LeaseTable::postgres_reader`],
//!   [`LeaseTable::mysql_reader`]) and can do nothing else.
//! - What a lock client can still do: take a free lock out of turn (the
//!   non-fair grant looks at no queue), hold it for as long as it renews,
//!   and read every lock's holder and token through the holder lookup. It
//!   cannot move a token anywhere but up by one per grant.
//! - The PostgreSQL functions run with `search_path = pg_catalog, <their
//!   schema>, pg_temp`: a caller's temporary table cannot stand in for the
//!   lease table. Keep the schema's CREATE from lock clients (PostgreSQL 15
//!   grants none on `public`).
//!
//! # Grant
//! One atomic statement takes the row when it is free and adds one to its
//! token (the documentation of each dialect's `Statements` says why each is
//! atomic). Expiry is judged by the database's own clock (`now()`), never the
//! client's, so clients with skewed clocks still agree. `holder` is a random
//! id of the grant (what renew and release match); `client_id` is the
//! [`LockService::client_id`] of the holder, which [`HolderLookup`] reports.
//!
//! # Fairness
//! Fair (the default): first come, first served. A refused fair client takes
//! a place in `<table>_waiters` (a row with a ticket from an identity /
//! auto-increment column, and an `expires_at` by the database's clock, four
//! fallback polls ahead: 2 s by default), renewed by its later tries. The
//! grant is given only when the lock is free AND the caller holds the lowest
//! ticket among the places that have not lapsed (or nobody waits): a waiter
//! that stopped renewing its place (its process died or froze) is skipped as
//! soon as its place lapses, and its row is deleted by the next refused try.
//! The check of the queue and the grant of the row are one statement; the
//! safety of the grant does not depend on the queue (the row's condition,
//! evaluated under its lock, does), the order of grants does. A holder that
//! asks again right after its release queues behind the waiters.
//!
//! Non-fair ([`LeaseTable::non_fair`]): the grant looks at no queue; whoever
//! tries first when the row is free wins, usually the client that just
//! released. Fair and non-fair clients of one table exclude each other (one
//! row per name); a non-fair client can overtake the queue.
//!
//! # The uncontended path
//! Looking at the queue costs even when it is empty: on PostgreSQL, every
//! further table a statement touches (a subquery on the queue, a CTE that
//! could insert into it) made the pair of statements 3–5 % slower under
//! pgbench, and together they made an uncontended fair acquire+release
//! 0.85× of the lock before fairness. So a service remembers which locks
//! it saw contended (a try refused within the last 5 s), and otherwise
//! takes light statements: the first try is the grant alone
//! ([`postgres::Statements::acquire_light`]; fair:
//! [`postgres::Statements::acquire_fair_light`], the grant if the row's
//! `queued_until` has passed, see below), and a refusal is followed at once
//! by the statement that queues and says how long to wait. The release is
//! light ([`postgres::Statements::release_light`]: notify `*`, no look at
//! the queue) unless the holder is a fair waiter that was granted after
//! waiting, whose successors know they are behind it: its release names the
//! first one. A fair waiter's refused try answers whether a live place is
//! ahead of its own; while one is, a `*` does not wake it, so a light
//! release wakes the first in line and not the whole queue. The memory is
//! per service (per process): a holder that never waited releases lightly
//! even when other processes queue, which is what `*` is for.
//!
//! Whether anybody queues is read from the lease row itself: it carries
//! `queued_until`, an upper bound on when any place of its queue lapses,
//! raised in the same transaction that takes or renews a place (on
//! PostgreSQL by that statement, a CTE; on MariaDB by a `before insert`
//! trigger on the queue, since one statement there cannot write two
//! tables). Even an index probe of an empty queue cost the PostgreSQL pair
//! 3–5 %, and any subquery on the queue inside InnoDB's `update` about
//! 20 % (mariadb-slap). A fair first try of a lock not refused lately is the
//! grant with `queued_until` past ([`postgres::Statements::acquire_fair_light`],
//! [`mysql::Statements::acquire_fair_light`]): one row, no other table, and
//! it skips nobody, since a live place implies `queued_until` ahead. The
//! bound is never lowered, so for up to a place's life (2 s) after the last
//! waiter the light grant is refused needlessly and the statement that
//! looks at the queue follows. On MariaDB, a table without the trigger (a
//! server that refuses triggers) still works: the version function says
//! so, and the service always looks at the queue. The installs add what is
//! missing, and look first: `alter table` (and MariaDB's `create trigger`,
//! even `if not exists`, and `create or replace function`) takes an
//! exclusive lock, which waits for running statements (on MariaDB every
//! waiter blocked on a bell) and holds up every lock statement meanwhile,
//! so upgrade in a quiet moment (or run the DDL yourself).
//!
//! # Waiting
//! PostgreSQL notifies the waiters from the release statement, and a fair
//! release hands the lock to the first waiter in the same statement (see
//! [`postgres`]); MariaDB has no `LISTEN`, and its waiters block on the
//! holder's bell, a user lock (see [`mysql`]). Either way a waiter waits at
//! most the fallback poll (500 ms by default,
//! [`LeaseTable::with_poll_fallback`]) or until the holder's lease would
//! lapse (read from the refused grant), whichever is first, then tries
//! again: a lost notification costs at most that.
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
//! knows about; it lapses after the TTL (plus any lock-delay). A fair waiter
//! dropped midway leaves the queue in the background (or its place lapses).
//! A database that goes away during a hold fails the renewals; the lease's
//! validity passes and its lost signal fires.
//!
//! # Layout
//! - `mod.rs`: [`LeaseTable`] and its options, what both databases share
//!   (an acquire's request, the lease, the holder lookup, the retries), and
//!   the `Dialect` each of them implements.
//! - `grant.rs`: a lease's grant, renewed and released the same way on both
//!   databases but for the statements (`Held`).
//! - `queue.rs`: a fair waiter's place, and the memory of contended locks
//!   that picks the light statements.
//! - `install.rs`: [`Install`], what an install sets up and who it grants,
//!   and the refusals of a login that may not install.
//! - `sql.rs`: the placeholders of the SQL files, the version digest.
//! - `postgres/`: the PostgreSQL dialect (`mod.rs`), its `LISTEN`
//!   connection (`listen.rs`), its [`postgres::Statements`] and functions
//!   (`statements.rs`, from `sql/`), its install (`install.rs`).
//! - `mysql/`: the MySQL/MariaDB dialect (`mod.rs`), its bells (`bell.rs`),
//!   its [`mysql::Statements`] and functions (`statements.rs`, from `sql/`),
//!   its install (`install.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::time::Instant;

use crate::settings::{Configurable, Settings};
use crate::wake::{Queue, QueuePlace};
use crate::{
    validity_for, AcquireOptions, Fencing, Holder, HolderLookup, Lease, LockError, LockService,
    LockState, NewLease, Token, WaitCounters, WaitStats,
};

mod grant;
mod install;
#[cfg(feature = "lease-mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "lease-mysql")))]
pub mod mysql;
mod options;
#[cfg(feature = "lease-postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "lease-postgres")))]
pub mod postgres;
mod queue;
mod sql;

use grant::{Granted, Held, LeaseGrant};
#[cfg(feature = "lease-mysql")]
pub use install::install_mysql;
#[cfg(feature = "lease-postgres")]
pub use install::install_postgres;
pub use install::Install;
pub use options::LeaseTableOptions;
use queue::Contended;

pub const ISSUER_POSTGRES: &str = "lease-postgres";
pub const ISSUER_MYSQL: &str = "lease-mysql";

/// The table's name unless [`LeaseTableOptions::table`] says otherwise.
pub const DEFAULT_TABLE: &str = "fencelock_leases";

/// Connections per lease table's pool; also bounds the retries on dead ones.
const MAX_CONNECTIONS: u32 = 16;

/// How long connecting may take before the constructor says unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The longest a waiter waits for a notification (PostgreSQL) or the bell
/// (MariaDB) before it tries again anyway, unless
/// [`LeaseTable::with_poll_fallback`] says otherwise.
pub use crate::settings::DEFAULT_POLL_FALLBACK;
/// How many lock names a service remembers (MariaDB: as having a row; both:
/// as contended lately).
const KNOWN_ROWS: usize = 4096;
/// The longest suffix a table's name gets: its functions are
/// `<table>_<verb>`, its queue `<table>_waiters`, and every one of them
/// fits PostgreSQL's 63 bytes.
const LONGEST_SUFFIX: &str = "_release_light";
/// The longest a table name can be.
const MAX_TABLE_NAME: usize = 63 - LONGEST_SUFFIX.len();

impl LeaseTableOptions {
    /// Check the table's name, then connect a pool to `url`. No ping before
    /// every statement (it doubles the round trips): a connection that died
    /// is found by its statement failing, dropped by the pool, and the
    /// statement retried (see `with_reconnect`).
    async fn pool<DB: sqlx::Database>(
        &self,
        issuer: &str,
        url: &str,
    ) -> Result<sqlx::Pool<DB>, LockError> {
        validate_table(&self.table)?;
        sqlx::pool::PoolOptions::<DB>::new()
            .max_connections(self.max_connections)
            .acquire_timeout(CONNECT_TIMEOUT)
            .test_before_acquire(false)
            .connect(url)
            .await
            .map_err(|e| connect_error(issuer, url, e))
    }
}

fn validate_table(name: &str) -> Result<(), LockError> {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if first_ok
        && name.len() <= MAX_TABLE_NAME
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        Ok(())
    } else {
        Err(LockError::InvalidConfig(format!(
            "lease table name {name:?}: must match [A-Za-z_][A-Za-z0-9_]{{0,{}}} (its queue \
             table and its functions add suffixes, up to `{LONGEST_SUFFIX}`)",
            MAX_TABLE_NAME - 1
        )))
    }
}

/// What PostgreSQL and MySQL/MariaDB each do their own way: how an acquire
/// tries and waits, how a waiter leaves the queue, how the holder is looked
/// up. Each keeps its pool, its statements and its state of waiting, shared
/// by the clones of its [`LeaseTable`]; the settings (fairness, lock-delay,
/// client id, fallback poll) come from the table.
trait Dialect {
    const ISSUER: &'static str;

    /// A new acquire's id: the grant's holder, and the waiter's place.
    fn acquire_id(&self) -> Arc<str>;

    /// Try, and wait between tries, until granted or the wait runs out.
    async fn acquire(&self, acquire: &Request<'_>) -> Acquired;

    /// A fair waiter that was not granted gives its place up, through the
    /// pool.
    async fn leave(&self, table: &LeaseTable, name: &str, waiter: &str) -> Result<(), LockError>;

    /// One holder lookup statement: the row of `name`, if it has one.
    async fn lookup(&self, table: &LeaseTable, name: &str) -> Attempt<Option<Looked>>;
}

/// The database of a [`LeaseTable`], with its [`Dialect`].
#[derive(Clone)]
enum Database {
    #[cfg(feature = "lease-postgres")]
    Postgres(Arc<postgres::PgDialect>),
    #[cfg(feature = "lease-mysql")]
    MySql(Arc<mysql::MyDialect>),
}

/// `$call` with `$d` bound to the [`Dialect`] of `$table`.
macro_rules! dialect {
    ($table:expr, |$d:ident| $call:expr) => {
        match &$table.database {
            #[cfg(feature = "lease-postgres")]
            Database::Postgres($d) => $call,
            #[cfg(feature = "lease-mysql")]
            Database::MySql($d) => $call,
        }
    };
}

/// One acquire, as a dialect's tries see it.
struct Request<'a> {
    table: &'a LeaseTable,
    name: &'a str,
    opts: AcquireOptions,
    /// The grant's holder id, and the waiter's place's.
    id: &'a Arc<str>,
    /// No try sent yet.
    first: AtomicBool,
}

impl Request<'_> {
    /// The acquire may wait (a fair one takes a place).
    fn queue(&self) -> bool {
        !self.opts.wait.is_zero()
    }

    /// Whether the try about to be sent takes the uncontended path: the
    /// first of an acquire, and every try of a try-lock. A waiter's later
    /// tries look for their own place at the head of the queue.
    fn first_try(&self) -> bool {
        self.first.swap(false, Ordering::Relaxed) || !self.queue()
    }

    /// The lease for a grant of this acquire with token `token` (`held`
    /// renews and releases it), asked for at `requested_at`.
    fn lease<H: Held>(&self, requested_at: Instant, token: Token, held: H) -> Lease {
        let table = self.table;
        tracing::debug!(
            lock = self.name,
            %token,
            issuer = table.issuer_name(),
            fair = table.settings.is_fair(),
            "lease granted"
        );
        let grant = LeaseGrant {
            granted: Granted {
                table: table.clone(),
                name: self.name.to_string(),
                holder: self.id.to_string(),
                token,
            },
            held,
        };
        Lease::new(NewLease {
            name: self.name.to_string(),
            issuer: table.issuer_name().to_string(),
            client_id: table.settings.client_id().to_string(),
            fencing: Fencing::Token(token),
            ttl: self.opts.ttl,
            requested_at,
            validity: Some(validity_for(self.opts.ttl)),
            auto_renew: self.opts.auto_renew,
            grant: Arc::new(grant),
            lost_trigger: None,
        })
    }
}

/// What a dialect's acquire ended with.
struct Acquired {
    lease: Result<Lease, LockError>,
    /// Not granted, and the waiter's place was given up already (on the
    /// acquire's own connection).
    left_queue: bool,
}

/// A statement's answer; on failure, the error and whether another try
/// (on another connection) can help.
type Attempt<T> = Result<T, (LockError, bool)>;

/// A lock service on a SQL lease table. Cheap to clone (shares the pool,
/// the `LISTEN` connection and the wait counters). Fair unless
/// [`LeaseTable::non_fair`].
///
/// Share one per process (clone it, with [`LeaseTable::with_client_id`] per
/// task if they need their own ids): each service keeps its own pool and,
/// on PostgreSQL, its own `LISTEN` connection, which every notifying commit
/// of the database wakes. Three workers on one hot PostgreSQL page made
/// 0.84× one worker's edits sharing one service and 0.73–0.76× with one
/// each (docs/BENCHMARKS.md, "Fair locks on a hot page").
#[derive(Clone)]
pub struct LeaseTable {
    database: Database,
    lock_delay: Duration,
    settings: Settings,
    shared: Arc<Shared>,
}

/// What the clones of a [`LeaseTable`] share besides the database's state.
#[derive(Default)]
struct Shared {
    counters: WaitCounters,
    /// Statements sent (see [`LeaseTable::statements_sent`]).
    statements: AtomicU64,
    /// Lock names refused lately: their acquires (PostgreSQL: and releases)
    /// take the statements made for contention.
    contended: Contended,
}

impl std::fmt::Debug for LeaseTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseTable")
            .field("issuer", &self.issuer_name())
            .field("client_id", &self.settings.client_id())
            .field("lock_delay", &self.lock_delay)
            .field("fair", &self.settings.is_fair())
            .finish()
    }
}

impl LeaseTable {
    /// Connect to PostgreSQL at `url` and create the tables `fencelock_leases`
    /// and `fencelock_leases_waiters` if they are missing. Fails fast: a
    /// malformed URL is `InvalidConfig`, an unreachable server `Unavailable`
    /// within a few seconds. Fair; see [`LeaseTable::non_fair`].
    #[cfg(feature = "lease-postgres")]
    pub async fn postgres(url: &str) -> Result<LeaseTable, LockError> {
        Self::postgres_with(url, LeaseTableOptions::default()).await
    }

    /// Connect to MySQL/MariaDB at `url` and create the tables if they are
    /// missing. Same errors as [`LeaseTable::postgres`].
    #[cfg(feature = "lease-mysql")]
    pub async fn mysql(url: &str) -> Result<LeaseTable, LockError> {
        Self::mysql_with(url, LeaseTableOptions::default()).await
    }

    fn new(database: Database) -> LeaseTable {
        LeaseTable {
            database,
            lock_delay: Duration::ZERO,
            settings: Settings::default(),
            shared: Arc::default(),
        }
    }

    /// After a lease lapses without a release, nobody gets the lock until
    /// `expires_at + delay` (by the database's clock). Zero by default.
    pub fn with_lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = delay;
        self
    }

    /// Record `id` as this client's id in every grant (see
    /// [`LockService::client_id`]).
    pub fn with_client_id(self, id: impl Into<String>) -> Result<Self, LockError> {
        self.set_client_id(id)
    }

    /// The non-fair variant: the grant looks at no queue (see the module
    /// docs, "Fairness"). Kept for the comparison; the worker uses it with
    /// `--fair false`.
    pub fn non_fair(self) -> Self {
        self.set_fair(false)
    }

    /// The fair variant (the default).
    pub fn fair(self) -> Self {
        self.set_fair(true)
    }

    pub fn is_fair(&self) -> bool {
        self.settings.is_fair()
    }

    /// The longest a waiter waits for a notification or the bell before it
    /// tries again anyway (default 500 ms, at least 1 ms). A fair waiter's
    /// place lasts four of these without a renewal.
    pub fn with_poll_fallback(self, fallback: Duration) -> Self {
        self.set_poll_fallback(fallback)
    }

    /// How this service's waiters waited so far (shared by its clones).
    pub fn wait_stats(&self) -> WaitStats {
        self.shared.counters.snapshot()
    }

    /// How many statements this service (and its clones) sent to the
    /// database so far: tries, places, waits, renewals, releases, lookups,
    /// background ones included (each one round trip; not the start of
    /// PostgreSQL's `LISTEN` connection, which is kept). For tests and
    /// benchmarks: divided by the grants, the statements a hand-over costs.
    pub fn statements_sent(&self) -> u64 {
        self.shared.statements.load(Ordering::Relaxed)
    }

    fn sent(&self, n: u64) {
        self.shared.statements.fetch_add(n, Ordering::Relaxed);
    }

    fn issuer_name(&self) -> &'static str {
        fn issuer<D: Dialect>(_: &D) -> &'static str {
            D::ISSUER
        }
        dialect!(self, |d| issuer(&**d))
    }

    /// The typed error, and whether trying again can help: the connection is
    /// dead (the pool drops it, the next try gets another) or the statement
    /// lost a deadlock and was rolled back.
    fn err(&self, e: sqlx::Error) -> (LockError, bool) {
        let retry = matches!(e, sqlx::Error::Io(_))
            || matches!(&e, sqlx::Error::Database(d) if d.code().is_some_and(|c| {
                c.starts_with("57P") || c == "40P01" || c == "40001" || c == "1213"
            }));
        (db_error(self.issuer_name(), e), retry)
    }

    /// The token `t` that a statement answered (MariaDB's column is
    /// unsigned), checked.
    fn token<T>(&self, t: T) -> Result<Token, LockError>
    where
        T: Copy + std::fmt::Display,
        Token: TryFrom<T, Error = crate::TokenError>,
    {
        Token::try_from(t)
            .map_err(|e| LockError::protocol(self.issuer_name(), format!("token {t}: {e}")))
    }

    /// The lock `name` as its row says: one indexed `select` by primary key
    /// (a function's, or the reader's own), judged by the database's clock,
    /// whatever the variant (fair or not) that holds the lease. No row:
    /// never granted, so nothing minted.
    async fn lookup(&self, name: &str) -> Result<LockState, LockError> {
        let row = with_reconnect(|| async {
            self.sent(1);
            dialect!(self, |d| d.lookup(self, name).await)
        })
        .await?;
        let Some(row) = row else {
            return Ok(LockState {
                holder: None,
                minted: Some(Token::MIN),
            });
        };
        let token = self.token(row.token)?;
        Ok(LockState {
            holder: row.held.then_some(Holder {
                client_id: row.client_id,
                token,
            }),
            minted: Some(token),
        })
    }

    async fn acquire_waiting(&self, name: &str, opts: AcquireOptions) -> Result<Lease, LockError> {
        let id = dialect!(self, |d| d.acquire_id());
        let request = Request {
            table: self,
            name,
            opts,
            id: &id,
            first: AtomicBool::new(true),
        };
        let place = QueuePlace::new(
            (self.settings.is_fair() && request.queue()).then(|| self.clone()),
            name,
            id.clone(),
        );
        let acquired = dialect!(self, |d| d.acquire(&request).await);
        place
            .settle(acquired.lease.is_ok() || acquired.left_queue)
            .await;
        acquired.lease
    }

    /// A fair waiter that was not granted gives its place up (best effort:
    /// otherwise it lapses).
    async fn leave(&self, name: &str, waiter: &str) {
        if let Err(e) = dialect!(self, |d| d.leave(self, name, waiter).await) {
            tracing::debug!(
                lock = name,
                "leaving the queue failed (the place lapses): {e}"
            );
        }
    }
}

impl Configurable for LeaseTable {
    fn settings_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }
}

impl Queue for LeaseTable {
    async fn leave(&self, name: &str, waiter: &str) {
        LeaseTable::leave(self, name, waiter).await
    }
}

impl HolderLookup for LeaseTable {
    fn issuer(&self) -> &str {
        self.issuer_name()
    }

    /// One statement: the lease row, by primary key.
    fn current_holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Holder>, LockError>> {
        async move { Ok(self.lookup(name).await?.holder) }.boxed()
    }

    /// The holder and the row's token, which is the highest minted for
    /// `name` (0 when it was never granted), in one statement.
    fn state<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LockState, LockError>> {
        self.lookup(name).boxed()
    }

    /// The row's token: the highest minted for `name` (0 when it was never
    /// granted).
    fn minted<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Token>, LockError>> {
        async move { Ok(self.lookup(name).await?.minted) }.boxed()
    }
}

impl LockService for LeaseTable {
    fn issuer(&self) -> &str {
        self.issuer_name()
    }

    fn client_id(&self) -> &str {
        self.settings.client_id()
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
            self.acquire_waiting(name, opts).await
        }
        .boxed()
    }
}

/// A lease row, as a holder lookup reads it.
struct Looked {
    client_id: String,
    /// The last grant's (MariaDB's unsigned column, capped at `i64::MAX`).
    token: i64,
    /// A lease holds it: neither released nor lapsed.
    held: bool,
}

/// Run `statement` again when it failed in a way that another try can fix:
/// on a connection that turned out dead (the pool does not ping before
/// handing one out, and after a database restart its idle connections are
/// all dead, so up to one try per pooled connection plus a fresh one: three
/// tries were not enough after a MariaDB restart), or rolled back as a
/// deadlock victim. A failed connection is closed by the pool, so the next try
/// gets another or a new one. Retrying is safe: a grant that did reach the
/// database under the same holder id is seen as held (not granted twice) and
/// lapses after its TTL; renew and release are idempotent.
async fn with_reconnect<T, F, Fut>(mut statement: F) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Attempt<T>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match statement().await {
            Ok(v) => return Ok(v),
            Err((e, retry)) if retry && tries <= MAX_CONNECTIONS => {
                tracing::debug!("retrying on another connection: {e}");
            }
            Err((e, _)) => return Err(e),
        }
    }
}

fn connect_error(issuer: &str, url: &str, e: sqlx::Error) -> LockError {
    match e {
        // Never the password, nor a driver's message quoting it.
        sqlx::Error::Configuration(c) => LockError::InvalidConfig(crate::scrub_secrets(
            &format!("{issuer} url {:?}: {c}", crate::redact_url(url)),
            url,
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_leave_room_for_the_queue_table() {
        assert_eq!(validate_table(&"a".repeat(49)), Ok(()));
        assert!(validate_table(&"a".repeat(50)).is_err());
        assert!(validate_table("1abc").is_err());
        assert!(validate_table("a-b").is_err());
    }

    #[test]
    fn a_bad_url_is_named_without_its_password() {
        let url = "postgres://u:s3cret@h:5432/db?sslpassword=other";
        let e = sqlx::Error::Configuration(format!("cannot parse {url}").into());
        let LockError::InvalidConfig(message) = connect_error("lease-postgres", url, e) else {
            panic!("not InvalidConfig");
        };
        assert!(
            !message.contains("s3cret") && !message.contains("other"),
            "{message}"
        );
        assert!(message.contains("postgres://u:***@h:5432/db"), "{message}");
    }
}
