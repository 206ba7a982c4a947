//! A lease table in SQL, on PostgreSQL (issuer `lease-postgres`, feature
//! `lease-postgres`) or on MySQL/MariaDB (issuer `lease-mysql`, feature
//! `lease-mysql`): one row per lock name,
//! `(name primary key, holder, client_id, token, expires_at, released, granted_at)`,
//! and a queue of waiters beside it, `<table>_waiters`.
//!
//! # The tables
//! The constructors create the tables if they are missing (`create table if
//! not exists`; on MySQL/MariaDB also the queue's trigger and, in a table
//! from before it, the `queued_until` column, see "The uncontended path";
//! nothing else: no migration bookkeeping that could clash with the host
//! application's own). The lease table is `fencelock_leases` unless
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
//! # The uncontended path
//! Looking at the queue costs even when it is empty: on PostgreSQL, every
//! further table a statement touches (a subquery on the queue, a CTE that
//! could insert into it) made the pair of statements 3–5 % slower under
//! pgbench, and together they made an uncontended fair acquire+release
//! 0.85× of the lock before fairness. So a service remembers which locks
//! it saw contended (a try refused within the last 5 s), and otherwise
//! takes light statements: the first try is the grant alone
//! ([`Statements::pg_acquire_light`]; fair:
//! [`Statements::pg_acquire_fair_light`], the grant if the row's
//! `queued_until` has passed, see below), and a refusal is followed at once by the statement that queues
//! and says how long to wait. The release is light
//! ([`Statements::pg_release_light`]: notify `*`, no look at the queue)
//! unless the holder is a fair waiter that was granted after waiting, whose
//! successors know they are behind it: its release names the first one. A
//! fair waiter's refused try answers whether a live place is ahead of its
//! own; while one is, a `*` does not wake it, so a light release wakes the
//! first in line and not the whole queue. The memory is per service (per
//! process): a holder that never waited releases lightly even when other
//! processes queue, which is what `*` is for.
//!
//! Whether anybody queues is read from the lease row itself: it carries
//! `queued_until`, an upper bound on when any place of its queue lapses,
//! raised in the same transaction that takes or renews a place (on
//! PostgreSQL by that statement, a CTE; on MariaDB by a `before insert`
//! trigger on the queue, since one statement there cannot write two
//! tables). Even an index probe of an empty queue cost the PostgreSQL pair
//! 3–5 %, and any subquery on the queue inside InnoDB's `update` about
//! 20 % (mariadb-slap). A fair first try of a lock not refused
//! lately is the grant with `queued_until` past
//! ([`Statements::pg_acquire_fair_light`],
//! [`Statements::mysql_acquire_fair_light`]): one row, no other table, and
//! it skips nobody, since a live place implies `queued_until` ahead. The
//! bound is never lowered, so for up to a place's life (2 s) after the last
//! waiter the light grant is refused needlessly and the statement that
//! looks at the queue follows. On MariaDB, a table without the column or
//! the trigger (created by your migrations from an older DDL, or a server
//! that refuses triggers) still works: the service checks both at start
//! and otherwise always looks at the queue. On PostgreSQL the fair
//! statements write the column, so a table without it is refused at start
//! with the `alter table` to run. The constructors add what is missing
//! when they create the tables, and look first: `alter table` (and
//! MariaDB's `create trigger`, even `if not exists`) takes the table's
//! exclusive lock, which waits for running statements (on MariaDB every
//! waiter blocked on a bell) and holds up every lock statement meanwhile,
//! so upgrade in a quiet moment (or run the DDL yourself).
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
//! first contended acquire, closed 0.2–0.3 s after its last waiter left, see
//! `LISTEN_IDLE`) routes the notifications to this process's
//! waiters; a refused waiter starts it before its second try, so a release
//! between its first try and its wait is not missed. When that connection is
//! lost every waiter is woken (a notification may have been lost with it).
//! A release that names a waiter (the hand-over, see below, or a wake by
//! name) notifies that waiter's process alone: the listener also `LISTEN`s
//! on a channel of its own, `fencelock_<key>` (a random key per
//! [`LeaseTable`], shared by its clones), and on PostgreSQL an acquire's
//! id is `<key>.<random>`, from which the release statement derives the
//! channel ([`Statements::pg_release`]). On the table's channel, every
//! other process's listener would receive, parse and drop it: with two
//! other listeners, a notification reached its own listener 44–77 µs
//! later than with none, and 0–18 µs later when they listened on other
//! channels (PostgreSQL still signals them; they send their clients
//! nothing); on the hot page, three workers' fair edits went from 0.87× to
//! 0.89× of one alone (docs/BENCHMARKS.md, "Eighth pass"). A `*`, and a
//! waiter id without a key (from a version before these channels), go to
//! the table's channel.
//! What a listener costs: PostgreSQL before 19 (15 measured here) signals
//! every connection that `LISTEN`s in the database at each commit that
//! notifies, whatever the channel (its `async.c` keeps no table of who
//! listens to what until the model "as of v19"), so each process with a waiter makes every release
//! of the database wake one more server process. Two idle listeners cost one
//! worker alone on the hot page 8 % of its edits and 60 µs per release
//! (docs/BENCHMARKS.md, "Sixth pass"). Hence the listener closes soon after
//! its process's last waiter, and stays open while waiters keep coming.
//!
//! MariaDB has no `LISTEN`. The holder's grant statement takes a user-level
//! lock, the *bell* (`GET_LOCK('fencelock:<md5 of database/table/name>')`,
//! inside the `update`, evaluated only for the row it grants), on a pool
//! connection that the lease keeps until its release, whose statement
//! `RELEASE_LOCK`s it. A refused waiter blocks in `GET_LOCK` on the bell (and
//! releases it in the same statement), bounded by the holder's `expires_at`
//! as the database says it and by the fallback poll: the release wakes it at
//! once, with no polling while the lock is held. A fair acquire whose
//! previous acquire of the same lock (in this service) was handed the lock
//! that way takes its place before any try: on a lock handed round from
//! waiter to waiter, the try of a holder that asks again right after its
//! release is refused anyway, and skipping it gave three workers on one
//! hot page about 4 % more edits (docs/BENCHMARKS.md, "Fifth pass"). A
//! waiter whose bell rang and whose wait found nobody else before it (no
//! live place before ours but the one whose bell we waited on) takes the
//! lock with the plain grant, without the fair grant's look at the queue:
//! that subquery cost every hand-over about 100 µs ("Seventh pass"). When no bell is held
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
//! # The hand-over (PostgreSQL)
//! A fair holder that waited (so, on a contended lock, every holder but
//! the first) does not just release: its release statement grants the lock
//! to the first live place in the queue, in the same statement, with the
//! token plus one, the waiter's holder id, client id and TTL (kept in its
//! place, `client_id` and `ttl_secs`), and deletes that place. The
//! notification says so (`<waiter>=<token> <name>`), and that waiter's
//! acquire returns on it, with no statement of its own. Otherwise a
//! hand-over is two round trips one after the other: the release, then
//! (after the notification) the waiter's grant. ZooKeeper's lock recipe
//! hands over the same way: the next node holds the lock once the one
//! before it is deleted, whether its client has heard or not; and as there,
//! a waiter that froze while queued is handed the lock and holds it until
//! its lease lapses (its TTL; a lock-delay then applies, since it did not
//! release). The handed lease's validity counts from the waiter's last try
//! that was refused, since the hand-over came after it ran. A waiter that
//! missed the notification (its listening connection was lost) finds the
//! lock its own at its next try. A waiter that gives up deletes its place;
//! a hand-over deletes that place under the lease row's lock, so exactly
//! one of them finds it: a waiter that does not gives back what it may have
//! been handed ([`Statements::pg_give_back`]). MariaDB does not hand over:
//! one statement there cannot write the lease row and delete the place.
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

#[cfg(feature = "lease-postgres")]
use std::sync::atomic::AtomicI64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
use sqlx::Row;
#[cfg(feature = "lease-postgres")]
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

