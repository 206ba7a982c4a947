//! The lease table on MySQL/MariaDB: its [`Statements`] and stored
//! functions, how they are installed
//! ([`install_mysql`](super::install_mysql)), and how its waiters wait on
//! bells.
//!
//! # Waiting: the holder rings a bell
//! MariaDB has no `LISTEN`. The holder's grant function takes a user-level
//! lock, the *bell* (`GET_LOCK('fencelock:<md5 of database/table/name>')`,
//! inside the `update`, evaluated only for the row it grants), on a pool
//! connection that the lease keeps until its release, whose statement
//! `RELEASE_LOCK`s it. A refused waiter blocks in `GET_LOCK` on the bell (and
//! releases it in the same statement), bounded by the holder's `expires_at`
//! as the database says it and by the fallback poll: the release wakes it at
//! once, with no polling while the lock is held. A fair waiter behind
//! another blocks on that waiter's own bell instead (each waiter holds one
//! while it waits), so that a release wakes the first in line alone.
//!
//! A fair acquire whose previous acquire of the same lock (in this service)
//! was handed the lock that way takes its place before any try: on a lock
//! handed round from waiter to waiter, the try of a holder that asks again
//! right after its release is refused anyway, and skipping it gave three
//! workers on one hot page about 4 % more edits. A waiter whose bell rang
//! and whose wait found nobody else before it (no live place before ours
//! but the one whose bell we waited on) takes the lock with the plain grant,
//! without the fair grant's look at the queue: that subquery cost every
//! hand-over about 100 µs. (Both measured on the hot page with three
//! workers: docs/BENCHMARKS.md, "Fair locks on a hot page".)
//!
//! When no bell is held (a holder whose connection died, or a grant that
//! raced a waiter for the bell), the waiter sees the bell free twice for the
//! same token and polls every 20 ms until that lease ends. The cost: every
//! held lease pins one pool connection, and each waiter one while it waits.
//!
//! MariaDB does not hand the lock over in the release as PostgreSQL does:
//! one statement there cannot write the lease row and delete the place.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::mysql::{MySql, MySqlArguments, MySqlConnection, MySqlPool};
use sqlx::query::QueryScalar;
use tokio::time::Instant;

use super::{
    with_reconnect, Acquired, Attempt, Database, Dialect, Granted, Held, LeaseTable,
    LeaseTableOptions, Looked, Request, ISSUER_MYSQL, KNOWN_ROWS,
};
use crate::{wait_for_grant, LockError, Try};

mod bell;
mod install;
mod statements;

use bell::{on_conn, Bell, BellWaiter, MyWait};
pub use statements::Statements;

impl LeaseTable {
    /// [`LeaseTable::mysql`] with options (table name, creation, pool size).
    ///
    /// The library sends calls of the table's stored functions (see
    /// [`Statements`]). When they are missing or from another version and
    /// creation is on, it installs them (as [`install_mysql`] does,
    /// granting nothing); a user that may not (a lock client, with EXECUTE
    /// alone) gets `InvalidConfig` saying what their definer must run.
    ///
    /// [`install_mysql`]: crate::lease_table::install_mysql
    pub async fn mysql_with(
        url: &str,
        options: LeaseTableOptions,
    ) -> Result<LeaseTable, LockError> {
        let (pool, light) = super::install::ready::<MySqlConnection>(&options, url).await?;
        Ok(Self::on_mysql(pool, &options, light))
    }

    /// A holder lookup on the lease table at `url` for a login that may
    /// only read it ([`LeaseTableOptions::read_only`]).
    pub async fn mysql_reader(url: &str) -> Result<LeaseTable, LockError> {
        let options = LeaseTableOptions::default().read_only(true);
        Self::mysql_with(url, options).await
    }

    fn on_mysql(pool: MySqlPool, options: &LeaseTableOptions, light: bool) -> LeaseTable {
        LeaseTable::new(Database::MySql(Arc::new(MyDialect {
            pool,
            sql: Arc::new(Statements::for_table(&options.table)),
            light,
            reader: options.read_only,
            known_rows: Mutex::default(),
            handed_round: Mutex::default(),
        })))
    }
}

/// The MySQL/MariaDB side of a [`LeaseTable`], shared by its clones.
pub(super) struct MyDialect {
    pool: MySqlPool,
    sql: Arc<Statements>,
    /// The queue has its trigger, so a quiet lock's fair first try can be
    /// [`Statements::acquire_fair_light`].
    light: bool,
    /// Looks holders up with the lease table's own `select`.
    reader: bool,
    /// Lock names whose row is known to exist, so that a refused grant need
    /// not try to create it (at most [`KNOWN_ROWS`]; forgotten when a wait
    /// finds no row).
    known_rows: Mutex<HashSet<String>>,
    /// Fair: lock names whose last acquire here was handed the lock by a
    /// release it waited for (its bell rang). Their next acquire takes its
    /// place before any try (see [`Acquire::try_once`]). At most
    /// [`KNOWN_ROWS`].
    handed_round: Mutex<HashSet<String>>,
}

