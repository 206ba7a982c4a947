//! The lease table on PostgreSQL: its [`Statements`] and functions, how
//! they are installed ([`install_postgres`](super::install_postgres)), and
//! how its waiters are notified and handed the lock.
//!
//! # Waiting: notified by the release
//! The release function calls `pg_notify` with what its statement answered
//! (channel: the table's name; payload: the first live waiter's id, or `*`,
//! and the lock's name), and only when it matched our holder: not a
//! trigger, which would also fire on grants and renewals unless filtered.
//! `NOTIFY` is transactional: it is delivered when the release commits.
//! One `LISTEN`ing connection per [`LeaseTable`] (taken from its pool at the
//! first contended acquire, closed 0.2–0.3 s after its last waiter left)
//! routes the notifications to this process's waiters; a refused waiter
//! starts it before its second try, so a release between its first try and
//! its wait is not missed. When that connection is lost every waiter is
//! woken (a notification may have been lost with it). A release that names
//! a waiter (the hand-over, see below, or a wake by name) notifies that
//! waiter's process alone, on a channel of its own (see
//! [`Statements::release`]); a `*`, and a waiter id without a key (from a
//! version before these channels), go to the table's channel. What a
//! listener costs the database, and why it closes so soon, is in `listen.rs`.
//!
//! # The hand-over
//! A fair holder that waited (so, on a contended lock, every holder but
//! the first) does not just release: its release statement grants the lock
//! to the first live place in the queue, in the same statement, with the
//! token plus one, the waiter's holder id, client id, login and TTL (kept
//! in its place), and deletes that place. The
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
//! been handed ([`Statements::give_back`]). MariaDB does not hand over:
//! one statement there cannot write the lease row and delete the place.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgConnection, PgPool, Postgres};
use sqlx::query::QueryScalar;
use tokio::time::Instant;

use super::{
    with_reconnect, Acquired, Attempt, Database, Dialect, Granted, Held, LeaseTable,
    LeaseTableOptions, Looked, Request, ISSUER_POSTGRES,
};
use crate::wake::SubscribedWaiter;
use crate::{wait_for_grant, Lease, LockError, Try};

mod install;
mod listen;
mod statements;

use listen::{Listen, RegisteredWaiter};
pub use statements::Statements;

impl LeaseTable {
    /// [`LeaseTable::postgres`] with options (table name, creation, pool size).
    ///
    /// The library sends calls of the table's functions (see [`Statements`]).
    /// When they are missing or from another version and creation is on,
    /// it installs them (as [`install_postgres`] does, granting nothing); a
    /// login that may not (a lock client, with EXECUTE alone) gets
    /// `InvalidConfig` saying what its owner must run.
    ///
    /// [`install_postgres`]: crate::lease_table::install_postgres
    pub async fn postgres_with(
        url: &str,
        options: LeaseTableOptions,
    ) -> Result<LeaseTable, LockError> {
        let (pool, _) = super::install::ready::<PgConnection>(&options, url).await?;
        Ok(Self::on_postgres(pool, &options))
    }

    /// A holder lookup on the lease table at `url` for a login that may
    /// only read it ([`LeaseTableOptions::read_only`]).
    pub async fn postgres_reader(url: &str) -> Result<LeaseTable, LockError> {
        let options = LeaseTableOptions::default().read_only(true);
        Self::postgres_with(url, options).await
    }

    fn on_postgres(pool: PgPool, options: &LeaseTableOptions) -> LeaseTable {
        LeaseTable::new(Database::Postgres(Arc::new(PgDialect {
            pool,
            sql: Arc::new(Statements::for_table(&options.table)),
            listen: Arc::new(Listen::new(&options.table)),
            reader: options.read_only,
        })))
    }
}

/// The PostgreSQL side of a [`LeaseTable`], shared by its clones.
pub(super) struct PgDialect {
    pool: PgPool,
    sql: Arc<Statements>,
    listen: Arc<Listen>,
    /// Looks holders up with the lease table's own `select`.
    reader: bool,
}