#[cfg(feature = "lease-postgres")]
use crate::wake::{Registration, SubscribedWaiter, Wakers};
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
/// How many lock names a service remembers (MariaDB: as having a row; both:
/// as contended lately).
const KNOWN_ROWS: usize = 4096;
/// After the `LISTEN` connection failed, waiters poll this long before it is
/// tried again.
#[cfg(feature = "lease-postgres")]
const LISTEN_RETRY: Duration = Duration::from_secs(1);
/// The `LISTEN` connection is closed once three checks this far apart (0.2–0.3 s)
/// found no waiter in this process, and no waiter came and went between
/// them: while it is open, every release of the
/// table, waited for or not, is delivered to it and costs both the server
/// and this process a wake-up (it made uncontended acquire+release 2–3×
/// slower after one contended moment, and still 15 % slower for the 0.5–0.75 s
/// it stayed open before this was shortened). The next refused acquire opens
/// it again (one connection, one round trip).
#[cfg(feature = "lease-postgres")]
const LISTEN_IDLE: Duration = Duration::from_millis(100);
/// A lock whose try was refused this recently counts as contended: its
/// acquires start with the statement that queues. Otherwise they start with
/// the light grant. Mistaking a contended lock for a quiet one costs one
/// light statement more per refused acquire; the other way round, a heavier
/// first try (0.85× instead of 0.97× of the pre-fairness pair under
/// pgbench; on MariaDB 0.8× of the grant alone): a burst of contention is
/// remembered for a while.
const CONTENDED_FOR: Duration = Duration::from_secs(5);
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
    /// PostgreSQL non-fair grant, light: the grant of
    /// [`Statements::pg_acquire`] alone (`$1`..`$5` the same), returning the
    /// new token, or no row when refused. The first try of an acquire whose
    /// lock this service has not seen contended lately (see "The uncontended
    /// path" in the module docs); a refusal is followed at once by
    /// [`Statements::pg_acquire`], which says how long to wait.
    pub pg_acquire_light: String,
    /// PostgreSQL fair grant, light: [`Statements::pg_acquire_light`] given
    /// only when the row's `queued_until` has passed (`$1`..`$5` the same).
    /// The statements that take or renew a place raise `queued_until` to
    /// the place's end in the same statement, so a live place implies it
    /// lies ahead and this grant skips nobody; it reads no other table (the
    /// queue probe it replaced cost 3–5 %). It neither queues nor says how
    /// long to wait: a refusal is followed at once by
    /// [`Statements::pg_acquire_fair_first`], which reads the queue itself
    /// (`queued_until` only ever overestimates).
    pub pg_acquire_fair_light: String,
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
    /// but is not needed for their safety. A fourth column, `handed`, says
    /// the lock was already the caller's, handed over by a release
    /// ([`Statements::pg_release`]) whose notification it has not seen
    /// (lost with a listening connection, or crossed with this try): the
    /// token is that grant's, and nothing is queued.
    pub pg_acquire_fair: String,
    /// PostgreSQL fair grant, first try: [`Statements::pg_acquire`] given
    /// only when nobody waits (no live place in the queue); `$6` as
    /// [`Statements::pg_acquire_fair`]. The uncontended path of the fair
    /// lock: one index probe more than the non-fair grant. Refused, the
    /// same statement takes the caller's place in the queue (so a waiter's
    /// first refusal costs no second statement), and its next tries run
    /// [`Statements::pg_acquire_fair`].
    pub pg_acquire_fair_first: String,
    /// PostgreSQL renew: `$1` name, `$2` holder, `$3` token, `$4` TTL in seconds.
    pub pg_renew: String,
    /// PostgreSQL release of a fair holder that waited: `$1` name, `$2`
    /// holder, `$3` token. Answers a row when released, none when the row
    /// was no longer ours. It hands the lock over: the first live place in
    /// the queue is granted in the same statement (its waiter's holder id,
    /// client id and TTL, kept in the place; the token plus one) and
    /// deleted, and the notification (delivered at commit) says so:
    /// `<waiter>=<token> <name>`. That waiter's acquire returns on the
    /// notification, with no statement of its own: a hand-over costs one
    /// statement, where a release and then the waiter's grant cost two round
    /// trips one after the other (ZooKeeper's lock recipe hands over the
    /// same way: the next node holds the lock as soon as the one before it is
    /// deleted). Nobody live in the queue (or a place from a version without
    /// the hand-off), it releases, keeping the row, and notifies `*` (or that
    /// waiter's id). The lease row is locked first, then the place, as every
    /// other statement does; a waiter that leaves the queue meanwhile either
    /// deletes its place first (then nothing is handed over) or finds it gone
    /// and gives back what it was handed ([`Statements::pg_give_back`]). The
    /// releaser's own place, left over if it was handed the lock while its
    /// try was queueing it again, is deleted too. A notification that names
    /// a waiter goes to that waiter's process's own channel (see "Waiting"
    /// in the module docs), `*` to the table's.
    pub pg_release: String,
    /// PostgreSQL: give back a lease handed to a waiter that gave up (`$1`
    /// name, `$2` the waiter's id, which is its holder id): released as
    /// [`Statements::pg_release`] does without a hand-over, naming the first
    /// live waiter.
    pub pg_give_back: String,
    /// PostgreSQL release, light: [`Statements::pg_release`] without looking
    /// at the queue; the payload is `* <name>`, which wakes every waiter of
    /// the lock (the first in line is granted, the others wait again). The
    /// release of a non-fair lock (whose waiters wake on any release
    /// anyway), and of a fair one not seen contended lately.
    pub pg_release_light: String,
    /// PostgreSQL: a fair waiter that gives up deletes its place (`$1` name,
    /// `$2` waiter) and, if it was first, wakes the waiter after it (by name:
    /// that one knows it was behind), or, nobody after it, every waiter.
    /// Answers how many it notified and whether it found its place
    /// (`left_queue`): when not, a release may have handed it the lock, and
    /// [`Statements::pg_give_back`] follows.
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
    /// keeps the grant atomic as above). A place is live while it has not
    /// lapsed AND its waiter's bell is held: a waiter whose connection closed
    /// (its process died) is skipped at once, and so is the place of a holder
    /// that released (its release let its bell go).
    pub mysql_acquire_fair: String,
    /// MySQL/MariaDB fair grant, first try: binds as
    /// [`Statements::mysql_acquire`]; given only when nobody waits (no live
    /// place).
    pub mysql_acquire_fair_first: String,
    /// MySQL/MariaDB fair grant, light: binds as [`Statements::mysql_acquire`];
    /// given only when the row's `queued_until` has passed, which the
    /// queue's trigger ([`Statements::mysql_ddl_statements`]) raises to
    /// every place's `expires_at` in the transaction that takes or renews
    /// the place: a live place implies a `queued_until` ahead, so the grant
    /// skips nobody, and it reads no other table (a subquery on the queue
    /// costs InnoDB's `update` about 20 %). Refused, it is followed at once
    /// by [`Statements::mysql_acquire_fair_first`], which looks at the
    /// queue itself (`queued_until` only ever overestimates).
    pub mysql_acquire_fair_light: String,
    /// MySQL/MariaDB first grant of a name: the primary key lets exactly one
    /// concurrent insert win; the others are ignored (0 rows) and retry the
    /// update above on their next attempt. Binds: name, holder, client id,
    /// TTL in µs.
    pub mysql_create: String,
    /// MySQL/MariaDB: take the bell of a name (bind: name) after its first
    /// grant, on the connection that keeps it.
    pub mysql_ring: String,
    /// MySQL/MariaDB: give back every user lock of the connection (the name's
    /// bell, the waiter's own), when a release found the row no longer ours
    /// or a waiter gave up.
    pub mysql_unring: String,
    /// MySQL/MariaDB fair waiter: take or renew a place in the queue and, in
    /// the same statement, the waiter's own bell (a user lock named by its
    /// id, held on the waiter's connection until its release or until it
    /// gives up). Binds: name, waiter id (twice), how long the place lasts in
    /// µs. The bell is taken before the row is committed, so a place that
    /// others can see belongs to a waiter that holds its bell, until that
    /// waiter goes away.
    pub mysql_join: String,
    /// MySQL/MariaDB waiter: wait for the bell of the one before it. Binds:
    /// lock-delay in µs, the longest wait in seconds, lock-delay in µs,
    /// waiter id, name. A fair waiter (it has a place) blocks on the bell of the live
    /// place just before its own (`pred`), or, first in line, on the name's
    /// bell, which the holder takes with its grant; a non-fair waiter (no
    /// place) on the name's bell. Answers, read before it blocks, the
    /// holder's `token`, whether the lease is `held`, `pred` and whether that
    /// bell was free; then whether the bell was got (`rang`). A waiter's bell
    /// is let go at once (it only said that waiter went away); the name's
    /// bell is kept by the first in line, so that its grant needs no wait
    /// for it, and let go by the next wait if that grant was refused. It
    /// blocks at most until the lease ends (name's bell) or the place before
    /// lapses (a waiter's bell). (MariaDB evaluates a select list left to
    /// right.)
    pub mysql_wait: String,
    /// MySQL/MariaDB: delete a waiter's place (binds: name, waiter id), when
    /// it was granted or gave up, and the lapsed places of the name.
    pub mysql_leave: String,
    /// MySQL/MariaDB renew: TTL in µs, name, holder, token; only while not lapsed.
    pub mysql_renew: String,
    /// MySQL/MariaDB release: name, holder, token. Keeps the row; rings the
    /// bells it holds (`RELEASE_ALL_LOCKS`: the name's, and the holder's own
    /// if it waited, on which its successor in the queue blocks).
    pub mysql_release: String,
    /// MySQL/MariaDB holder lookup: name.
    pub mysql_holder: String,
}

/// The name's bell for the lock in column or placeholder `name`: at most 64
/// characters whatever the lock's name, and distinct per database and table.
fn bell(table: &str, name: &str) -> String {
    format!("concat('fencelock:', md5(concat(database(), '/{table}/', {name})))")
}

/// PostgreSQL: the channel of a notification that names the waiter in
/// column or expression `waiter`: its process's own channel,
/// `fencelock_<key>`, when the waiter's id is `<key>.<random>` (the key is
/// its [`LeaseTable`]'s listener's), else (no waiter, or an id from a
/// version before the channels) the table's, which every listener hears.
/// A key is 16 hex digits, and only such a key makes a channel: an id of
/// another shape must not name a channel too long for PostgreSQL (63
/// bytes), which would fail the release.
fn pg_channel(table: &str, waiter: &str) -> String {
    format!(
        "case when {waiter} ~ '^[0-9a-f]{{16}}\\.' then '{OWN_CHANNEL}' || left({waiter}, 16) \
         else '{table}' end"
    )
}

/// PostgreSQL: a listener's own channel is this and its key
/// ([`own_channel`]); the release statements name it the same way
/// ([`pg_channel`]).
const OWN_CHANNEL: &str = "fencelock_";