impl MyDialect {
    fn row_known(&self, name: &str) -> bool {
        self.known_rows.lock().expect("known rows").contains(name)
    }

    fn know_row(&self, name: &str) {
        remember(&mut self.known_rows.lock().expect("known rows"), name);
    }

    fn forget_row(&self, name: &str) {
        self.known_rows.lock().expect("known rows").remove(name);
    }

    /// Whether lock `name`'s last fair acquire here waited for a release
    /// that rang its bell.
    fn is_handed_round(&self, name: &str) -> bool {
        self.handed_round
            .lock()
            .expect("handed round")
            .contains(name)
    }

    /// A fair acquire of `name` was granted, after a release rang its bell
    /// (`rang`) or not.
    fn granted_after(&self, name: &str, rang: bool) {
        let mut round = self.handed_round.lock().expect("handed round");
        if rang {
            remember(&mut round, name);
        } else {
            round.remove(name);
        }
    }

    /// An acquire that was not granted gives its connection back. A waiter
    /// with a place first deletes it and lets its bells go on that
    /// connection (or, when that fails, closes it, which lets them go too).
    /// True when the place was dealt with here.
    async fn give_up(&self, table: &LeaseTable, name: &str, waiter: &str, st: &mut MyWait) -> bool {
        let Some(mut conn) = st.conn.take() else {
            return false;
        };
        if st.joined.take().is_none() {
            drop(conn); // back to the pool: it never waited, so holds no bell
            return false;
        }
        let cleaned = async {
            table.sent(2);
            sqlx::query(&self.sql.leave)
                .bind(name)
                .bind(waiter)
                .execute(&mut *conn)
                .await?;
            sqlx::query_scalar::<_, Option<i64>>(&self.sql.unring)
                .fetch_one(&mut *conn)
                .await
        }
        .await;
        match cleaned {
            Ok(_) => drop(conn), // back to the pool, holding nothing
            Err(e) => {
                tracing::debug!(lock = name, "leaving the queue failed: {e}");
                drop(Bell::closing(conn)); // the server lets the bells go
                table.leave(name, waiter).await;
            }
        }
        true
    }
}

