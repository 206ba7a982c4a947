//! A lease table in SQL, on PostgreSQL (issuer `lease-postgres`, feature
//! `lease-postgres`) or on MySQL/MariaDB (issuer `lease-mysql`, feature
//! `lease-mysql`): one row per lock name,
//! `(name primary key, holder, client_id, token, expires_at, released, granted_at)`,
//! and a queue of waiters beside it, `<table>_waiters`.
//!
//! # The tables
//! The constructors create the tables if they are missing (`create table if
//! not exists`, nothing else: no migration bookkeeping that could clash with
//! the host application's own). The lease table is `fencelock_leases` unless
//! [`LeaseTableOptions::table`] says otherwise; its queue is the same name
//! with `_waiters`. To create them yourself (with your own migrations), take
//! the DDL from [`Statements::postgres_ddl`] / [`Statements::mysql_ddl`] and
//! turn creation off with [`LeaseTableOptions::create_table`].
//!
//! # Grant
//! One atomic statement takes the row when it is free and adds one to its
//! token (see the comments in [`Statements`] for why each is atomic). Expiry
//! is judged by the database's own clock (`now()`), never the client's, so
//! clients with skewed clocks still agree. `holder` is a random id of the
//! grant (what renew and release match); `client_id` is the
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
//! # Waiting: PostgreSQL is notified, MariaDB rings a bell
//! PostgreSQL: the release statement itself calls `pg_notify` (channel: the
//! table's name; payload: the first live waiter's id, or `*`, and the lock's
//! name). In the statement rather than in a trigger: no function or trigger
//! to create beside the table (the host application's migrations own its
//! schema, and a trigger would also fire on grants and renewals unless
//! filtered), and only a release that matched our holder notifies. `NOTIFY`
//! is transactional either way: it is delivered when the release commits.
//! One `LISTEN`ing connection per [`LeaseTable`] (taken from its pool at the
//! first contended acquire, kept) routes the notifications to this process's
//! waiters; a refused waiter starts it before its second try, so a release
//! between its first try and its wait is not missed. When that connection is
//! lost every waiter is woken (a notification may have been lost with it).
//!
//! MariaDB has no `LISTEN`. The holder's grant statement takes a user-level
//! lock, the *bell* (`GET_LOCK('fencelock:<md5 of database/table/name>')`,
//! inside the `update`, evaluated only for the row it grants), on a pool
//! connection that the lease keeps until its release, whose statement
//! `RELEASE_LOCK`s it. A refused waiter blocks in `GET_LOCK` on the bell (and
//! releases it in the same statement), bounded by the holder's `expires_at`
//! as the database says it and by the fallback poll: the release wakes it at
//! once, with no polling while the lock is held. When no bell is held
//! (a holder whose connection died, or a grant that raced a waiter for the
//! bell), the waiter sees the bell free twice for the same token and polls
//! every 20 ms until that lease ends. The cost: every held lease pins one
//! pool connection, and each waiter one while it waits.
//!
//! Either way a waiter waits at most the fallback poll (500 ms by default,
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

use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(feature = "lease-postgres")]
use std::sync::Weak;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
#[cfg(feature = "lease-mysql")]
use sqlx::mysql::{MySql, MySqlPool, MySqlPoolOptions};
#[cfg(feature = "lease-mysql")]
use sqlx::pool::PoolConnection;
#[cfg(feature = "lease-postgres")]
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
#[cfg(feature = "lease-postgres")]
use tokio::sync::oneshot;
use tokio::time::Instant;

#[cfg(feature = "lease-postgres")]
use crate::wake::{Registration, Wakers};
use crate::{
    default_client_id, validate_client_id, validity_for, wait_for_grant, AcquireOptions, Fencing,
    Grant, Holder, HolderLookup, Lease, LockError, LockService, NewLease, Token, Try, WaitCounters,
    WaitStats, Waiter,
};

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
pub const DEFAULT_POLL_FALLBACK: Duration = Duration::from_millis(500);
/// A fair waiter's place lasts this many fallback polls without a renewal.
const PLACE_POLLS: u32 = 4;
/// MariaDB: how often a waiter polls while the holder rings no bell.
#[cfg(feature = "lease-mysql")]
const BELL_LESS_POLL: Duration = Duration::from_millis(20);
/// After the `LISTEN` connection failed, waiters poll this long before it is
/// tried again.
#[cfg(feature = "lease-postgres")]
const LISTEN_RETRY: Duration = Duration::from_secs(1);
/// The longest a table name can be: its queue adds `_waiters`.
const MAX_TABLE_NAME: usize = 63 - "_waiters".len();

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
    /// The table's name: `[A-Za-z_][A-Za-z0-9_]*`, at most 55 bytes (checked
    /// by the constructor, since it is written into the SQL; its queue table
    /// adds `_waiters`).
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// Whether the constructor runs `create table if not exists` (default
    /// true). Turn it off when your own migrations create the tables from
    /// [`Statements::postgres_ddl`] or [`Statements::mysql_ddl`].
    pub fn create_table(mut self, on: bool) -> Self {
        self.create_table = on;
        self
    }

    /// Size of the connection pool (default 16). Waiting takes connections
    /// too: PostgreSQL keeps one for `LISTEN` once somebody waited; on
    /// MariaDB every held lease keeps one (its bell) and every waiter uses
    /// one while it waits.
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
    if first_ok
        && name.len() <= MAX_TABLE_NAME
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        Ok(())
    } else {
        Err(LockError::InvalidConfig(format!(
            "lease table name {name:?}: must match [A-Za-z_][A-Za-z0-9_]{{0,{}}} (its queue \
             table adds `_waiters`)",
            MAX_TABLE_NAME - 1
        )))
    }
}