/// PostgreSQL: the own channel of the listener with key `key`.
#[cfg(feature = "lease-postgres")]
fn own_channel(key: &str) -> String {
    format!("{OWN_CHANNEL}{key}")
}

/// A fair waiter's own bell, for the waiter id in column or placeholder
/// `waiter` (32 hex digits, random per acquire: 44 characters). It cannot be
/// mistaken for a name's bell (`w:` is not hex).
fn waiter_bell(waiter: &str) -> String {
    format!("concat('fencelock:w:', {waiter})")
}

/// Whether the place `w` is live: not lapsed, and its waiter's bell held
/// (by the database's clock and its user-lock table).
fn live_place(w: &str) -> String {
    format!(
        "{w}.expires_at > now(6) and is_used_lock({}) is not null",
        waiter_bell(&format!("{w}.waiter"))
    )
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
   where ((l.released and l.expires_at <= now())
       or (not l.released and l.expires_at + make_interval(secs => $4) <= now()))QUEUE
  returning token"
        );
        let pg_grant_fair_light = pg_grant.replace(
            "QUEUE",
            "
     and (l.queued_until is null or l.queued_until <= now())",
        );
        let pg_grant = pg_grant.replace("QUEUE", "");
        // A refused fair try that takes or renews its place raises the
        // lease row's `queued_until` to the place's end, in the same
        // statement (after the grant's look at the row, before the place:
        // the lease row is locked first, as every other statement does).
        let pg_bumped = format!(
            "bumped as (
  update {t} l set queued_until = greatest(l.queued_until, now() + make_interval(secs => $6))
   where l.name = $1 and $6 > 0 and not exists (select 1 from granted)MINE
  returning 1
),"
        );
        let pg_bumped_first = pg_bumped.replace("MINE", "");
        let pg_bumped_later = pg_bumped.replace(
            "MINE",
            "
     and not exists (select 1 from mine)",
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
       -- Both branches are the holder: the `if` is there to take the
       -- name's bell, and only for the row this statement grants (GET_LOCK:
       -- at once when this connection holds it already, as the first waiter
       -- does after its wait; else waiting at most 5 ms for a non-fair
       -- waiter that holds it for an instant).
       l.holder = if(get_lock({bell_row}, 0.005) >= 0, ?, ?),
       l.client_id = ?,
       l.expires_at = now(6) + interval ? microsecond,
       l.released = false,
       l.granted_at = now(6)
 where l.name = ?
   and ((l.released and l.expires_at <= now(6))
     or (not l.released and l.expires_at + interval ? microsecond <= now(6)))"
        );
        // How long to wait after a refused fair try: the lease's rest, or
        // (free, another waiter first) that waiter's place's.
        let pg_not_queued = format!(
            "where not exists (select 1 from {t}_waiters w
                      where w.name = $1 and w.expires_at > now())"
        );
        Statements {
            pg_acquire_light: pg_grant.replace(
                "SOURCE",
                "values ($1, $2, $5, 1, now() + make_interval(secs => $3), false, now())",
            ),
            pg_acquire_fair_light: pg_grant_fair_light.replace(
                "SOURCE",
                "values ($1, $2, $5, 1, now() + make_interval(secs => $3), false, now())",
            ),
            pg_acquire: format!(
                "
with granted as ({}
)
select g.token,
       case when g.token is null then {pg_held_for} end as wait_secs,
       null::boolean as behind
  from (select (select token from granted) as token) g",
                pg_grant.replace(
                    "SOURCE",
                    "values ($1, $2, $5, 1, now() + make_interval(secs => $3), false, now())"
                )
            ),
            pg_acquire_fair_first: format!(
                "
with granted as ({}
),
{pg_bumped_first}
queued as (
  insert into {t}_waiters (name, waiter, expires_at, client_id, ttl_secs)
  select $1, $2, now() + make_interval(secs => $6), $5, $3
   where $6 > 0 and exists (select 1 from bumped)
  on conflict (name, waiter) do update set expires_at = excluded.expires_at
),
ahead as (
  select w.expires_at from {t}_waiters w
   where w.name = $1 and w.expires_at > now() and w.waiter <> $2
   order by w.ticket limit 1
)
select g.token,
       case when g.token is null then
         greatest({pg_held_for},
                  (select extract(epoch from a.expires_at - now())::float8 from ahead a))
       end as wait_secs,
       g.token is null and exists (select 1 from ahead) as behind
  from (select (select token from granted) as token) g",
                pg_grant.replace(
                    "SOURCE",
                    &format!(
                        "select $1, $2, $5, 1, now() + make_interval(secs => $3), false, now()
   {pg_not_queued}"
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
mine as (
  select l.token from {t} l
   where l.name = $1 and l.holder = $2 and not l.released and l.expires_at > now()
),
{pg_bumped_later}
queued as (
  insert into {t}_waiters (name, waiter, expires_at, client_id, ttl_secs)
  select $1, $2, now() + make_interval(secs => $6), $5, $3
   where $6 > 0 and exists (select 1 from bumped)
  on conflict (name, waiter) do update set expires_at = excluded.expires_at
)
select coalesce(g.token, g.mine) as token,
       case when g.token is null and g.mine is null then
         greatest({pg_held_for},
                  (select extract(epoch from f.expires_at - now())::float8
                     from first f where f.waiter <> $2))
       end as wait_secs,
       g.token is null and g.mine is null
         and exists (select 1 from first f where f.waiter <> $2) as behind,
       g.token is null and g.mine is not null as handed
  from (select (select token from granted) as token, (select token from mine) as mine) g",
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
with lk as (
  select l.token from {t} l
   where l.name = $1 and l.holder = $2 and l.token = $3
     and not l.released and l.expires_at > now()
     for update
),
next as (
  select w.waiter, w.ttl_secs from {t}_waiters w
   where w.name = $1 and w.expires_at > now() and w.waiter <> $2
     and exists (select 1 from lk)
   order by w.ticket limit 1
),
served as (
  delete from {t}_waiters w using next n
   where w.name = $1 and w.waiter = n.waiter
     and w.client_id is not null and w.ttl_secs is not null
  returning w.waiter, w.client_id, w.ttl_secs
),
own as (
  delete from {t}_waiters w where w.name = $1 and w.waiter = $2
)
update {t} l
   set holder = coalesce(s.waiter, l.holder),
       client_id = coalesce(s.client_id, l.client_id),
       token = l.token + case when s.waiter is null then 0 else 1 end,
       expires_at = now() + make_interval(secs => coalesce(s.ttl_secs, 0)),
       released = s.waiter is null,
       granted_at = case when s.waiter is null then l.granted_at else now() end
  from lk left join served s on true
 where l.name = $1 and l.holder = $2 and l.token = $3
returning pg_notify({channel}, coalesce(
           s.waiter || '=' || l.token,
           (select n.waiter from next n),
           '*') || ' ' || l.name)",
                channel = pg_channel(t, "coalesce(s.waiter, (select n.waiter from next n))")
            ),
            pg_give_back: format!(
                "
update {t} l set expires_at = now(), released = true
 where l.name = $1 and l.holder = $2 and not l.released and l.expires_at > now()
returning pg_notify('{t}', coalesce(
           (select w.waiter from {t}_waiters w
             where w.name = l.name and w.expires_at > now()
             order by w.ticket limit 1), '*') || ' ' || l.name)"
            ),
            pg_release_light: format!(
                "
update {t} l set expires_at = now(), released = true
 where l.name = $1 and l.holder = $2 and l.token = $3
   and not l.released and l.expires_at > now()
returning pg_notify('{t}', '* ' || l.name)"
            ),
            pg_leave: format!(
                "
with gone as (
  delete from {t}_waiters where name = $1 and waiter = $2 returning ticket
),
notified as (
  select pg_notify('{t}', coalesce(
           (select w.waiter from {t}_waiters w
             where w.name = $1 and w.ticket > g.ticket and w.expires_at > now()
             order by w.ticket limit 1), '*') || ' ' || $1)
    from gone g
   where not exists (select 1 from {t}_waiters w
                      where w.name = $1 and w.ticket < g.ticket and w.expires_at > now())
)
select (select count(*) from notified) as notified,
       (select count(*) from gone) as left_queue"
            ),
            pg_holder: format!(
                "
select client_id, token from {t}
 where name = $1 and not released and expires_at > now()"
            ),
            mysql_acquire_fair: format!(
                "{mysql_set}
   and coalesce((select w.waiter from {t}_waiters w
                  where w.name = ? and {}
                  order by w.ticket limit 1), ?) = ?",
                live_place("w")
            ),
            mysql_acquire_fair_first: format!(
                "{mysql_set}
   and not exists (select 1 from {t}_waiters w
                    where w.name = l.name and {})",
                live_place("w")
            ),
            mysql_acquire_fair_light: format!(
                "{mysql_set}
   and (l.queued_until is null or l.queued_until <= now(6))"
            ),
            mysql_acquire: mysql_set,
            mysql_create: format!(
                "
insert ignore into {t} (name, holder, client_id, token, expires_at, released, granted_at)
values (?, ?, ?, 1, now(6) + interval ? microsecond, false, now(6))"
            ),
            mysql_ring: format!("select get_lock({}, 0)", bell(t, "?")),
            mysql_unring: "select release_all_locks()".into(),
            mysql_join: format!(
                "
insert into {t}_waiters (name, waiter, expires_at)
values (?, ?, if(get_lock({}, 0) = 1, now(6) + interval ? microsecond, null))
on duplicate key update expires_at = values(expires_at)",
                waiter_bell("?")
            ),
            mysql_wait: {
                // The bell to block on: the place before ours, or the name's.
                // (Both as utf8mb4: the column's and the connection's
                // character sets may differ, and `if` refuses to mix them.)
                let b = format!(
                    "if(p.waiter is null, convert({} using utf8mb4),
                       convert({} using utf8mb4))",
                    bell(t, "l.name"),
                    waiter_bell("p.waiter")
                );
                format!(
                    "
select -- First in line, refused after its last wait: let the name's bell go.
       if(is_used_lock({n}) = connection_id(), release_lock({n}), null) as dropped,
       l.token,
       not l.released and l.expires_at + interval ? microsecond > now(6) as held,
       p.waiter as pred,
       is_free_lock({b}) as bell_free,
       get_lock({b}, least(?, greatest(0, timestampdiff(microsecond, now(6),
         if(p.waiter is null,
            l.expires_at + interval if(l.released, 0, ?) microsecond,
            p.expires_at)) / 1000000))) as rang,
       -- Whether we are first in line once the bell rings: we have a place,
       -- and nobody is before us but the waiter whose bell we wait on (if
       -- any). (Looked at as the statement begins, as the bell's lookup is:
       -- MariaDB evaluates both before the wait. A place taken later has a
       -- higher ticket, so only a lapsed place renewed meanwhile can be
       -- missed, and a lapsed place is skipped anyway.)
       me.ticket is not null and (p.waiter is null or not exists (
         select 1 from {t}_waiters w2
          where w2.name = l.name and w2.ticket < p.ticket and {live2})) as first_now,
       -- Keep the name's bell when first in line; let a waiter's go.
       if(p.waiter is null and me.waiter is not null, 0, release_lock({b})) as let_go
  from {t} l
  left join {t}_waiters me on me.name = l.name and me.waiter = ?
  left join {t}_waiters p on p.name = l.name and p.ticket = (
       select max(w.ticket) from {t}_waiters w
        where w.name = l.name and w.ticket < me.ticket and {live})
 where l.name = ?",
                    n = bell(t, "l.name"),
                    live = live_place("w"),
                    live2 = live_place("w2"),
                )
            },
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
       -- Unchanged: the `if` rings the bells this connection holds (the
       -- name's, and the holder's own if it waited) for the row this
       -- statement releases, and only for it.
       l.holder = if(release_all_locks() >= 0, l.holder, l.holder)
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
    granted_at timestamptz not null,
    -- No place in the queue is live after this (an upper bound, raised by
    -- the statement that takes or renews a place): a fair grant that finds
    -- it past skips nobody without reading the queue.
    queued_until timestamptz
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
    -- The waiter's client id and TTL: a release hands the lock to the first
    -- live place with its grant (null: a waiter of a version before the
    -- hand-off, which is woken to try instead).
    client_id  text,
    ttl_secs   float8,
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
    granted_at datetime(6)     not null,
    -- No place in the queue is live after this (an upper bound, raised by
    -- the queue's trigger): a fair grant that finds it past skips nobody.
    queued_until datetime(6)   null
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
            Self::mysql_queued_trigger(table),
        ]
    }

    /// MySQL/MariaDB: the trigger that keeps `queued_until` ahead of every
    /// place, in the transaction that takes or renews it (`before insert`
    /// also fires for the renewal, an `insert ... on duplicate key update`).
    /// Before, not after: the lease row is locked before the place, the
    /// order the fair grant (lease row, then its look at the queue) takes
    /// them in, so the two cannot deadlock. Without it (or without the
    /// column) the service finds out at start and never takes the light
    /// fair grant.
    pub fn mysql_queued_trigger(table: &str) -> String {
        format!(
            "create trigger if not exists {table}_queued before insert on {table}_waiters
for each row
  update {table}
     set queued_until = greatest(coalesce(queued_until, new.expires_at),
                                 coalesce(new.expires_at, queued_until))
   where name = new.name"
        )
    }
}