impl Dialect for PgDialect {
    const ISSUER: &'static str = ISSUER_POSTGRES;

    /// It starts with the key of this process's listener, whose own channel
    /// a release that names it notifies (see [`Statements::release`]).
    fn acquire_id(&self) -> Arc<str> {
        let id = uuid::Uuid::new_v4().simple();
        format!("{}.{id}", self.listen.key()).into()
    }

    async fn acquire(&self, request: &Request<'_>) -> Acquired {
        let (table, name) = (request.table, request.name);
        let acquire = Acquire {
            request,
            pg: self,
            behind: Arc::default(),
            handed: Arc::default(),
            since: Mutex::new(Instant::now()),
        };
        let filter = table.settings.is_fair().then(|| request.id.clone());
        let behind = table.settings.is_fair().then(|| acquire.behind.clone());
        let handed = table.settings.is_fair().then(|| acquire.handed.clone());
        let (wait, counters) = (request.opts.wait, &table.shared.counters);
        // While the `LISTEN` connection runs and the lock was seen contended
        // lately, register before the first try, which costs no round trip:
        // a release after it is seen, so a refusal is followed by the wait
        // at once. Otherwise start it after the first refusal and try again.
        // Not for a quiet lock: the listener closes only when nobody is
        // registered, and a stream of uncontended acquires, each registered
        // during its try, kept it open (every release then went to it:
        // 0.73–0.97× the uncontended rate after contention).
        let registered = if request.queue() && table.shared.contended.is_contended(name) {
            self.listen
                .register_if_running(name, filter.clone(), behind.clone(), handed.clone())
        } else {
            None
        };
        let attempt = || acquire.try_once();
        let lease = match registered {
            Some(r) => {
                wait_for_grant(name, wait, counters, attempt, || async {
                    RegisteredWaiter(r)
                })
                .await
            }
            None => {
                wait_for_grant(name, wait, counters, attempt, || async {
                    let registration = self
                        .listen
                        .register(&self.pool, name, filter, behind, handed)
                        .await;
                    SubscribedWaiter(registration)
                })
                .await
            }
        };
        Acquired {
            lease,
            left_queue: false,
        }
    }

    async fn leave(&self, table: &LeaseTable, name: &str, waiter: &str) -> Result<(), LockError> {
        with_reconnect(|| async {
            table.sent(1);
            let left: bool = sqlx::query_scalar(&self.sql.leave)
                .bind(name)
                .bind(waiter)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| table.err(e))?;
            if left {
                return Ok(());
            }
            // The place was gone: a release may have handed this waiter the
            // lock (its place deleted under the lease row's lock, so that
            // release has committed by now).
            table.sent(1);
            sqlx::query(&self.sql.give_back)
                .bind(name)
                .bind(waiter)
                .execute(&self.pool)
                .await
                .map_err(|e| table.err(e))
                .map(drop)
        })
        .await
    }

    async fn lookup(&self, table: &LeaseTable, name: &str) -> Attempt<Option<Looked>> {
        let sql = if self.reader {
            &self.sql.read_holder
        } else {
            &self.sql.holder
        };
        let row: Option<(String, i64, bool)> = match sqlx::query_as(sql)
            .bind(name)
            .fetch_optional(&self.pool)
            .await
        {
            Ok(row) => row,
            // A reader creates nothing: before the install (or the first
            // lock client) made the table, nothing was granted from it.
            Err(sqlx::Error::Database(d))
                if self.reader && d.code().as_deref() == Some("42P01") =>
            {
                tracing::warn!(
                    issuer = ISSUER_POSTGRES,
                    "holder lookup: {d}: nothing granted"
                );
                None
            }
            Err(e) => return Err(table.err(e)),
        };
        Ok(row.map(|(client_id, token, held)| Looked {
            client_id,
            token,
            held,
        }))
    }
}