/// Every statement of the lease table, for one table name. The grant texts
/// are also what the benchmarks run through pgbench and mariadb-slap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statements {
    /// PostgreSQL non-fair grant. `$1` name, `$2` holder, `$3` TTL in
    /// seconds, `$4` lock-delay in seconds, `$5` client id. Returns one row:
    /// `token` (the new token, or null when the lock is taken) and
    /// `wait_secs` (how long the current lease still runs, by the
    /// database's clock; the waiter's bound).
    ///
    /// Atomic because `insert ... on conflict do update` either inserts the
    /// row (the primary key lets exactly one concurrent insert win) or locks
    /// the existing row and evaluates the `where` against its latest committed
    /// version: of two concurrent acquirers, the second waits for the first's
    /// row lock, then sees the new `expires_at` and updates nothing.
    pub pg_acquire: String,
    /// PostgreSQL fair grant: `$1`..`$5` as [`Statements::pg_acquire`], `$6`
    /// how long a place in the queue lasts, in seconds (0: do not queue).
    /// Same answer.
    ///
    /// One statement: `first` reads the first live waiter (lowest ticket,
    /// place not lapsed); `granted` is the grant of `pg_acquire`, given only
    /// when nobody waits or the caller is `first`; then, granted, the
    /// caller's place is deleted, or, refused, the caller's is taken or
    /// renewed; either way the lapsed places of others are deleted. The grant's atomicity
    /// is `pg_acquire`'s: the row's condition is evaluated under its lock.
    /// The queue is read from the statement's snapshot, which orders grants
    /// but is not needed for their safety.
    pub pg_acquire_fair: String,
    /// PostgreSQL fair grant, first try: [`Statements::pg_acquire`] given
    /// only when nobody waits (no live place in the queue). The uncontended
    /// path of the fair lock: one index probe more than the non-fair grant.
    /// Refused, the waiter's next tries run [`Statements::pg_acquire_fair`].
    pub pg_acquire_fair_first: String,
    /// PostgreSQL renew: `$1` name, `$2` holder, `$3` token, `$4` TTL in seconds.
    pub pg_renew: String,
    /// PostgreSQL release: `$1` name, `$2` holder, `$3` token. Keeps the row.
    /// Answers 1 when released, 0 when the row was no longer ours; a release
    /// notifies the table's channel (payload `<first live waiter or *> <name>`),
    /// delivered at commit.
    pub pg_release: String,
    /// PostgreSQL: a fair waiter that gives up deletes its place (`$1` name,
    /// `$2` waiter) and, if it was first and the lock is free, wakes the others.
    pub pg_leave: String,
    /// PostgreSQL holder lookup: `$1` name. The client id and token of a lease
    /// that is neither released nor lapsed, by the database's clock.
    pub pg_holder: String,
    /// MySQL/MariaDB non-fair grant of an existing row. Binds: holder (twice),
    /// client id, TTL in µs, name, lock-delay in µs. Granted when one row is
    /// affected. The token comes back through `last_insert_id(expr)`, which
    /// the server returns in the statement's OK packet, so the grant and the
    /// token read are the same statement. The granted row's `GET_LOCK` of
    /// its bell runs in the same statement, on the connection that keeps it.
    ///
    /// Atomic because an InnoDB `update` takes the row's exclusive lock and
    /// evaluates its `where` on the latest committed version (a locking read,
    /// not the snapshot): of two concurrent acquirers, the second waits for
    /// the first's lock, then sees the new `expires_at` and matches nothing.
    /// The `set` list reads only the row's old values (MySQL assigns left to
    /// right, so no assignment here refers to a column assigned before it).
    pub mysql_acquire: String,
    /// MySQL/MariaDB fair grant: binds as [`Statements::mysql_acquire`], then
    /// the name and the holder (as waiter id) twice. The same update, which
    /// also requires that nobody waits or the caller is the first live waiter
    /// (the subquery reads the queue; the row's condition, under its lock,
    /// keeps the grant atomic as above).
    pub mysql_acquire_fair: String,
    /// MySQL/MariaDB fair grant, first try: binds as
    /// [`Statements::mysql_acquire`]; given only when nobody waits.
    pub mysql_acquire_fair_first: String,
    /// MySQL/MariaDB first grant of a name: the primary key lets exactly one
    /// concurrent insert win; the others are ignored (0 rows) and retry the
    /// update above on their next attempt. Binds: name, holder, client id,
    /// TTL in µs.
    pub mysql_create: String,
    /// MySQL/MariaDB: take the bell of a name (bind: name) after its first
    /// grant, on the connection that keeps it.
    pub mysql_ring: String,
    /// MySQL/MariaDB: give the bell back (bind: name), when a release found
    /// the row no longer ours.
    pub mysql_unring: String,
    /// MySQL/MariaDB waiter: wait for the bell. Binds: lock-delay in µs, the
    /// longest wait in seconds, lock-delay in µs, waiter id, name (the bell),
    /// name (the row). Answers, read before it blocks, the holder's `token`,
    /// whether the lease is `held` and whether the bell was free; then
    /// whether the bell was got (`rang`; released at once); then, after the
    /// wait, whether it is the waiter's turn (`my_turn`: it is the first live
    /// waiter, or nobody queues). It blocks at most until the lease's
    /// `expires_at`. (MariaDB evaluates a select list left to right.)
    pub mysql_wait: String,
    /// MySQL/MariaDB: take or renew a place in the queue. Binds: name, waiter
    /// id, how long the place lasts in µs.
    pub mysql_queue: String,
    /// MySQL/MariaDB: delete a waiter's place (binds: name, waiter id), when
    /// it was granted or gave up, and the lapsed places of the name.
    pub mysql_leave: String,
    /// MySQL/MariaDB renew: TTL in µs, name, holder, token; only while not lapsed.
    pub mysql_renew: String,
    /// MySQL/MariaDB release: name, holder, token. Keeps the row; rings the
    /// bell (`RELEASE_LOCK`, a no-op on another connection than the grant's).
    pub mysql_release: String,
    /// MySQL/MariaDB holder lookup: name.
    pub mysql_holder: String,
}

/// The bell's name for the lock in column or placeholder `name`: at most 64
/// characters whatever the lock's name, and distinct per database and table.
fn bell(table: &str, name: &str) -> String {
    format!("concat('fencelock:', md5(concat(database(), '/{table}/', {name})))")
}