/// PostgreSQL: the columns that tables made by an earlier version lack
/// (the lease table's `queued_until`; the queue's `client_id` and
/// `ttl_secs`, which the hand-over reads), as `alter table` statements.
/// Empty when the tables are current. The table name is folded to lower
/// case, as an unquoted name is.
#[cfg(feature = "lease-postgres")]
async fn pg_missing_columns<'e>(
    db: impl sqlx::PgExecutor<'e>,
    table: &str,
) -> Result<Vec<String>, sqlx::Error> {
    let wanted = [
        (table.to_string(), "queued_until", "timestamptz"),
        (format!("{table}_waiters"), "client_id", "text"),
        (format!("{table}_waiters"), "ttl_secs", "float8"),
    ];
    let present: Vec<(String, String)> = sqlx::query_as(
        "select table_name::text, column_name::text from information_schema.columns
          where table_schema = current_schema()
            and table_name in (lower($1), lower($1) || '_waiters')",
    )
    .bind(table)
    .fetch_all(db)
    .await?;
    Ok(wanted
        .iter()
        .filter(|(t, c, _)| {
            !present
                .iter()
                .any(|(pt, pc)| *pt == t.to_lowercase() && pc == c)
        })
        .map(|(t, c, ty)| format!("alter table {t} add column if not exists {c} {ty}"))
        .collect())
}

/// MariaDB: run `$statement` (an `async` block using `$conn`, the
/// acquire's connection, taken from the pool when it has none), once. On
/// failure the connection is closed, with the bells it held (so the waiter's
/// place is no longer live: it joins again on its next try), and the answer
/// says whether another try can help: `Result<T, (LockError, bool)>`.
#[cfg(feature = "lease-mysql")]
macro_rules! on_conn_once {
    ($table:expr, $st:expr, $pool:expr, |$conn:ident| $statement:expr) => {{
        let st: &mut MyWait = $st;
        let ran = async {
            if st.conn.0.is_none() {
                st.conn.0 = Some($pool.acquire().await.map_err(|e| $table.err(e))?);
            }
            let $conn: &mut sqlx::MySqlConnection =
                &mut **st.conn.0.as_mut().expect("connection just taken");
            $statement.await.map_err(|e| $table.err(e))
        }
        .await;
        if ran.is_err() {
            st.lost();
        }
        ran
    }};
}

/// [`on_conn_once`], on another connection while the failure is one that
/// another try can fix (see [`with_reconnect`]): `Result<T, LockError>`.
#[cfg(feature = "lease-mysql")]
macro_rules! on_conn {
    ($table:expr, $st:expr, $pool:expr, |$conn:ident| $statement:expr) => {{
        let mut tries = 0;
        loop {
            tries += 1;
            match on_conn_once!($table, &mut *$st, $pool, |$conn| $statement) {
                Ok(v) => break Ok(v),
                Err((e, retry)) if retry && tries <= MAX_CONNECTIONS => {
                    tracing::debug!("retrying on another connection: {e}");
                }
                Err((e, _)) => break Err(e),
            }
        }
    }};
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
///
/// Share one per process (clone it, with [`LeaseTable::with_client_id`] per
/// task if they need their own ids): each service keeps its own pool and,
/// on PostgreSQL, its own `LISTEN` connection, which every notifying commit
/// of the database wakes. Three workers on one hot PostgreSQL page made
/// 0.84× one worker's edits sharing one service and 0.73–0.76× with one
/// each (docs/BENCHMARKS.md, "Seventh pass").
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
    /// Statements sent (see [`LeaseTable::statements_sent`]).
    statements: AtomicU64,
    #[cfg(feature = "lease-postgres")]
    listen: Arc<Listen>,
    /// Lock names refused lately, and when (at most [`KNOWN_ROWS`]): their
    /// acquires (PostgreSQL: and releases) take the statements made for
    /// contention (see "The uncontended path" in the module docs).
    contended: Mutex<std::collections::HashMap<String, Instant>>,
    /// MariaDB: lock names whose row is known to exist, so that a refused
    /// grant need not try to create it (at most [`KNOWN_ROWS`]; forgotten
    /// when a wait finds no row).
    #[cfg(feature = "lease-mysql")]
    known_rows: Mutex<std::collections::HashSet<String>>,
    /// MariaDB: the table has `queued_until` and the queue its trigger, so
    /// a quiet lock's fair first try can be
    /// [`Statements::mysql_acquire_fair_light`].
    #[cfg(feature = "lease-mysql")]
    light: AtomicBool,
    /// MariaDB, fair: lock names whose last acquire here was handed the
    /// lock by a release it waited for (its bell rang). Their next acquire
    /// takes its place before any try (see `try_mysql`). At most
    /// [`KNOWN_ROWS`].
    #[cfg(feature = "lease-mysql")]
    handed_round: Mutex<std::collections::HashSet<String>>,
}

impl Shared {
    /// Whether a try of lock `name` was refused within [`CONTENDED_FOR`].
    fn is_contended(&self, name: &str) -> bool {
        self.contended
            .lock()
            .expect("contended")
            .get(name)
            .is_some_and(|at| at.elapsed() < CONTENDED_FOR)
    }

    /// A try of lock `name` was refused just now.
    fn contend(&self, name: &str) {
        let mut contended = self.contended.lock().expect("contended");
        if contended.len() >= KNOWN_ROWS && !contended.contains_key(name) {
            contended.retain(|_, at| at.elapsed() < CONTENDED_FOR);
            if contended.len() >= KNOWN_ROWS {
                contended.clear();
            }
        }
        contended.insert(name.to_string(), Instant::now());
    }