/// Add `name` to a set of lock names kept to at most [`KNOWN_ROWS`]
/// (emptied when full: forgetting costs a statement, never safety).
fn remember(names: &mut HashSet<String>, name: &str) {
    if !names.contains(name) {
        if names.len() >= KNOWN_ROWS {
            names.clear();
        }
        names.insert(name.to_string());
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

impl Dialect for MyDialect {
    const ISSUER: &'static str = ISSUER_MYSQL;

    fn acquire_id(&self) -> Arc<str> {
        uuid::Uuid::new_v4().simple().to_string().into()
    }

    async fn acquire(&self, request: &Request<'_>) -> Acquired {
        let (table, name, id) = (request.table, request.name, request.id);
        let acquire = Acquire {
            request,
            my: self,
            state: tokio::sync::Mutex::default(),
        };
        let bell = BellWaiter {
            table,
            my: self,
            name,
            waiter: id,
            state: &acquire.state,
        };
        let counters = &table.shared.counters;
        let attempt = || acquire.try_once();
        let lease = wait_for_grant(name, request.opts.wait, counters, attempt, || async {
            bell
        })
        .await;
        let left_queue = match lease {
            Ok(_) => false,
            Err(_) => {
                let mut st = acquire.state.lock().await;
                self.give_up(table, name, id, &mut st).await
            }
        };
        Acquired { lease, left_queue }
    }

    /// Delete a waiter's place (and the lapsed places of `name`) through the
    /// pool.
    async fn leave(&self, table: &LeaseTable, name: &str, waiter: &str) -> Result<(), LockError> {
        with_reconnect(|| async {
            table.sent(1);
            let left = sqlx::query(&self.sql.leave)
                .bind(name)
                .bind(waiter)
                .execute(&self.pool)
                .await;
            left.map(drop).map_err(|e| table.err(e))
        })
        .await
    }

    /// The holder function's text (or the same `select`'s, for a reader):
    /// `held token client_id`.
    async fn lookup(&self, table: &LeaseTable, name: &str) -> Attempt<Option<Looked>> {
        let sql = if self.reader {
            &self.sql.read_holder
        } else {
            &self.sql.holder
        };
        let row: Option<Option<String>> = match sqlx::query_scalar(sql)
            .bind(name)
            .fetch_optional(&self.pool)
            .await
        {
            Ok(row) => row,
            // A reader creates nothing: before the install (or the first
            // lock client) made the table, nothing was granted from it.
            Err(sqlx::Error::Database(d))
                if self.reader
                    && d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .is_some_and(|m| m.number() == 1146) =>
            {
                tracing::warn!(issuer = ISSUER_MYSQL, "holder lookup: {d}: nothing granted");
                None
            }
            Err(e) => return Err(table.err(e)),
        };
        let Some(row) = row.flatten() else {
            return Ok(None);
        };
        let mut fields = row.splitn(3, ' ');
        let held = fields.next() == Some("1");
        let token = fields.next().and_then(|t| t.parse::<u64>().ok());
        match (token, fields.next()) {
            // The column is unsigned: a token past i64 is capped.
            (Some(token), Some(client_id)) => Ok(Some(Looked {
                client_id: client_id.to_string(),
                token: token.min(i64::MAX as u64) as i64,
                held,
            })),
            _ => Err((
                LockError::protocol(ISSUER_MYSQL, format!("holder lookup answered {row:?}")),
                false,
            )),
        }
    }
}

/// One acquire on MySQL/MariaDB: what its tries (and its waits) share.
struct Acquire<'a> {
    request: &'a Request<'a>,
    my: &'a MyDialect,
    /// The acquire's connection and its place.
    state: tokio::sync::Mutex<MyWait>,
}

impl Acquire<'_> {
    /// A grant function's call, with its parameters bound; it answers the
    /// token, or null when refused.
    fn grant<'q>(&'q self, sql: &'q str) -> QueryScalar<'q, MySql, Option<u64>, MySqlArguments> {
        let request = self.request;
        sqlx::query_scalar(sql)
            .bind(&**request.id)
            .bind(request.table.settings.client_id())
            .bind(micros(request.opts.ttl))
            .bind(request.name)
            .bind(micros(request.table.lock_delay))
    }

    /// One grant attempt, on the acquire's connection, which the lease keeps
    /// when granted (it holds the name's bell, and the waiter's own if it
    /// queued). Refused and fair, the waiter takes its place (and its own
    /// bell) when it has none, or renews it when due.
    async fn try_once(&self) -> Result<Try, LockError> {
        let (request, my) = (self.request, self.my);
        let (table, name, holder) = (request.table, request.name, &**request.id);
        let (fair, queue) = (table.settings.is_fair(), request.queue());
        let requested_at = Instant::now();
        let first = request.first_try();
        let mut st = self.state.lock().await;
        let known = my.row_known(name);
        let contended = || table.shared.contended.is_contended(name);
        // A fair first try of a lock not refused lately: the grant alone, if
        // the row says no place can be live (see `Statements::acquire_fair_light`);
        // refused, the statement that looks at the queue follows at once.
        let light = fair && first && my.light && !contended();
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
        let join_first = fair && first && queue && known && contended() && my.is_handed_round(name);
        // Rung and first in line: nobody to skip, so the plain grant (the
        // queue's subquery cost a woken waiter's grant about 100 µs of its
        // hand-over). Safety never depends on it either: the grant is one
        // statement on the lease row.
        let plain = std::mem::take(&mut st.first_in_line);
        let granted: Option<u64> = if join_first {
            None
        } else {
            on_conn!(table, &mut st, &my.pool, |conn| async {
                if light {
                    table.sent(1);
                    let granted = self
                        .grant(&my.sql.acquire_fair_light)
                        .fetch_one(&mut *conn)
                        .await?;
                    if let Some(token) = granted {
                        return Ok(Some(token));
                    }
                }
                table.sent(1);
                let q = match (fair, first) {
                    (false, _) => &my.sql.acquire,
                    (true, false) if plain => &my.sql.acquire,
                    (true, true) => &my.sql.acquire_fair_first,
                    (true, false) => &my.sql.acquire_fair,
                };
                if let Some(token) = self.grant(q).fetch_one(&mut *conn).await? {
                    return Ok(Some(token));
                }
                if known {
                    return Ok(None);
                }
                table.sent(1);
                let created: i32 = sqlx::query_scalar(&my.sql.create)
                    .bind(name)
                    .bind(holder)
                    .bind(table.settings.client_id())
                    .bind(micros(request.opts.ttl))
                    .fetch_one(&mut *conn)
                    .await?;
                if created != 1 {
                    return Ok(None);
                }
                // The first grant of this name: take its bell now (the insert
                // cannot take it only when it wins).
                table.sent(1);
                let _: Option<i64> = sqlx::query_scalar(&my.sql.ring)
                    .bind(name)
                    .fetch_one(&mut *conn)
                    .await?;
                Ok(Some(1))
            })?
        };
        // The row exists now, whoever made it: the next refusals skip the
        // insert.
        my.know_row(name);
        let Some(token) = granted else {
            table.shared.contended.contend(name);
            if fair && queue {
                let due = st
                    .joined
                    .is_none_or(|at| at.elapsed() >= table.settings.poll_fallback());
                if due {
                    on_conn!(table, &mut st, &my.pool, |conn| async {
                        table.sent(1);
                        sqlx::query(&my.sql.join)
                            .bind(name)
                            .bind(holder)
                            .bind(micros(table.settings.place()))
                            .execute(&mut *conn)
                            .await
                    })?;
                    st.joined = Some(Instant::now());
                }
            }
            return Ok(Try::Refused(table.settings.poll_fallback()));
        };
        if fair && queue {
            my.granted_after(name, st.rang);
        }
        let token = table.token(token)?;
        // Served: our place (if we queued) is deleted in the background, off
        // the hand-over's path; until then it is skipped as the holder's (see
        // `Statements::acquire_fair`), and after our release as a place whose
        // bell is free. The release waits for it, so that the queue holds no
        // rows of past holders.
        let served = st.joined.take().map(|_| {
            let (table, name, holder) = (table.clone(), name.to_string(), holder.to_string());
            tokio::spawn(async move { table.leave(&name, &holder).await })
        });
        let held = MyHeld {
            pool: my.pool.clone(),
            sql: my.sql.clone(),
            bell: tokio::sync::Mutex::new(std::mem::take(&mut st.conn)),
            served: Mutex::new(served),
        };
        Ok(Try::Granted(request.lease(requested_at, token, held)))
    }
}