impl Statements {
    /// The statements for table `table` (not validated here; the
    /// constructors validate it).
    pub fn for_table(table: &str) -> Statements {
        let t = table;
        let pg_grant = format!(
            "
  insert into {t} as l (name, holder, client_id, token, expires_at, released, granted_at)
  SOURCE
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
        );
        let pg_held_for = format!(
            "(select extract(epoch from l.expires_at
                 + case when l.released then interval '0' else make_interval(secs => $4) end
                 - now())::float8
     from {t} l where l.name = $1)"
        );
        let bell_row = bell(t, "l.name");
        let mysql_set = format!(
            "
update {t} l
   set l.token = last_insert_id(l.token + 1),
       -- Both branches are the holder: the `if` is there to take the bell
       -- (GET_LOCK, waiting at most 5 ms for a waiter that holds it for an
       -- instant), and only for the row this statement grants.
       l.holder = if(get_lock({bell_row}, 0.005) >= 0, ?, ?),
       l.client_id = ?,
       l.expires_at = now(6) + interval ? microsecond,
       l.released = false,
       l.granted_at = now(6)
 where l.name = ?
   and ((l.released and l.expires_at <= now(6))
     or (not l.released and l.expires_at + interval ? microsecond <= now(6)))"
        );
        Statements {
            pg_acquire: format!(
                "
with granted as ({}
)
select (select token from granted) as token,
       {pg_held_for} as wait_secs",
                pg_grant.replace(
                    "SOURCE",
                    "values ($1, $2, $5, 1, now() + make_interval(secs => $3), false, now())"
                )
            ),
            pg_acquire_fair_first: format!(
                "
with granted as ({}
)
select (select token from granted) as token,
       {pg_held_for} as wait_secs",
                pg_grant.replace(
                    "SOURCE",
                    &format!(
                        "select $1, $2, $5, 1, now() + make_interval(secs => $3), false, now()
   where not exists (select 1 from {t}_waiters w
                      where w.name = $1 and w.expires_at > now())"
                    )
                )
            ),
            pg_acquire_fair: format!(
                "
with first as (
  select w.waiter, w.expires_at from {t}_waiters w
   where w.name = $1 and w.expires_at > now()
   order by w.ticket limit 1
),
granted as ({}
),
served as (
  delete from {t}_waiters w
   where w.name = $1 and w.waiter = $2 and exists (select 1 from granted)
),
purged as (
  delete from {t}_waiters w
   where w.name = $1 and w.expires_at <= now() and w.waiter <> $2
),
queued as (
  insert into {t}_waiters (name, waiter, expires_at)
  select $1, $2, now() + make_interval(secs => $6)
   where $6 > 0 and not exists (select 1 from granted)
  on conflict (name, waiter) do update set expires_at = excluded.expires_at
)
select (select token from granted) as token,
       greatest({pg_held_for},
                (select extract(epoch from f.expires_at - now())::float8
                   from first f where f.waiter <> $2)) as wait_secs",
                pg_grant.replace(
                    "SOURCE",
                    "select $1, $2, $5, 1, now() + make_interval(secs => $3), false, now()
   where coalesce((select waiter from first), $2) = $2"
                )
            ),
            pg_renew: format!(
                "
update {t} set expires_at = now() + make_interval(secs => $4)
 where name = $1 and holder = $2 and token = $3
   and not released and expires_at > now()"
            ),
            pg_release: format!(
                "
with released as (
  update {t} set expires_at = now(), released = true
   where name = $1 and holder = $2 and token = $3
     and not released and expires_at > now()
  returning name
),
notified as (
  select pg_notify('{t}', coalesce(
           (select w.waiter from {t}_waiters w
             where w.name = r.name and w.expires_at > now()
             order by w.ticket limit 1), '*') || ' ' || r.name)
    from released r
)
select (select count(*) from notified) as released"
            ),
            pg_leave: format!(
                "
with gone as (
  delete from {t}_waiters where name = $1 and waiter = $2 returning ticket
),
notified as (
  select pg_notify('{t}', '* ' || $1) from gone g
   where not exists (select 1 from {t}_waiters w
                      where w.name = $1 and w.ticket < g.ticket and w.expires_at > now())
)
select (select count(*) from notified) as notified"
            ),
            pg_holder: format!(
                "
select client_id, token from {t}
 where name = $1 and not released and expires_at > now()"
            ),
            mysql_acquire_fair: format!(
                "{mysql_set}
   and coalesce((select w.waiter from {t}_waiters w
                  where w.name = ? and w.expires_at > now(6)
                  order by w.ticket limit 1), ?) = ?"
            ),
            mysql_acquire_fair_first: format!(
                "{mysql_set}
   and not exists (select 1 from {t}_waiters w
                    where w.name = l.name and w.expires_at > now(6))"
            ),
            mysql_acquire: mysql_set,
            mysql_create: format!(
                "
insert ignore into {t} (name, holder, client_id, token, expires_at, released, granted_at)
values (?, ?, ?, 1, now(6) + interval ? microsecond, false, now(6))"
            ),
            mysql_ring: format!("select get_lock({}, 0)", bell(t, "?")),
            mysql_unring: format!("select release_lock({})", bell(t, "?")),
            mysql_wait: format!(
                "
select l.token,
       not l.released and l.expires_at + interval ? microsecond > now(6) as held,
       is_free_lock(b.bell) as bell_free,
       get_lock(b.bell, least(?, greatest(0, timestampdiff(microsecond, now(6),
         l.expires_at + interval ? microsecond) / 1000000))) as rang,
       release_lock(b.bell) as let_go,
       -- After the wait: the releaser deleted its place before it rang.
       coalesce((select w.waiter = ? from {t}_waiters w
                  where w.name = l.name and w.expires_at > now(6)
                  order by w.ticket limit 1), true) as my_turn
  from {t} l, (select {} as bell) b
 where l.name = ?",
                bell(t, "?")
            ),
            mysql_queue: format!(
                "
insert into {t}_waiters (name, waiter, expires_at)
values (?, ?, now(6) + interval ? microsecond)
on duplicate key update expires_at = values(expires_at)"
            ),
            mysql_leave: format!(
                "delete from {t}_waiters where name = ? and (waiter = ? or expires_at <= now(6))"
            ),
            mysql_renew: format!(
                "
update {t} set expires_at = now(6) + interval ? microsecond
 where name = ? and holder = ? and token = ?
   and not released and expires_at > now(6)"
            ),
            mysql_release: format!(
                "
update {t} l
   set l.expires_at = now(6),
       l.released = true,
       -- Unchanged: the `if` rings the bell (RELEASE_LOCK) for the row
       -- this statement releases, and only for it.
       l.holder = if(release_lock({bell_row}) >= 0, l.holder, l.holder)
 where l.name = ? and l.holder = ? and l.token = ?
   and not l.released and l.expires_at > now(6)"
            ),
            mysql_holder: format!(
                "
select client_id, token from {t}
 where name = ? and not released and expires_at > now(6)"
            ),
        }
    }

    /// The PostgreSQL tables, for your own migrations: the statements of
    /// [`Statements::postgres_ddl_statements`], separated by `;`.
    pub fn postgres_ddl(table: &str) -> String {
        Self::postgres_ddl_statements(table).join(";\n\n")
    }

    /// The PostgreSQL tables, one statement each: the leases, then their queue.
    pub fn postgres_ddl_statements(table: &str) -> Vec<String> {
        vec![
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
            ),
            format!(
                "-- The fair queue: one row per waiting client, first come (lowest
-- ticket) first served; a place lapses at expires_at unless its waiter
-- renews it, and lapsed places are skipped.
create table if not exists {table}_waiters (
    name       text        not null,
    ticket     bigint      generated always as identity,
    waiter     text        not null,
    expires_at timestamptz not null,
    primary key (name, ticket),
    unique (name, waiter)
)"
            ),
        ]
    }

    /// The MySQL/MariaDB tables, for your own migrations: the statements of
    /// [`Statements::mysql_ddl_statements`], separated by `;`.
    pub fn mysql_ddl(table: &str) -> String {
        Self::mysql_ddl_statements(table).join(";\n\n")
    }

    /// The MySQL/MariaDB tables, one statement each.
    pub fn mysql_ddl_statements(table: &str) -> Vec<String> {
        vec![
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
            ),
            format!(
                "create table if not exists {table}_waiters (
    name       varchar(255)    not null,
    ticket     bigint unsigned not null auto_increment,
    waiter     varchar(64)     not null,
    expires_at datetime(6)     not null,
    primary key (name, ticket),
    unique key (name, waiter),
    key (ticket)
) engine = InnoDB"
            ),
        ]
    }
}