    #[cfg(feature = "lease-mysql")]
    fn row_known(&self, name: &str) -> bool {
        self.known_rows.lock().expect("known rows").contains(name)
    }

    #[cfg(feature = "lease-mysql")]
    fn know_row(&self, name: &str) {
        remember(&mut self.known_rows.lock().expect("known rows"), name);
    }

    #[cfg(feature = "lease-mysql")]
    fn forget_row(&self, name: &str) {
        self.known_rows.lock().expect("known rows").remove(name);
    }

    /// MariaDB: whether lock `name`'s last fair acquire here waited for a
    /// release that rang its bell.
    #[cfg(feature = "lease-mysql")]
    fn is_handed_round(&self, name: &str) -> bool {
        self.handed_round
            .lock()
            .expect("handed round")
            .contains(name)
    }

    /// MariaDB: a fair acquire of `name` was granted, after a release rang
    /// its bell (`rang`) or not.
    #[cfg(feature = "lease-mysql")]
    fn granted_after(&self, name: &str, rang: bool) {
        let mut round = self.handed_round.lock().expect("handed round");
        if rang {
            remember(&mut round, name);
        } else {
            round.remove(name);
        }
    }
}

/// Add `name` to a set of lock names kept to at most [`KNOWN_ROWS`]
/// (emptied when full: forgetting costs a statement, never safety).
#[cfg(feature = "lease-mysql")]
fn remember(names: &mut std::collections::HashSet<String>, name: &str) {
    if !names.contains(name) {
        if names.len() >= KNOWN_ROWS {
            names.clear();
        }
        names.insert(name.to_string());
    }
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
                // Tables made by an earlier version lack columns. Looked up
                // first: `alter table` takes the table's exclusive lock even
                // when the column exists.
                for alter in pg_missing_columns(&mut *tx, &options.table).await? {
                    sqlx::query(&alter).execute(&mut *tx).await?;
                }
                tx.commit().await
            };
            create.await.map_err(|e| {
                LockError::unavailable(ISSUER_POSTGRES, format!("create lease table: {e}"))
            })?;
        }
        let missing = pg_missing_columns(&pool, &options.table)
            .await
            .map_err(|e| LockError::unavailable(ISSUER_POSTGRES, e))?;
        if !missing.is_empty() {
            return Err(LockError::InvalidConfig(format!(
                "the lease table {t} or its queue lacks columns that the fair lock keeps \
                 (tables made by an earlier version): run `{}`, or let the library do it \
                 (LeaseTableOptions::create_table)",
                missing.join("; "),
                t = options.table
            )));
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
        let table = &options.table;
        let count = |sql: &'static str, name: String| {
            let pool = &pool;
            async move {
                sqlx::query_scalar::<_, i64>(sql)
                    .bind(name)
                    .fetch_one(pool)
                    .await
                    .map_err(|e| LockError::unavailable(ISSUER_MYSQL, e))
            }
        };
        let has_column = || {
            count(
                "select count(*) from information_schema.columns
                  where table_schema = database() and table_name = ?
                    and column_name = 'queued_until'",
                table.clone(),
            )
        };
        let has_trigger = || {
            count(
                "select count(*) from information_schema.triggers
                  where trigger_schema = database() and trigger_name = ?",
                format!("{table}_queued"),
            )
        };
        if options.create_table {
            // MySQL serialises concurrent DDL on the table's metadata lock.
            let ddl = Statements::mysql_ddl_statements(table);
            let (trigger, tables) = ddl.split_last().expect("tables and trigger");
            for ddl in tables {
                sqlx::query(ddl).execute(&pool).await.map_err(|e| {
                    LockError::unavailable(ISSUER_MYSQL, format!("create lease table: {e}"))
                })?;
            }
            // A table made by an earlier version has no `queued_until`.
            if has_column().await? == 0 {
                let added = sqlx::query(&format!(
                    "alter table {table} add column queued_until datetime(6) null"
                ))
                .execute(&pool)
                .await;
                // Another client may have added it meanwhile.
                if let Err(e) = added {
                    if has_column().await? == 0 {
                        return Err(LockError::unavailable(
                            ISSUER_MYSQL,
                            format!("add queued_until to the lease table: {e}"),
                        ));
                    }
                }
            }
            // Without the trigger the lock works, only its uncontended fair
            // grant is heavier (a server with binary logging refuses
            // triggers to users without SUPER unless
            // `log_bin_trust_function_creators` is on). Looked up first:
            // `create trigger if not exists` takes the tables' exclusive
            // metadata lock even when the trigger exists, so it would wait
            // for every waiter blocked on a bell, and every statement on
            // the tables would queue behind it (measured: a new service
            // stalled the lock for a lease's whole TTL).
            let created = if has_trigger().await? == 0 {
                sqlx::query(trigger).execute(&pool).await.map(|_| ())
            } else {
                Ok(())
            };
            if let Err(e) = created {
                tracing::warn!(
                    issuer = ISSUER_MYSQL,
                    "could not create the trigger {table}_queued, so every fair grant \
                     looks at the queue (slower, as safe): {e}"
                );
            }
        }
        let light = has_column().await? == 1 && has_trigger().await? == 1;
        let svc = LeaseTable::new(Pool::MySql(pool), table);
        svc.shared.light.store(light, Ordering::Relaxed);
        Ok(svc)
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
                statements: AtomicU64::new(0),
                #[cfg(feature = "lease-postgres")]
                listen: Arc::new(Listen::new(table)),
                contended: Mutex::default(),
                #[cfg(feature = "lease-mysql")]
                known_rows: Mutex::default(),
                #[cfg(feature = "lease-mysql")]
                light: AtomicBool::new(false),
                #[cfg(feature = "lease-mysql")]
                handed_round: Mutex::default(),
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
        self.sent(1);
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
                waited: kept.waited,
            }),
            lost_trigger: None,
        })
    }

    /// A lease that a release handed to this waiter (token `token`): its
    /// validity counts from the last try that was refused (the hand-over
    /// came after that try ran), and it names the waiter behind it at its
    /// release, as any waiter that was granted does.
    #[cfg(feature = "lease-postgres")]
    fn handed_lease(
        &self,
        name: &str,
        opts: AcquireOptions,
        holder: &str,
        token: i64,
        state: &AcquireState,
    ) -> Result<Lease, LockError> {
        let since = *state.since.lock().expect("since mutex");
        Ok(self.lease(
            name,
            opts,
            since,
            holder,
            self.token(token)?,
            Kept {
                waited: true,
                ..Kept::default()
            },
        ))
    }

    /// One PostgreSQL grant attempt (fair or not, in one statement). A fair
    /// waiter's refused try takes or renews its place in the same statement.
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
        // A release handed the lock to this waiter: granted, with no
        // statement (see `Statements::pg_release`).
        let handed = state.handed.swap(0, Ordering::SeqCst);
        if handed > 0 {
            return Ok(Try::Handed(
                self.handed_lease(name, opts, holder, handed, state)?,
            ));
        }
        let requested_at = Instant::now();
        let place = if self.fair && queue {
            self.place().as_secs_f64()
        } else {
            0.0
        };
        // The first try of a fair acquire (and every try of a try-lock)
        // takes the uncontended path; a waiter's later tries look for their
        // own place at the head of the queue.
        let first = state.first.swap(false, Ordering::Relaxed) || !queue;
        if first && !self.shared.is_contended(name) {
            // The light statement: the grant alone (fair: if nobody queues).
            let q = if self.fair {
                &self.sql.pg_acquire_fair_light
            } else {
                &self.sql.pg_acquire_light
            };
            let token: Option<i64> = with_reconnect(|| async {
                self.sent(1);
                sqlx::query_scalar(q)
                    .bind(name)
                    .bind(holder)
                    .bind(opts.ttl.as_secs_f64())
                    .bind(self.lock_delay.as_secs_f64())
                    .bind(&*self.client_id)
                    .fetch_optional(pool)
                    .await
                    .map_err(|e| self.err(e))
            })
            .await?;
            if let Some(t) = token {
                return Ok(Try::Granted(self.lease(
                    name,
                    opts,
                    requested_at,
                    holder,
                    self.token(t)?,
                    Kept::default(),
                )));
            }
            // Refused: from now on the lock counts as contended, and the
            // statement made for that (which queues a fair waiter and says
            // how long to wait) follows at once. A non-fair try-lock needs
            // neither; a fair one needs the look at the queue, since
            // `queued_until` may still lie ahead with nobody left in it.
            self.shared.contend(name);
            *state.since.lock().expect("since mutex") = requested_at;
            if !queue && !self.fair {
                return Ok(Try::Refused(self.poll_fallback));
            }
        }
        let (token, wait_secs, behind, handed): PgTry = with_reconnect(|| async {
            self.sent(1);
            let q = match (self.fair, first) {
                (false, _) => &self.sql.pg_acquire,
                (true, true) => &self.sql.pg_acquire_fair_first,
                (true, false) => &self.sql.pg_acquire_fair,
            };
            let q = sqlx::query(q)
                .bind(name)
                .bind(holder)
                .bind(opts.ttl.as_secs_f64())
                .bind(self.lock_delay.as_secs_f64())
                .bind(&*self.client_id);
            let q = if self.fair { q.bind(place) } else { q };
            let row = q.fetch_one(pool).await.map_err(|e| self.err(e))?;
            let handed = if self.fair && !first {
                row.try_get("handed")
            } else {
                Ok(None)
            };
            let read = || -> Result<PgTry, sqlx::Error> {
                Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, handed?))
            };
            read().map_err(|e| self.err(e))
        })
        .await?;
        Ok(match token {
            Some(t) if handed == Some(true) => {
                Try::Granted(self.handed_lease(name, opts, holder, t, state)?)
            }
            Some(t) => Try::Granted(self.lease(
                name,
                opts,
                requested_at,
                holder,
                self.token(t)?,
                Kept {
                    waited: !first,
                    ..Kept::default()
                },
            )),
            None => {
                self.shared.contend(name);
                *state.since.lock().expect("since mutex") = requested_at;
                state
                    .behind
                    .store(behind.unwrap_or(false), Ordering::SeqCst);
                Try::Refused(self.bound(wait_secs))
            }
        })
    }

    /// A MySQL/MariaDB grant statement with the six parameters every one of
    /// them starts with.
    #[cfg(feature = "lease-mysql")]
    fn mysql_grant<'q>(
        &'q self,
        sql: &'q str,
        holder: &'q str,
        name: &'q str,
        ttl: Duration,
    ) -> sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments> {
        sqlx::query(sql)
            .bind(holder)
            .bind(holder)
            .bind(&*self.client_id)
            .bind(micros(ttl))
            .bind(name)
            .bind(micros(self.lock_delay))
    }

    /// One MySQL/MariaDB grant attempt, on the acquire's connection, which
    /// the lease keeps when granted (it holds the name's bell, and the
    /// waiter's own if it queued). Refused and fair, the waiter takes its
    /// place (and its own bell) when it has none, or renews it when due.
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
        let requested_at = Instant::now();
        // As in `try_postgres`: the first try takes the uncontended path.
        let first = state.first.swap(false, Ordering::Relaxed) || !queue;
        let mut st = state.my.lock().await;
        let known = self.shared.row_known(name);
        // A fair first try of a lock not refused lately: the grant alone, if
        // the row says no place can be live (see `mysql_acquire_fair_light`);
        // refused, the statement that looks at the queue follows at once.
        let light = self.fair
            && first
            && self.shared.light.load(Ordering::Relaxed)
            && !self.shared.is_contended(name);
        // A fair first try of a lock handed round (our last acquire of it
        // here waited for a release that rang our bell, and a try was
        // refused lately): skip it and take our place at once. On a lock
        // handed from waiter to waiter, a holder that asks again right
        // after its release is refused (the waiter it woke is taking the
        // lock, or has), so that try was one statement in six of every edit
        // for nothing. When the round has ended, the wait finds the lock
        // free and nobody before us and returns at once, the next try takes
        // it, and that grant (no bell rang) ends the skipping: the end of a
        // round costs one acquire a place, a wait and the place's deletion.
        // Safety never depends on it: only the grant statement grants.
        let join_first = self.fair
            && first
            && queue
            && known
            && self.shared.is_contended(name)
            && self.shared.is_handed_round(name);
        // Rung and first in line: nobody to skip, so the plain grant (the
        // queue's subquery cost a woken waiter's grant about 100 µs of its
        // hand-over; docs/BENCHMARKS.md, "Seventh pass"). Safety never
        // depends on it either: the grant is one statement on the lease row.
        let plain = std::mem::take(&mut st.first_in_line);
        let granted: Option<i64> = if join_first {
            None
        } else {
            on_conn!(self, &mut st, pool, |conn| async {
                let grant = |sql| self.mysql_grant(sql, holder, name, opts.ttl);
                if light {
                    self.sent(1);
                    let updated = grant(&self.sql.mysql_acquire_fair_light)
                        .execute(&mut *conn)
                        .await?;
                    if updated.rows_affected() == 1 {
                        return Ok(Some(updated.last_insert_id() as i64));
                    }
                }
                self.sent(1);
                let q = match (self.fair, first) {
                    (false, _) => &self.sql.mysql_acquire,
                    (true, false) if plain => &self.sql.mysql_acquire,
                    (true, true) => &self.sql.mysql_acquire_fair_first,
                    (true, false) => &self.sql.mysql_acquire_fair,
                };
                let mut q = grant(q);
                if self.fair && !first && !plain {
                    q = q.bind(name).bind(holder).bind(holder);
                }
                let updated = q.execute(&mut *conn).await?;
                if updated.rows_affected() == 1 {
                    return Ok(Some(updated.last_insert_id() as i64));
                }
                if known {
                    return Ok(None);
                }
                self.sent(1);
                let created = sqlx::query(&self.sql.mysql_create)
                    .bind(name)
                    .bind(holder)
                    .bind(&*self.client_id)
                    .bind(micros(opts.ttl))
                    .execute(&mut *conn)
                    .await?;
                if created.rows_affected() != 1 {
                    return Ok(None);
                }
                // The first grant of this name: take its bell now (the insert
                // cannot take it only when it wins).
                self.sent(1);
                let _: Option<i64> = sqlx::query_scalar(&self.sql.mysql_ring)
                    .bind(name)
                    .fetch_one(&mut *conn)
                    .await?;
                Ok(Some(1))
            })?
        };
        // The row exists now, whoever made it: the next refusals skip the
        // insert.
        self.shared.know_row(name);
        if granted.is_none() {
            self.shared.contend(name);
        }
        if let Some(token) = granted {
            if self.fair && queue {
                self.shared.granted_after(name, st.rang);
            }
            let token = self.token(token)?;
            // Served: our place (if we queued) is deleted in the background,
            // off the hand-over's path; until then it is skipped as the
            // holder's (see `mysql_acquire_fair`), and after our release as
            // a place whose bell is free. The release waits for it, so that
            // the queue holds no rows of past holders.
            let served = st.joined.take().map(|_| {
                let (table, name, holder) = (self.clone(), name.to_string(), holder.to_string());
                tokio::spawn(async move { table.leave_mysql(&name, &holder).await })
            });
            let bell = std::mem::take(&mut st.conn);
            let lease = self.lease(
                name,
                opts,
                requested_at,
                holder,
                token,
                Kept {
                    bell,
                    served,
                    waited: false,
                },
            );
            return Ok(Try::Granted(lease));
        }
        if self.fair && queue {
            let due = st
                .joined
                .is_none_or(|at| at.elapsed() >= self.poll_fallback);
            if due {
                on_conn!(self, &mut st, pool, |conn| async {
                    self.sent(1);
                    sqlx::query(&self.sql.mysql_join)
                        .bind(name)
                        .bind(holder)
                        .bind(holder)
                        .bind(micros(self.place()))
                        .execute(&mut *conn)
                        .await
                })?;
                st.joined = Some(Instant::now());
            }
        }
        Ok(Try::Refused(self.poll_fallback))
    }

    /// Delete a waiter's place (and the lapsed places of `name`) through the
    /// pool.
    #[cfg(feature = "lease-mysql")]
    async fn leave_mysql(&self, name: &str, waiter: &str) {
        #[allow(irrefutable_let_patterns)]
        if let Pool::MySql(pool) = &self.pool {
            let left = with_reconnect(|| async {
                self.sent(1);
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

    /// MariaDB: an acquire that was not granted gives its connection back.
    /// A waiter with a place first deletes it and lets its bells go on that
    /// connection (or, when that fails, closes it, which lets them go too).
    /// True when the place was dealt with here.
    #[cfg(feature = "lease-mysql")]
    async fn give_up_mysql(&self, name: &str, waiter: &str, st: &mut MyWait) -> bool {
        let Some(mut conn) = st.conn.0.take() else {
            return false;
        };
        if st.joined.take().is_none() {
            drop(conn); // back to the pool: it never waited, so holds no bell
            return false;
        }
        let cleaned = async {
            self.sent(2);
            sqlx::query(&self.sql.mysql_leave)
                .bind(name)
                .bind(waiter)
                .execute(&mut *conn)
                .await?;
            sqlx::query_scalar::<_, Option<i64>>(&self.sql.mysql_unring)
                .fetch_one(&mut *conn)
                .await
        }
        .await;
        match cleaned {
            Ok(_) => drop(conn), // back to the pool, holding nothing
            Err(e) => {
                tracing::debug!(lock = name, "leaving the queue failed: {e}");
                drop(Bell(Some(conn))); // closed: the server lets the bells go
                self.leave_mysql(name, waiter).await;
            }
        }
        true
    }

    /// A fair waiter gives its place up (it was not granted), through the
    /// pool.
    async fn leave(&self, name: &str, waiter: &str) {
        match &self.pool {
            #[cfg(feature = "lease-postgres")]
            Pool::Postgres(pool) => {
                let left = with_reconnect(|| async {
                    self.sent(1);
                    let (_notified, left): (i64, i64) = sqlx::query_as(&self.sql.pg_leave)
                        .bind(name)
                        .bind(waiter)
                        .fetch_one(pool)
                        .await
                        .map_err(|e| self.err(e))?;
                    if left > 0 {
                        return Ok(());
                    }
                    // The place was gone: a release may have handed this
                    // waiter the lock (its place deleted under the lease
                    // row's lock, so that release has committed by now).
                    self.sent(1);
                    sqlx::query(&self.sql.pg_give_back)
                        .bind(name)
                        .bind(waiter)
                        .execute(pool)
                        .await
                        .map_err(|e| self.err(e))
                        .map(drop)
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
        // On PostgreSQL it starts with the key of this process's listener,
        // whose own channel a release that names it notifies (see
        // `pg_channel`).
        let id = uuid::Uuid::new_v4().simple();
        let holder: Arc<str> = match &self.pool {
            #[cfg(feature = "lease-postgres")]
            Pool::Postgres(_) => format!("{}.{id}", self.shared.listen.key).into(),
            #[allow(unreachable_patterns)]
            _ => id.to_string().into(),
        };
        let queue = !opts.wait.is_zero();
        let mut place = QueuePlace {
            table: (self.fair && queue).then(|| self.clone()),
            name: name.to_string(),
            waiter: holder.clone(),
        };
        let counters = &self.shared.counters;
        let state = AcquireState {
            first: AtomicBool::new(true),
            #[cfg(feature = "lease-postgres")]
            behind: Arc::default(),
            #[cfg(feature = "lease-postgres")]
            handed: Arc::default(),
            #[cfg(feature = "lease-postgres")]
            since: Mutex::new(Instant::now()),
            #[cfg(feature = "lease-mysql")]
            my: tokio::sync::Mutex::new(MyWait::default()),
        };
        let result = match &self.pool {
            #[cfg(feature = "lease-postgres")]
            Pool::Postgres(pool) => {
                let filter = self.fair.then(|| holder.clone());
                let behind = self.fair.then(|| state.behind.clone());
                let handed = self.fair.then(|| state.handed.clone());
                // While the `LISTEN` connection runs and the lock was seen
                // contended lately, register before the first try, which
                // costs no round trip: a release after it is seen, so a
                // refusal is followed by the wait at once. Otherwise start
                // it after the first refusal and try again. Not for a quiet
                // lock: the listener closes only when nobody is registered,
                // and a stream of uncontended acquires, each registered
                // during its try, kept it open (every release then went to
                // it: 0.73–0.97× the uncontended rate after contention).
                let registered = if queue && self.shared.is_contended(name) {
                    self.shared.listen.register_if_running(
                        name,
                        filter.clone(),
                        behind.clone(),
                        handed.clone(),
                    )
                } else {
                    None
                };
                match registered {
                    Some(r) => {
                        wait_for_grant(
                            name,
                            opts.wait,
                            counters,
                            || self.try_postgres(pool, name, opts, &holder, queue, &state),
                            || async { RegisteredWaiter(r) },
                        )
                        .await
                    }
                    None => {
                        let attempt =
                            || self.try_postgres(pool, name, opts, &holder, queue, &state);
                        wait_for_grant(name, opts.wait, counters, attempt, || async {
                            let registration = self
                                .shared
                                .listen
                                .register(pool, name, filter, behind, handed)
                                .await;
                            SubscribedWaiter(registration)
                        })
                        .await
                    }
                }
            }
            #[cfg(feature = "lease-mysql")]
            Pool::MySql(pool) => {
                let result = wait_for_grant(
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
                            state: &state,
                        }
                    },
                )
                .await;
                if result.is_err() {
                    let mut st = state.my.lock().await;
                    if self.give_up_mysql(name, &holder, &mut st).await {
                        place.table = None;
                    }
                }
                result
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

/// A PostgreSQL try's answer: the token when granted, how long to wait and
/// whether a live place is ahead when refused, and whether the grant was
/// handed over (fair, later tries only).
#[cfg(feature = "lease-postgres")]
type PgTry = (Option<i64>, Option<f64>, Option<bool>, Option<bool>);

/// What the tries (and, on MariaDB, the waits) of one acquire share.
struct AcquireState {
    /// No try sent yet: the next one takes the uncontended path.
    first: AtomicBool,
    /// PostgreSQL, fair: the last refused try saw a live place ahead of ours
    /// (see [`Wakers::register_behind`]).
    #[cfg(feature = "lease-postgres")]
    behind: Arc<AtomicBool>,
    /// PostgreSQL, fair: the token of a grant that a release handed to this
    /// waiter (0: none yet), left by the listener before it wakes the
    /// waiter (see [`Statements::pg_release`]).
    #[cfg(feature = "lease-postgres")]
    handed: Arc<AtomicI64>,
    /// PostgreSQL, fair: when the last try that was refused was sent (at
    /// first, when the acquire began). A hand-over happens after that
    /// try ran, so a lease handed over counts its validity from it.
    #[cfg(feature = "lease-postgres")]
    since: Mutex<Instant>,
    /// MariaDB: the acquire's connection and its place.
    #[cfg(feature = "lease-mysql")]
    my: tokio::sync::Mutex<MyWait>,
}

/// MariaDB: what one acquire keeps between its tries and waits.
#[cfg(feature = "lease-mysql")]
#[derive(Default)]
struct MyWait {
    /// The acquire's connection: its tries, its place (with its own bell)
    /// and its waits run on it, and a grant keeps it for the lease. Closed
    /// if dropped here (a dropped acquire), which lets its bells go.
    conn: Bell,
    /// When our place was taken or last renewed, with our bell held on
    /// `conn`; `None` while we have no place (or lost it with a connection).
    joined: Option<Instant>,
    /// The holder's token when the name's bell was last found free while the
    /// lease was held: seen twice for the same token, that holder has no bell.
    free_bell_seen: Option<i64>,
    /// A wait of this acquire ended because the bell it waited on was let
    /// go by its holder (a release, or the waiter before us going on).
    rang: bool,
    /// The last wait rang, and found no live place before ours but the one
    /// whose bell it waited on (`first_now` in `Statements::mysql_wait`):
    /// the next try is the plain grant, without the queue's subquery (and
    /// takes this back to false).
    first_in_line: bool,
}

#[cfg(feature = "lease-mysql")]
impl MyWait {
    /// The connection failed: close it (the server lets its bells go, so
    /// our place is no longer live) and join again at the next try.
    fn lost(&mut self) {
        self.conn = Bell::default();
        self.joined = None;
        self.first_in_line = false;
    }
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

/// A PostgreSQL waiter registered before its first try (the `LISTEN`
/// connection was running): it waits right after its first refusal.
#[cfg(feature = "lease-postgres")]
struct RegisteredWaiter(Registration);

#[cfg(feature = "lease-postgres")]
impl Waiter for RegisteredWaiter {
    const TRY_AFTER_SETUP: bool = false;

    fn arm(&mut self) {
        self.0.arm();
    }

    async fn wait(&mut self, bound: Duration) -> Result<bool, LockError> {
        Ok(self.0.wait(bound).await)
    }
}

/// The `LISTEN` side of a PostgreSQL lease table: one connection, started
/// by the first waiter, routing the table's notifications to the waiters.
#[cfg(feature = "lease-postgres")]
struct Listen {
    channel: String,
    /// Random per listener: waiter ids start with it, and the releases
    /// that name one of them notify its own channel alone
    /// ([`own_channel`], listened to beside the table's), so that the other
    /// processes' listeners do not receive them.
    key: String,
    wakers: Arc<Wakers>,
    /// The listening task runs (a mirror of `Phase::Running`, read without
    /// the lock).
    running: Arc<AtomicBool>,
    /// Never held across an `await`: a waiter's future that stops being
    /// polled must not hold up the other waiters (see [`Listen::register`]).
    state: Mutex<ListenState>,
}

#[cfg(feature = "lease-postgres")]
#[derive(Default)]
struct ListenState {
    phase: Phase,
    /// Dropping it stops the listening task (or its start).
    _stop: Option<oneshot::Sender<()>>,
}

#[cfg(feature = "lease-postgres")]
enum Phase {
    /// Not listening; when the last start failed, if it did.
    Idle {
        failed_at: Option<Instant>,
    },
    /// A start is under way; its outcome (true: listening) comes here.
    Starting(watch::Receiver<Option<bool>>),
    Running,
}

#[cfg(feature = "lease-postgres")]
impl Default for Phase {
    fn default() -> Self {
        Phase::Idle { failed_at: None }
    }
}

#[cfg(feature = "lease-postgres")]
impl Listen {
    fn new(table: &str) -> Self {
        let key = format!("{:016x}", rand::random::<u64>());
        Listen {
            channel: table.to_string(),
            key,
            wakers: Arc::new(Wakers::default()),
            running: Arc::new(AtomicBool::new(false)),
            state: Mutex::new(ListenState::default()),
        }
    }

    /// Register a waiter for lock `name` if the table's channel is being
    /// listened to already (no round trip); `None` otherwise. Should the
    /// listening task end right after, it wakes every waiter.
    fn register_if_running(
        &self,
        name: &str,
        waiter: Option<Arc<str>>,
        behind: Option<Arc<AtomicBool>>,
        handed: Option<Arc<AtomicI64>>,
    ) -> Option<Registration> {
        if !self.running.load(Ordering::SeqCst) {
            return None;
        }
        let registration = self.wakers.register_behind(name, waiter, behind, handed);
        // Checked again after registering: a task that ended in between
        // woke the waiters registered before us, not us; and a task that
        // stops for want of waiters clears the flag before it looks for
        // them (SeqCst on both sides), so it sees us or we see it stopped.
        self.running.load(Ordering::SeqCst).then_some(registration)
    }

    /// Register a waiter for lock `name`; the table's channel is `LISTEN`ed
    /// to (confirmed by the server) before this returns. `None` when that
    /// failed: the waiter polls.
    ///
    /// The connection is started by a task of its own, which every waiter
    /// that comes meanwhile waits for: when the start ran in the first
    /// waiter's future under a lock, a future that stopped being polled
    /// there (dropped neither, as a task stuck elsewhere) kept every later
    /// waiter of the service from registering, past its own `wait`.
    async fn register(
        self: &Arc<Self>,
        pool: &PgPool,
        name: &str,
        waiter: Option<Arc<str>>,
        behind: Option<Arc<AtomicBool>>,
        handed: Option<Arc<AtomicI64>>,
    ) -> Option<Registration> {
        let registration = self.wakers.register_behind(name, waiter, behind, handed);
        let mut outcome = {
            let mut state = self.state.lock().expect("listen state");
            match &state.phase {
                Phase::Running => return Some(registration),
                Phase::Idle {
                    failed_at: Some(at),
                } if at.elapsed() < LISTEN_RETRY => return None,
                Phase::Starting(outcome) => outcome.clone(),
                Phase::Idle { .. } => self.start(pool, &mut state),
            }
        };
        let listening = outcome
            .wait_for(Option::is_some)
            .await
            .is_ok_and(|started| *started == Some(true));
        listening.then_some(registration)
    }

    /// Start the listening task; the receiver says whether it listens.
    fn start(
        self: &Arc<Self>,
        pool: &PgPool,
        state: &mut ListenState,
    ) -> watch::Receiver<Option<bool>> {
        let (outcome_tx, outcome) = watch::channel(None);
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        state.phase = Phase::Starting(outcome.clone());
        state._stop = Some(stop_tx);
        let me: Weak<Listen> = Arc::downgrade(self);
        let wakers = self.wakers.clone();
        let pool = pool.clone();
        let channels = [self.channel.clone(), own_channel(&self.key)];
        tokio::spawn(async move {
            let connect = tokio::time::timeout(CONNECT_TIMEOUT, async {
                let mut listener = PgListener::connect_with(&pool).await?;
                listener
                    .listen_all(channels.iter().map(String::as_str))
                    .await?;
                Ok::<_, sqlx::Error>(listener)
            });
            let started = tokio::select! {
                started = connect => started,
                _ = &mut stop_rx => return,
            };
            let Some(listen) = me.upgrade() else { return };
            let mut listener = {
                let mut state = listen.state.lock().expect("listen state");
                match started {
                    Ok(Ok(l)) => {
                        state.phase = Phase::Running;
                        listen.running.store(true, Ordering::SeqCst);
                        l
                    }
                    failed => {
                        tracing::debug!(
                            issuer = ISSUER_POSTGRES,
                            "LISTEN unavailable, polling: {failed:?}"
                        );
                        state.phase = Phase::Idle {
                            failed_at: Some(Instant::now()),
                        };
                        state._stop = None;
                        outcome_tx.send_replace(Some(false));
                        return;
                    }
                }
            };
            drop(listen);
            outcome_tx.send_replace(Some(true));
            let mut idle = tokio::time::interval(LISTEN_IDLE);
            idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut quiet_ticks = 0;
            let mut seen = wakers.registrations();
            loop {
                tokio::select! {
                    _ = idle.tick() => {
                        // Quiet: nobody waits now AND nobody registered
                        // since the last tick. Looking only at the moment
                        // of the tick closed the listener about once a
                        // second on a hot lock, whose waiters come and go
                        // every millisecond: each time a tick fell while
                        // this process held the lock.
                        let registrations = wakers.registrations();
                        let quiet = wakers.is_empty() && registrations == seen;
                        seen = registrations;
                        quiet_ticks = if quiet { quiet_ticks + 1 } else { 0 };
                        if quiet_ticks < 3 {
                            continue;
                        }
                        let Some(me) = me.upgrade() else { return };
                        let mut state = me.state.lock().expect("listen state");
                        me.running.store(false, Ordering::SeqCst);
                        if wakers.is_empty() {
                            state.phase = Phase::default();
                            state._stop = None;
                            tracing::debug!(issuer = ISSUER_POSTGRES, "no waiter: UNLISTEN");
                            return;
                        }
                        // A waiter registered meanwhile: go on listening.
                        me.running.store(true, Ordering::SeqCst);
                        quiet_ticks = 0;
                    }
                    got = listener.try_recv() => match got {
                        Ok(Some(n)) => {
                            if let Some((target, name)) = n.payload().split_once(' ') {
                                // `<waiter>=<token>`: a release handed the
                                // lock to that waiter.
                                match target.split_once('=').map(|(w, t)| (w, t.parse())) {
                                    Some((waiter, Ok(token))) => {
                                        wakers.hand_over(name, waiter, token)
                                    }
                                    _ => wakers.notify(name, target),
                                }
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
                let mut state = me.state.lock().expect("listen state");
                state.phase = Phase::default();
                me.running.store(false, Ordering::SeqCst);
                state._stop = None;
            }
            wakers.notify_all();
        });
        outcome
    }
}

/// A MariaDB waiter: blocks in `GET_LOCK` on the bell of the one before it
/// (see [`Statements::mysql_wait`]), on the acquire's connection.
#[cfg(feature = "lease-mysql")]
struct BellWaiter<'a> {
    table: LeaseTable,
    pool: MySqlPool,
    name: String,
    waiter: Arc<str>,
    state: &'a AcquireState,
}

#[cfg(feature = "lease-mysql")]
impl Waiter for BellWaiter<'_> {
    const TRY_AFTER_SETUP: bool = false;

    fn arm(&mut self) {}

    /// One wait statement, blocking until the bell it waits on is let go
    /// (true: a release, or the waiter before us went away), or the bound.
    /// Only when the name's bell is found free while the lease is held does
    /// it ask again: the holder may be taking it right now; free twice for
    /// the same holder, that holder has no bell, and we poll.
    async fn wait(&mut self, bound: Duration) -> Result<bool, LockError> {
        let t = &self.table;
        let deadline = Instant::now() + bound;
        let mut st = self.state.my.lock().await;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || (t.fair && st.joined.is_none()) {
                // Out of time, or our place was lost with a connection: try
                // (and join) again.
                return Ok(false);
            }
            type Row = (
                Option<i64>,
                u64,
                Option<i64>,
                Option<String>,
                Option<i64>,
                Option<i64>,
                Option<i64>,
                Option<i64>,
            );
            let waited = on_conn_once!(t, &mut st, &self.pool, |conn| async {
                t.sent(1);
                sqlx::query_as::<_, Row>(&t.sql.mysql_wait)
                    .bind(micros(t.lock_delay))
                    .bind(left.as_secs_f64())
                    .bind(micros(t.lock_delay))
                    .bind(&*self.waiter)
                    .bind(&self.name)
                    .fetch_optional(&mut *conn)
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
            let Some((_, token, held, pred, bell_free, rang, first_now, _)) = row else {
                t.shared.forget_row(&self.name);
                return Ok(false);
            };
            let token = token.min(i64::MAX as u64) as i64;
            match (bell_free, rang) {
                // The bell was held and came to us: its holder let it go.
                (Some(0), Some(1)) => {
                    st.rang = true;
                    st.first_in_line = t.fair && first_now == Some(1);
                    return Ok(true);
                }
                // The bell was free: the waiter before us went away, or the
                // lock is free; try at once.
                (Some(1), Some(1)) if pred.is_some() || held != Some(1) => return Ok(false),
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

/// What a MariaDB grant keeps until its release: the bells' connection, and
/// the deletion of its place in the queue while that is in flight.
#[derive(Default)]
struct Kept {
    bell: Bell,
    served: Option<tokio::task::JoinHandle<()>>,
    /// PostgreSQL: granted to a waiter, after its first try: whoever queued
    /// behind it knows so, and waits for a release that names it.
    waited: bool,
}

/// MariaDB: the pool connection that holds an acquire's or a lease's bells
/// (the name's, and the waiter's own), kept from the first try to the
/// release. Dropped while still holding it (the lease was never released, or
/// the acquire was dropped), the connection is closed rather than returned
/// to the pool, so the server lets the bells go.
#[derive(Default)]
struct Bell(
    #[cfg(feature = "lease-mysql")] Option<PoolConnection<MySql>>,
    #[cfg(not(feature = "lease-mysql"))] (),
);

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
    /// See [`Kept::waited`].
    #[cfg_attr(not(feature = "lease-postgres"), allow(dead_code))]
    waited: bool,
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
        self.table.sent(1);
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
            (Pool::Postgres(pool), None) => {
                // A fair holder that waited names the first waiter: the
                // waiters behind it know they are behind, and a release that
                // names nobody would not wake them. Else the light release
                // wakes the first in line (and every non-fair waiter).
                let q = if self.table.fair && self.waited {
                    &sql.pg_release
                } else {
                    &sql.pg_release_light
                };
                sqlx::query(q)
                    .bind(&self.name)
                    .bind(&self.holder)
                    .bind(self.token.to_i64())
                    .fetch_optional(pool)
                    .await
                    .map(|row| row.is_some())
            }
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
        self.table.sent(1);
        let released = sqlx::query(&sql.mysql_release)
            .bind(&self.name)
            .bind(&self.holder)
            .bind(self.token.get())
            .execute(&mut *conn)
            .await;
        match released {
            Ok(r) if r.rows_affected() == 1 => Some(Ok(true)),
            Ok(_) => {
                // Not ours any more, and the bells may still be: let them
                // go before the connection goes back to the pool.
                self.table.sent(1);
                let unrung = sqlx::query_scalar::<_, Option<i64>>(&sql.mysql_unring)
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