/// What a MySQL/MariaDB lease renews and releases with: the connection that
/// holds its bells, and the deletion of its place in the queue while that is
/// in flight.
struct MyHeld {
    pool: MySqlPool,
    sql: Arc<Statements>,
    /// The connection holding the bell, used by the release.
    bell: tokio::sync::Mutex<Bell>,
    /// Fair: the deletion of our place in the queue, in flight.
    served: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl MyHeld {
    /// The release function's call, with our row's name, holder and token
    /// bound; it answers 1 when released.
    fn release_of<'q>(&'q self, g: &'q Granted) -> QueryScalar<'q, MySql, i32, MySqlArguments> {
        sqlx::query_scalar(&self.sql.release)
            .bind(&g.name)
            .bind(&g.holder)
            .bind(g.token.get())
    }

    /// Release through the pool (the bell's connection is gone).
    async fn release_through_pool(&self, g: &Granted) -> Attempt<bool> {
        g.table.sent(1);
        let released = self.release_of(g).fetch_one(&self.pool).await;
        released.map(|n| n == 1).map_err(|e| g.table.err(e))
    }

    /// Release on the connection that holds the bell, which rings it.
    /// `None` when there is no such connection (it died).
    async fn release_ringing(&self, g: &Granted) -> Option<Result<bool, LockError>> {
        let mut bell = self.bell.lock().await;
        let mut conn = bell.take()?;
        g.table.sent(1);
        let released = self.release_of(g).fetch_one(&mut *conn).await;
        match released {
            Ok(1) => Some(Ok(true)),
            Ok(_) => {
                // Not ours any more, and the bells may still be: let them
                // go before the connection goes back to the pool.
                g.table.sent(1);
                let unrung = sqlx::query_scalar::<_, Option<i64>>(&self.sql.unring)
                    .fetch_one(&mut *conn)
                    .await;
                if unrung.is_err() {
                    *bell = Bell::closing(conn); // closed, not pooled, on drop
                }
                Some(Ok(false))
            }
            // The connection failed: close it (the server lets the bell go)
            // and release through the pool.
            Err(e) => {
                tracing::debug!(lock = %g.name, "release on the bell's connection failed: {e}");
                drop(Bell::closing(conn));
                None
            }
        }
    }
}

impl Held for MyHeld {
    async fn renew(&self, g: &Granted, ttl: Duration) -> Attempt<bool> {
        g.table.sent(1);
        let renewed: Result<i32, _> = sqlx::query_scalar(&self.sql.renew)
            .bind(micros(ttl))
            .bind(&g.name)
            .bind(&g.holder)
            .bind(g.token.get())
            .fetch_one(&self.pool)
            .await;
        renewed.map(|n| n == 1).map_err(|e| g.table.err(e))
    }

    /// Rings the bells, which wakes the next waiter.
    async fn release(&self, g: &Granted) -> Result<bool, LockError> {
        let served = self.served.lock().expect("served mutex").take();
        if let Some(served) = served {
            let _ = served.await;
        }
        match self.release_ringing(g).await {
            Some(released) => released,
            None => with_reconnect(|| self.release_through_pool(g)).await,
        }
    }
}