#[derive(Clone)]
enum Pool {
    #[cfg(feature = "lease-postgres")]
    Postgres(PgPool),
    #[cfg(feature = "lease-mysql")]
    MySql(MySqlPool),
}

/// A lock service on a SQL lease table. Cheap to clone (shares the pool,
/// the `LISTEN` connection and the wait counters). Fair unless
/// [`LeaseTable::non_fair`].
#[derive(Clone)]
pub struct LeaseTable {
    pool: Pool,
    sql: Arc<Statements>,
    lock_delay: Duration,
    client_id: Arc<str>,
    fair: bool,
    poll_fallback: Duration,
    shared: Arc<Shared>,
}

/// What the clones of a [`LeaseTable`] share besides the pool.
struct Shared {
    counters: WaitCounters,
    #[cfg(feature = "lease-postgres")]
    listen: Arc<Listen>,
}

impl std::fmt::Debug for LeaseTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseTable")
            .field("issuer", &self.issuer_name())
            .field("client_id", &self.client_id)
            .field("lock_delay", &self.lock_delay)
            .field("fair", &self.fair)
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
            let create = async {
                let mut tx = pool.begin().await?;
                sqlx::query("select pg_advisory_xact_lock(hashtext($1))")
                    .bind(format!("fencelock create {}", options.table))
                    .execute(&mut *tx)
                    .await?;
                for ddl in Statements::postgres_ddl_statements(&options.table) {
                    sqlx::query(&ddl).execute(&mut *tx).await?;
                }
                tx.commit().await
            };
            create.await.map_err(|e| {
                LockError::unavailable(ISSUER_POSTGRES, format!("create lease table: {e}"))
            })?;
        }
        Ok(LeaseTable::new(Pool::Postgres(pool), &options.table))
    }

    /// Connect to MySQL/MariaDB at `url` and create the tables if they are
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
            for ddl in Statements::mysql_ddl_statements(&options.table) {
                sqlx::query(&ddl).execute(&pool).await.map_err(|e| {
                    LockError::unavailable(ISSUER_MYSQL, format!("create lease table: {e}"))
                })?;
            }
        }
        Ok(LeaseTable::new(Pool::MySql(pool), &options.table))
    }

    fn new(pool: Pool, table: &str) -> LeaseTable {
        LeaseTable {
            pool,
            sql: Arc::new(Statements::for_table(table)),
            lock_delay: Duration::ZERO,
            client_id: default_client_id().into(),
            fair: true,
            poll_fallback: DEFAULT_POLL_FALLBACK,
            shared: Arc::new(Shared {
                counters: WaitCounters::default(),
                #[cfg(feature = "lease-postgres")]
                listen: Arc::new(Listen::new(table)),
            }),
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
    pub fn with_client_id(mut self, id: impl Into<String>) -> Result<Self, LockError> {
        let id = id.into();
        validate_client_id(&id)?;
        self.client_id = id.into();
        Ok(self)
    }

    /// The non-fair variant: the grant looks at no queue (see the module
    /// docs, "Fairness"). Kept for the comparison; the worker uses it with
    /// `--fair false`.
    pub fn non_fair(mut self) -> Self {
        self.fair = false;
        self
    }

    /// The fair variant (the default).
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// The longest a waiter waits for a notification or the bell before it
    /// tries again anyway (default 500 ms, at least 1 ms). A fair waiter's
    /// place lasts four of these without a renewal.
    pub fn with_poll_fallback(mut self, fallback: Duration) -> Self {
        self.poll_fallback = fallback.max(Duration::from_millis(1));
        self
    }

    /// How this service's waiters waited so far (shared by its clones).
    pub fn wait_stats(&self) -> WaitStats {
        self.shared.counters.snapshot()
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

    fn place(&self) -> Duration {
        self.poll_fallback * PLACE_POLLS
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

    fn token(&self, t: i64) -> Result<Token, LockError> {
        Token::try_from(t)
            .map_err(|e| LockError::protocol(self.issuer_name(), format!("token {t}: {e}")))
    }

    /// The bound a refusal gives: how long the lease (or the first waiter's
    /// place) still runs, capped by the fallback poll.
    #[cfg(feature = "lease-postgres")]
    fn bound(&self, wait_secs: Option<f64>) -> Duration {
        let secs = wait_secs.filter(|s| s.is_finite()).unwrap_or(0.0).max(0.0);
        Duration::from_secs_f64(secs.min(self.poll_fallback.as_secs_f64()))
            .max(Duration::from_millis(1))
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
                let token = self.token(token).map_err(|e| (e, false))?;
                Ok(Some(Holder { client_id, token }))
            }
        }
    }

    /// The lease for a grant just made.
    fn lease(
        &self,
        name: &str,
        opts: AcquireOptions,
        requested_at: Instant,
        holder: &str,
        token: Token,
        kept: Kept,
    ) -> Lease {
        tracing::debug!(
            lock = name,
            %token,
            issuer = self.issuer_name(),
            fair = self.fair,
            "lease granted"
        );
        Lease::new(NewLease {
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
                holder: holder.to_string(),
                token,
                bell: tokio::sync::Mutex::new(kept.bell),
                served: Mutex::new(kept.served),
            }),
            lost_trigger: None,
        })
    }

    /// One PostgreSQL grant attempt (fair or not, in one statement).
    #[cfg(feature = "lease-postgres")]
    async fn try_postgres(
        &self,
        pool: &PgPool,
        name: &str,
        opts: AcquireOptions,
        holder: &str,
        queue: bool,
        state: &AcquireState,
    ) -> Result<Try, LockError> {
        let requested_at = Instant::now();
        let place = if queue {
            self.place().as_secs_f64()
        } else {
            0.0
        };
        // The first try of a fair acquire (and every try of a try-lock)
        // takes the uncontended path; a waiter's later tries queue.
        let queueing = self.fair && queue && !state.first.swap(false, Ordering::Relaxed);
        let (token, wait_secs): (Option<i64>, Option<f64>) = with_reconnect(|| async {
            let q = match (self.fair, queueing) {
                (false, _) => &self.sql.pg_acquire,
                (true, false) => &self.sql.pg_acquire_fair_first,
                (true, true) => &self.sql.pg_acquire_fair,
            };
            let mut q = sqlx::query_as(q)
                .bind(name)
                .bind(holder)
                .bind(opts.ttl.as_secs_f64())
                .bind(self.lock_delay.as_secs_f64())
                .bind(&*self.client_id);
            if queueing {
                q = q.bind(place);
            }
            q.fetch_one(pool).await.map_err(|e| self.err(e))
        })
        .await?;
        Ok(match token {
            Some(t) => Try::Granted(self.lease(
                name,
                opts,
                requested_at,
                holder,
                self.token(t)?,
                Kept {
                    bell: Bell::none(),
                    served: None,
                },
            )),
            None => Try::Refused(self.bound(wait_secs)),
        })
    }

    /// One MySQL/MariaDB grant attempt, on a connection that the lease keeps
    /// when granted (it holds the bell). Refused and fair, the waiter's place
    /// is taken or renewed when due (`renewed`: when it last was).
    #[cfg(feature = "lease-mysql")]
    async fn try_mysql(
        &self,
        pool: &MySqlPool,
        name: &str,
        opts: AcquireOptions,
        holder: &str,
        queue: bool,
        state: &AcquireState,
    ) -> Result<Try, LockError> {
        let renewed = &state.renewed;
        let requested_at = Instant::now();
        // As in `try_postgres`: the first try takes the uncontended path.
        let queueing = self.fair && queue && !state.first.swap(false, Ordering::Relaxed);
        let granted = with_reconnect(|| async {
            let mut conn = pool.acquire().await.map_err(|e| self.err(e))?;
            let q = match (self.fair, queueing) {
                (false, _) => &self.sql.mysql_acquire,
                (true, false) => &self.sql.mysql_acquire_fair_first,
                (true, true) => &self.sql.mysql_acquire_fair,
            };
            let mut q = sqlx::query(q)
                .bind(holder)
                .bind(holder)
                .bind(&*self.client_id)
                .bind(micros(opts.ttl))
                .bind(name)
                .bind(micros(self.lock_delay));
            if queueing {
                q = q.bind(name).bind(holder).bind(holder);
            }
            let updated = q.execute(&mut *conn).await.map_err(|e| self.err(e))?;
            if updated.rows_affected() == 1 {
                return Ok(Some((updated.last_insert_id() as i64, conn)));
            }
            let created = sqlx::query(&self.sql.mysql_create)
                .bind(name)
                .bind(holder)
                .bind(&*self.client_id)
                .bind(micros(opts.ttl))
                .execute(&mut *conn)
                .await
                .map_err(|e| self.err(e))?;
            if created.rows_affected() != 1 {
                return Ok(None);
            }
            // The first grant of this name: take its bell now (the insert
            // cannot take it only when it wins).
            let _: Option<i64> = sqlx::query_scalar(&self.sql.mysql_ring)
                .bind(name)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| self.err(e))?;
            Ok(Some((1, conn)))
        })
        .await?;
        if let Some((token, conn)) = granted {
            let token = self.token(token)?;
            // Served: the place must be gone before anybody else could need
            // it gone, i.e. before our release, which waits for this; in the
            // background meanwhile, off the hand-over's path.
            let served = (self.fair && renewed.lock().expect("place mutex").is_some()).then(|| {
                let (table, name, holder) = (self.clone(), name.to_string(), holder.to_string());
                tokio::spawn(async move { table.leave_mysql(&name, &holder).await })
            });
            let lease = self.lease(
                name,
                opts,
                requested_at,
                holder,
                token,
                Kept {
                    bell: Bell(Some(conn)),
                    served,
                },
            );
            return Ok(Try::Granted(lease));
        }
        if self.fair && queue {
            let due = renewed
                .lock()
                .expect("place mutex")
                .is_none_or(|at| at.elapsed() >= self.poll_fallback);
            if due {
                with_reconnect(|| async {
                    sqlx::query(&self.sql.mysql_queue)
                        .bind(name)
                        .bind(holder)
                        .bind(micros(self.place()))
                        .execute(pool)
                        .await
                        .map_err(|e| self.err(e))
                })
                .await?;
                *renewed.lock().expect("place mutex") = Some(Instant::now());
            }
        }
        Ok(Try::Refused(self.poll_fallback))
    }

    #[cfg(feature = "lease-mysql")]
    async fn leave_mysql(&self, name: &str, waiter: &str) {
        #[allow(irrefutable_let_patterns)]
        if let Pool::MySql(pool) = &self.pool {
            let left = with_reconnect(|| async {
                sqlx::query(&self.sql.mysql_leave)
                    .bind(name)
                    .bind(waiter)
                    .execute(pool)
                    .await
                    .map_err(|e| self.err(e))
            })
            .await;
            if let Err(e) = left {
                tracing::debug!(
                    lock = name,
                    "leaving the queue failed (the place lapses): {e}"
                );
            }
        }
    }

    /// A fair waiter gives its place up (it was not granted).
    async fn leave(&self, name: &str, waiter: &str) {
        match &self.pool {
            #[cfg(feature = "lease-postgres")]
            Pool::Postgres(pool) => {
                let left = with_reconnect(|| async {
                    sqlx::query_scalar::<_, i64>(&self.sql.pg_leave)
                        .bind(name)
                        .bind(waiter)
                        .fetch_one(pool)
                        .await
                        .map_err(|e| self.err(e))
                })
                .await;
                if let Err(e) = left {
                    tracing::debug!(
                        lock = name,
                        "leaving the queue failed (the place lapses): {e}"
                    );
                }
            }
            #[cfg(feature = "lease-mysql")]
            Pool::MySql(_) => self.leave_mysql(name, waiter).await,
        }
    }

    async fn acquire_waiting(&self, name: &str, opts: AcquireOptions) -> Result<Lease, LockError> {
        // One id per acquire: the grant's holder, and the waiter's place.
        let holder: Arc<str> = uuid::Uuid::new_v4().simple().to_string().into();
        let queue = !opts.wait.is_zero();
        let mut place = QueuePlace {
            table: (self.fair && queue).then(|| self.clone()),
            name: name.to_string(),
            waiter: holder.clone(),
        };
        let counters = &self.shared.counters;
        let state = AcquireState {
            first: AtomicBool::new(true),
            renewed: Mutex::new(None),
        };
        let result = match &self.pool {
            #[cfg(feature = "lease-postgres")]
            Pool::Postgres(pool) => {
                wait_for_grant(
                    name,
                    opts.wait,
                    counters,
                    || self.try_postgres(pool, name, opts, &holder, queue, &state),
                    || async {
                        let filter = self.fair.then(|| holder.clone());
                        let registration = self.shared.listen.register(pool, name, filter).await;
                        NotifiedWaiter(registration)
                    },
                )
                .await
            }
            #[cfg(feature = "lease-mysql")]
            Pool::MySql(pool) => {
                wait_for_grant(
                    name,
                    opts.wait,
                    counters,
                    || self.try_mysql(pool, name, opts, &holder, queue, &state),
                    || async {
                        BellWaiter {
                            table: self.clone(),
                            pool: pool.clone(),
                            name: name.to_string(),
                            waiter: holder.clone(),
                            free_bell_seen: None,
                        }
                    },
                )
                .await
            }
        };
        if result.is_ok() {
            place.table = None;
        } else if let Some(table) = place.table.take() {
            // Gave up (or failed): leave the queue now, not in the background,
            // so that a process that exits right after still leaves no place
            // for others to wait behind.
            table.leave(name, &holder).await;
        }
        result
    }
}