/// A try's answer ([`Statements::acquire`], [`Statements::acquire_fair_first`],
/// [`Statements::acquire_fair`]).
#[derive(sqlx::FromRow)]
struct Tried {
    /// The token when granted.
    token: Option<i64>,
    /// Refused: how long to wait (the lease's rest, or the place ahead's).
    wait_secs: Option<f64>,
    /// Refused: whether a live place is ahead of ours.
    behind: Option<bool>,
    /// Granted by a hand-over (fair, later tries only).
    #[sqlx(default)]
    handed: Option<bool>,
}

/// One acquire on PostgreSQL: what its tries share.
struct Acquire<'a> {
    request: &'a Request<'a>,
    pg: &'a PgDialect,
    /// Fair: the last refused try saw a live place ahead of ours (see
    /// `Wakers::register_behind`).
    behind: Arc<AtomicBool>,
    /// Fair: the token of a grant that a release handed to this waiter (0:
    /// none yet), left by the listener before it wakes the waiter (see
    /// [`Statements::release`]).
    handed: Arc<AtomicI64>,
    /// Fair: when the last try that was refused was sent (at first, when the
    /// acquire began). A hand-over happens after that try ran, so a lease
    /// handed over counts its validity from it.
    since: Mutex<Instant>,
}

impl Acquire<'_> {
    /// One grant attempt (fair or not, in one statement). A fair waiter's
    /// refused try takes or renews its place in the same statement.
    async fn try_once(&self) -> Result<Try, LockError> {
        let request = self.request;
        let (table, name, opts) = (request.table, request.name, request.opts);
        let holder: &str = request.id;
        // A release handed the lock to this waiter: granted, with no
        // statement (see `Statements::release`).
        let handed = self.handed.swap(0, Ordering::SeqCst);
        if handed > 0 {
            return Ok(Try::Handed(self.handed_lease(handed)?));
        }
        let requested_at = Instant::now();
        let place = if table.settings.is_fair() && request.queue() {
            table.settings.place().as_secs_f64()
        } else {
            0.0
        };
        let first = request.first_try();
        if first && !table.shared.contended.is_contended(name) {
            // The light statement: the grant alone (fair: if nobody queues).
            let q = if table.settings.is_fair() {
                &self.pg.sql.acquire_fair_light
            } else {
                &self.pg.sql.acquire_light
            };
            let token: Option<i64> = with_reconnect(|| async {
                table.sent(1);
                sqlx::query_scalar(q)
                    .bind(name)
                    .bind(holder)
                    .bind(opts.ttl.as_secs_f64())
                    .bind(table.lock_delay.as_secs_f64())
                    .bind(table.settings.client_id())
                    .fetch_one(&self.pg.pool)
                    .await
                    .map_err(|e| table.err(e))
            })
            .await?;
            if let Some(t) = token {
                return Ok(Try::Granted(self.lease(requested_at, t, false)?));
            }
            // Refused: from now on the lock counts as contended, and the
            // statement made for that (which queues a fair waiter and says
            // how long to wait) follows at once. A non-fair try-lock needs
            // neither; a fair one needs the look at the queue, since
            // `queued_until` may still lie ahead with nobody left in it.
            table.shared.contended.contend(name);
            *self.since.lock().expect("since mutex") = requested_at;
            if !request.queue() && !table.settings.is_fair() {
                return Ok(Try::Refused(table.settings.poll_fallback()));
            }
        }
        let tried: Tried = with_reconnect(|| async {
            table.sent(1);
            let q = match (table.settings.is_fair(), first) {
                (false, _) => &self.pg.sql.acquire,
                (true, true) => &self.pg.sql.acquire_fair_first,
                (true, false) => &self.pg.sql.acquire_fair,
            };
            let q = sqlx::query_as(q)
                .bind(name)
                .bind(holder)
                .bind(opts.ttl.as_secs_f64())
                .bind(table.lock_delay.as_secs_f64())
                .bind(table.settings.client_id());
            let q = if table.settings.is_fair() {
                q.bind(place)
            } else {
                q
            };
            q.fetch_one(&self.pg.pool).await.map_err(|e| table.err(e))
        })
        .await?;
        Ok(match tried.token {
            Some(t) if tried.handed == Some(true) => Try::Granted(self.handed_lease(t)?),
            Some(t) => Try::Granted(self.lease(requested_at, t, !first)?),
            None => {
                table.shared.contended.contend(name);
                *self.since.lock().expect("since mutex") = requested_at;
                self.behind
                    .store(tried.behind.unwrap_or(false), Ordering::SeqCst);
                Try::Refused(self.bound(tried.wait_secs))
            }
        })
    }

    /// The bound a refusal gives: how long the lease (or the first waiter's
    /// place) still runs, capped by the fallback poll.
    fn bound(&self, wait_secs: Option<f64>) -> Duration {
        let secs = wait_secs.filter(|s| s.is_finite()).unwrap_or(0.0).max(0.0);
        let fallback = self.request.table.settings.poll_fallback();
        Duration::from_secs_f64(secs.min(fallback.as_secs_f64())).max(Duration::from_millis(1))
    }

    /// A lease that a release handed to this waiter (token `token`): its
    /// validity counts from the last try that was refused (the hand-over
    /// came after that try ran), and it names the waiter behind it at its
    /// release, as any waiter that was granted does.
    fn handed_lease(&self, token: i64) -> Result<Lease, LockError> {
        let since = *self.since.lock().expect("since mutex");
        self.lease(since, token, true)
    }

    /// The lease for a grant with token `token`; `waited`: granted to a
    /// waiter, after its first try.
    fn lease(&self, requested_at: Instant, token: i64, waited: bool) -> Result<Lease, LockError> {
        let held = PgHeld {
            pool: self.pg.pool.clone(),
            sql: self.pg.sql.clone(),
            waited,
        };
        let token = self.request.table.token(token)?;
        Ok(self.request.lease(requested_at, token, held))
    }
}