/// What the tries of one acquire share.
struct AcquireState {
    /// No try sent yet: the next one takes the uncontended path.
    first: AtomicBool,
    /// MariaDB: when this waiter's place was last taken or renewed.
    #[cfg_attr(not(feature = "lease-mysql"), allow(dead_code))]
    renewed: Mutex<Option<Instant>>,
}

/// A fair waiter's place; dropped without being granted, it is given up in
/// the background (best effort: otherwise it lapses).
struct QueuePlace {
    table: Option<LeaseTable>,
    name: String,
    waiter: Arc<str>,
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        let Some(table) = self.table.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (name, waiter) = (std::mem::take(&mut self.name), self.waiter.clone());
        rt.spawn(async move { table.leave(&name, &waiter).await });
    }
}

/// A PostgreSQL waiter: its registration with the `LISTEN` connection, or
/// `None` when that is unavailable (then it polls at the bound).
#[cfg(feature = "lease-postgres")]
struct NotifiedWaiter(Option<Registration>);

#[cfg(feature = "lease-postgres")]
impl Waiter for NotifiedWaiter {
    const TRY_AFTER_SETUP: bool = true;

    fn arm(&mut self) {
        if let Some(r) = &mut self.0 {
            r.arm();
        }
    }

    async fn wait(&mut self, bound: Duration) -> Result<bool, LockError> {
        Ok(match &mut self.0 {
            Some(r) => r.wait(bound).await,
            None => {
                tokio::time::sleep(bound).await;
                false
            }
        })
    }
}

/// The `LISTEN` side of a PostgreSQL lease table: one connection, started
/// by the first waiter, routing the table's notifications to the waiters.
#[cfg(feature = "lease-postgres")]
struct Listen {
    channel: String,
    wakers: Arc<Wakers>,
    state: tokio::sync::Mutex<ListenState>,
}

#[cfg(feature = "lease-postgres")]
#[derive(Default)]
struct ListenState {
    running: bool,
    failed_at: Option<Instant>,
    /// Dropping it stops the listening task.
    _stop: Option<oneshot::Sender<()>>,
}

#[cfg(feature = "lease-postgres")]
impl Listen {
    fn new(table: &str) -> Self {
        Listen {
            channel: table.to_string(),
            wakers: Arc::new(Wakers::default()),
            state: tokio::sync::Mutex::new(ListenState::default()),
        }
    }

    /// Register a waiter for lock `name`; the table's channel is `LISTEN`ed
    /// to (confirmed by the server) before this returns. `None` when that
    /// failed: the waiter polls.
    async fn register(
        self: &Arc<Self>,
        pool: &PgPool,
        name: &str,
        waiter: Option<Arc<str>>,
    ) -> Option<Registration> {
        let registration = self.wakers.register(name, waiter);
        let mut state = self.state.lock().await;
        if state.running {
            return Some(registration);
        }
        if state
            .failed_at
            .is_some_and(|at| at.elapsed() < LISTEN_RETRY)
        {
            return None;
        }
        let started = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let mut listener = PgListener::connect_with(pool).await?;
            listener.listen(&self.channel).await?;
            Ok::<_, sqlx::Error>(listener)
        })
        .await;
        let mut listener = match started {
            Ok(Ok(l)) => l,
            failed => {
                tracing::debug!(
                    issuer = ISSUER_POSTGRES,
                    "LISTEN unavailable, polling: {failed:?}"
                );
                state.failed_at = Some(Instant::now());
                return None;
            }
        };
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        state.running = true;
        state.failed_at = None;
        state._stop = Some(stop_tx);
        let me: Weak<Listen> = Arc::downgrade(self);
        let wakers = self.wakers.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    got = listener.try_recv() => match got {
                        Ok(Some(n)) => {
                            if let Some((target, name)) = n.payload().split_once(' ') {
                                wakers.notify(name, target);
                            }
                        }
                        // The connection was lost (the listener reconnects
                        // and listens again at the next call): a notification
                        // may have been lost with it.
                        Ok(None) => wakers.notify_all(),
                        Err(e) => {
                            tracing::debug!(issuer = ISSUER_POSTGRES, "LISTEN failed: {e}");
                            break;
                        }
                    },
                    _ = &mut stop_rx => return,
                }
            }
            if let Some(me) = me.upgrade() {
                let mut state = me.state.lock().await;
                state.running = false;
                state._stop = None;
            }
            wakers.notify_all();
        });
        Some(registration)
    }
}