/// A call of a function that answers whether our lease matched.
type Matched<'q> = QueryScalar<'q, Postgres, bool, PgArguments>;

/// What a PostgreSQL lease renews and releases with.
struct PgHeld {
    pool: PgPool,
    sql: Arc<Statements>,
    /// Granted to a waiter, after its first try: whoever queued behind it
    /// knows so, and waits for a release that names it.
    waited: bool,
}

impl PgHeld {
    /// `sql` (a function answering whether our row matched) with our row's
    /// name, holder and token bound.
    fn ours<'q>(&self, sql: &'q str, g: &'q Granted) -> Matched<'q> {
        sqlx::query_scalar(sql)
            .bind(&g.name)
            .bind(&g.holder)
            .bind(g.token.to_i64())
    }

    async fn release_once(&self, g: &Granted) -> Attempt<bool> {
        g.table.sent(1);
        // A fair holder that waited names the first waiter: the waiters
        // behind it know they are behind, and a release that names nobody
        // would not wake them. Else the light release wakes the first in
        // line (and every non-fair waiter).
        let q = if g.table.settings.is_fair() && self.waited {
            &self.sql.release
        } else {
            &self.sql.release_light
        };
        let released = self.ours(q, g).fetch_one(&self.pool).await;
        released.map_err(|e| g.table.err(e))
    }
}

impl Held for PgHeld {
    async fn renew(&self, g: &Granted, ttl: Duration) -> Attempt<bool> {
        g.table.sent(1);
        let renewed = self.ours(&self.sql.renew, g).bind(ttl.as_secs_f64());
        let renewed = renewed.fetch_one(&self.pool).await;
        renewed.map_err(|e| g.table.err(e))
    }

    /// Wakes the next waiter, or hands it the lock (`pg_notify` in the
    /// statement).
    async fn release(&self, g: &Granted) -> Result<bool, LockError> {
        with_reconnect(|| self.release_once(g)).await
    }
}