/// A MariaDB waiter: blocks in `GET_LOCK` on the holder's bell.
#[cfg(feature = "lease-mysql")]
struct BellWaiter {
    table: LeaseTable,
    pool: MySqlPool,
    name: String,
    waiter: Arc<str>,
    /// The holder's token when the bell was last found free (nobody rang
    /// it): seen twice for the same token, that holder has no bell.
    free_bell_seen: Option<i64>,
}

#[cfg(feature = "lease-mysql")]
impl Waiter for BellWaiter {
    const TRY_AFTER_SETUP: bool = false;

    fn arm(&mut self) {}

    /// Block on the bell until a release rings it for us. A ring that is
    /// another waiter's turn (it is first in the queue, as read right after
    /// the ring) is let pass, and we block again once that waiter holds the
    /// bell.
    async fn wait(&mut self, bound: Duration) -> Result<bool, LockError> {
        let t = &self.table;
        let deadline = Instant::now() + bound;
        // While it is another waiter's turn and that waiter has not taken the
        // lock (and its bell) yet: look again soon, then less and less often
        // (a first waiter that died keeps its turn until its place lapses).
        let mut turn_poll = Duration::from_micros(500);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            type Row = (
                u64,
                Option<i64>,
                Option<i64>,
                Option<i64>,
                Option<i64>,
                Option<i64>,
            );
            let row: Option<Row> = with_reconnect(|| async {
                sqlx::query_as::<_, Row>(&t.sql.mysql_wait)
                    .bind(micros(t.lock_delay))
                    .bind(left.as_secs_f64())
                    .bind(micros(t.lock_delay))
                    .bind(&*self.waiter)
                    .bind(&self.name)
                    .bind(&self.name)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| t.err(e))
            })
            .await?;
            // No row yet: the lock was never granted; try again.
            let Some((token, held, bell_free, rang, _, my_turn)) = row else {
                return Ok(false);
            };
            let token = token.min(i64::MAX as u64) as i64;
            let my_turn = !t.fair || my_turn != Some(0);
            match (bell_free, rang) {
                // The bell was held and came to us: a release rang it.
                (Some(0), Some(1)) if my_turn => return Ok(true),
                // Rung, but the first waiter's turn: block again (it takes
                // the bell with its grant), or poll until it has.
                (Some(0), Some(1)) => continue,
                // Nobody held the bell.
                (Some(1), _) => {
                    if held != Some(1) {
                        if my_turn {
                            return Ok(false); // free: try at once
                        }
                        // Free, but the first waiter's turn: let it take the lock.
                        tokio::time::sleep(turn_poll.min(left)).await;
                        turn_poll = (turn_poll * 2).min(BELL_LESS_POLL);
                        continue;
                    }
                    // Held, and nobody rings. Once: the holder may be taking
                    // the bell right now; ask again. Twice for the same
                    // holder: it has no bell, poll until its lease ends.
                    if self.free_bell_seen == Some(token) {
                        tokio::time::sleep(BELL_LESS_POLL.min(left)).await;
                        return Ok(false);
                    }
                    self.free_bell_seen = Some(token);
                }
                // Timed out (the bound), or the wait was interrupted.
                _ => return Ok(false),
            }
        }
    }
}

/// What a MariaDB grant keeps until its release: the bell's connection, and
/// the deletion of its place in the queue while that is in flight.
struct Kept {
    bell: Bell,
    served: Option<tokio::task::JoinHandle<()>>,
}

/// MariaDB: the pool connection that holds a lease's bell, kept from the
/// grant to the release. Dropped while still holding it (the lease was never
/// released), the connection is closed rather than returned to the pool, so
/// the server lets the bell go.
struct Bell(
    #[cfg(feature = "lease-mysql")] Option<PoolConnection<MySql>>,
    #[cfg(not(feature = "lease-mysql"))] (),
);

impl Bell {
    #[cfg(feature = "lease-postgres")]
    fn none() -> Bell {
        #[cfg(feature = "lease-mysql")]
        {
            Bell(None)
        }
        #[cfg(not(feature = "lease-mysql"))]
        {
            Bell(())
        }
    }
}

#[cfg(feature = "lease-mysql")]
impl Drop for Bell {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(conn.detach());
        }
    }
}

impl HolderLookup for LeaseTable {
    fn issuer(&self) -> &str {
        self.issuer_name()
    }

    /// One indexed `select` by primary key, judged by the database's clock,
    /// whatever the variant (fair or not) that holds the lease.
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
            self.acquire_waiting(name, opts).await
        }
        .boxed()
    }
}

struct LeaseGrant {
    table: LeaseTable,
    name: String,
    holder: String,
    token: Token,
    /// MariaDB: the connection holding the bell, used by the release.
    #[cfg_attr(not(feature = "lease-mysql"), allow(dead_code))]
    bell: tokio::sync::Mutex<Bell>,
    /// MariaDB, fair: the deletion of our place in the queue, in flight.
    served: Mutex<Option<tokio::task::JoinHandle<()>>>,
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
        let matched = match (&self.table.pool, ttl) {
            #[cfg(feature = "lease-postgres")]
            (Pool::Postgres(pool), Some(ttl)) => sqlx::query(&sql.pg_renew)
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token.to_i64())
                .bind(ttl.as_secs_f64())
                .execute(pool)
                .await
                .map(|r| r.rows_affected() == 1),
            #[cfg(feature = "lease-postgres")]
            (Pool::Postgres(pool), None) => sqlx::query_scalar::<_, i64>(&sql.pg_release)
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token.to_i64())
                .fetch_one(pool)
                .await
                .map(|n| n == 1),
            #[cfg(feature = "lease-mysql")]
            (Pool::MySql(pool), Some(ttl)) => sqlx::query(&sql.mysql_renew)
                .bind(micros(ttl))
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token.get())
                .execute(pool)
                .await
                .map(|r| r.rows_affected() == 1),
            #[cfg(feature = "lease-mysql")]
            (Pool::MySql(pool), None) => sqlx::query(&sql.mysql_release)
                .bind(&self.name)
                .bind(&self.holder)
                .bind(self.token.get())
                .execute(pool)
                .await
                .map(|r| r.rows_affected() == 1),
        };
        matched.map_err(|e| self.table.err(e))
    }

    /// MariaDB: release on the connection that holds the bell, which rings
    /// it. `None` when there is no such connection (PostgreSQL, or it died).
    #[cfg(feature = "lease-mysql")]
    async fn release_ringing(&self) -> Option<Result<bool, LockError>> {
        let mut bell = self.bell.lock().await;
        let mut conn = bell.0.take()?;
        let sql = &self.table.sql;
        let released = sqlx::query(&sql.mysql_release)
            .bind(&self.name)
            .bind(&self.holder)
            .bind(self.token.get())
            .execute(&mut *conn)
            .await;
        match released {
            Ok(r) if r.rows_affected() == 1 => Some(Ok(true)),
            Ok(_) => {
                // Not ours any more, and the bell may still be: let it go
                // before the connection goes back to the pool.
                let unrung = sqlx::query_scalar::<_, Option<i64>>(&sql.mysql_unring)
                    .bind(&self.name)
                    .fetch_one(&mut *conn)
                    .await;
                if unrung.is_err() {
                    *bell = Bell(Some(conn)); // closed, not pooled, on drop
                }
                Some(Ok(false))
            }
            // The connection failed: close it (the server lets the bell go)
            // and release through the pool.
            Err(e) => {
                tracing::debug!(lock = %self.name, "release on the bell's connection failed: {e}");
                *bell = Bell(Some(conn));
                drop(std::mem::replace(&mut *bell, Bell(None)));
                None
            }
        }
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

    /// Expires our row now (keeping it and its token) and wakes the next
    /// waiter (PostgreSQL: `pg_notify` in the statement; MariaDB: the bell).
    /// When the row is no longer ours, nothing is touched and the answer is
    /// `NotHeld`: the caller learns its critical section outlived its lease.
    /// A late release does not cancel a lock-delay.
    fn release(&self) -> BoxFuture<'_, Result<(), LockError>> {
        async move {
            let served = self.served.lock().expect("served mutex").take();
            if let Some(served) = served {
                let _ = served.await;
            }
            #[cfg(feature = "lease-mysql")]
            let rung = self.release_ringing().await;
            #[cfg(not(feature = "lease-mysql"))]
            let rung: Option<Result<bool, LockError>> = None;
            let matched = match rung {
                Some(r) => r?,
                None => self.update(None).await?,
            };
            if matched {
                Ok(())
            } else {
                Err(self.not_held("release"))
            }
        }
        .boxed()
    }
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
    Fut: std::future::Future<Output = Result<T, (LockError, bool)>>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_leave_room_for_the_queue_table() {
        assert_eq!(validate_table(&"a".repeat(55)), Ok(()));
        assert!(validate_table(&"a".repeat(56)).is_err());
        assert!(validate_table("1abc").is_err());
        assert!(validate_table("a-b").is_err());
    }

    #[test]
    fn the_bell_name_fits_a_user_lock_whatever_the_lock_name() {
        // 'fencelock:' + 32 hex digits = 42 characters, under MariaDB's 64.
        assert!(bell("t", "?").contains("md5(concat(database(), '/t/', ?))"));
    }
}
