//! The lease table on PostgreSQL: the claims both databases meet, then what
//! only PostgreSQL does (the hand-over in the release, its notification on
//! the waiter's own channel, the columns of older tables, a crash). Its
//! `LISTEN` connection is `pg_listen`'s.

use std::sync::Arc;
use std::time::Duration;

use fencelock::lease_table::{postgres::Statements, LeaseTable, LeaseTableOptions};
use fencelock::{AcquireOptions, HolderLookup, Lease, LockError, LockService};
use harness::Postgres;
use sqlx::PgPool;
use tokio::time::Instant;

use super::{
    a_dead_fair_waiter_is_skipped, a_release_wakes_only_the_next_waiter, lease_table_claims,
    names_are_compared_byte_for_byte, postgres_at, statements_of_hand_overs,
    the_highest_token_minted, tokens_keep_increasing_across, wait_tries,
    waiter_is_woken_by_the_release, Db,
};
use crate::support::fair::{self, Queue};
use crate::support::{
    assert_timeout, contract, granted, held, held_with, spawn_acquire, take_and_release,
};

lease_table_claims!(postgres_at(), "lease-postgres");

/// The library's statements for the default table.
fn statements() -> Statements {
    Statements::for_table("fencelock_leases")
}

/// A fair first try of lock `page`, with the library's own statement, by
/// `holder` (client `client`, TTL `ttl` s), whose place would last 60 s:
/// the token when granted, how long to wait, whether a place is ahead.
async fn fair_first_try(
    pool: &PgPool,
    holder: &str,
    client: &str,
    ttl: f64,
) -> (Option<i64>, Option<f64>, Option<bool>) {
    // `$1` name, `$2` holder, `$3` TTL, `$4` lock-delay, `$5` client id,
    // `$6` how long a place lasts.
    sqlx::query_as(&statements().acquire_fair_first)
        .bind("page")
        .bind(holder)
        .bind(ttl)
        .bind(0.0_f64)
        .bind(client)
        .bind(60.0_f64)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The release of lock `page` by `holder` with token `token`, with the
/// library's own statement: whether it released.
async fn release(pool: &PgPool, holder: &str, token: i64) -> bool {
    sqlx::query_scalar(&statements().release)
        .bind("page")
        .bind(holder)
        .bind(token)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The next notification `listener` hears, within 10 s.
async fn notified(listener: &mut sqlx::postgres::PgListener) -> String {
    tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("notified")
        .unwrap()
        .payload()
        .to_string()
}

/// A listener of `channel`, on its own connection.
async fn listening(pool: &PgPool, channel: &str) -> sqlx::postgres::PgListener {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .unwrap();
    listener.listen(channel).await.unwrap();
    listener
}

/// PostgreSQL: the refused try that takes the waiter's place, the grant
/// (which deletes it), the release (which notifies the next waiter): the
/// notification itself is no statement of the waiter's.
#[tokio::test]
async fn postgres_a_fair_hand_over_costs_the_waiter_three_statements() {
    let (svc, db) = postgres_at().await;
    let waiter = db.woken_service().await;
    assert_eq!(statements_of_hand_overs(&svc, &db, &waiter, 2).await[1], 3);
}

/// PostgreSQL: the release of a holder that waited hands the lock to the
/// first live place in the same statement. Driven with the library's own
/// statements, to look at each step: the lease row names the waiter (its
/// holder id and client id, its TTL, the token plus one), its place is
/// gone, and the notification carries the grant. A try of the waiter that
/// did not see that notification finds the lock its own (`handed`) and
/// queues nothing; its release, with nobody queued, releases.
#[tokio::test]
async fn postgres_a_release_hands_the_lock_to_the_first_live_place() {
    let (_svc, db) = postgres_at().await;
    let pool = db.pg();
    let mut listener = listening(pool, "fencelock_leases").await;
    let (held, _, _) = fair_first_try(pool, "h1", "holder-client", 30.0).await;
    let held = held.expect("granted, nobody queued");
    let (refused, _, _) = fair_first_try(pool, "w1", "waiter-client", 12.0).await;
    assert_eq!(refused, None);
    assert_eq!(db.queued("page").await, 1);

    assert!(release(pool, "h1", held).await, "released");
    assert_eq!(
        notified(&mut listener).await,
        format!("w1={} page", held + 1)
    );
    let (holder, client, token, released, ttl_left): (String, String, i64, bool, f64) =
        sqlx::query_as(
            "select holder, client_id, token, released,
                    extract(epoch from expires_at - now())::float8
               from fencelock_leases where name = 'page'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(
        (holder.as_str(), client.as_str(), token, released),
        ("w1", "waiter-client", held + 1, false),
        "the lock is the waiter's, with its client id and the next token"
    );
    assert!(
        ttl_left > 10.0 && ttl_left <= 12.0,
        "for the waiter's TTL: {ttl_left}"
    );
    assert_eq!(db.queued("page").await, 0, "the place was served");

    // The waiter's next try (as after a lost notification).
    let (token, wait, _, handed): (Option<i64>, Option<f64>, Option<bool>, Option<bool>) =
        sqlx::query_as(&statements().acquire_fair)
            .bind("page")
            .bind("w1")
            .bind(12.0_f64)
            .bind(0.0_f64)
            .bind("waiter-client")
            .bind(60.0_f64)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((token, wait, handed), (Some(held + 1), None, Some(true)));
    assert_eq!(db.queued("page").await, 0, "a handed waiter does not queue");

    // Nobody queued: the waiter's release releases, and wakes anybody.
    assert!(release(pool, "w1", held + 1).await);
    assert_eq!(notified(&mut listener).await, "* page");
    assert!(
        !release(pool, "w1", held + 1).await,
        "a second release finds it no longer held"
    );
}

/// PostgreSQL: a release that hands the lock to a waiter whose id carries
/// its process's listener key (`<key>.<random>`, as the library's ids do)
/// notifies that process's own channel, `fencelock_<key>`, and not the
/// table's, where every other process's listener would receive it. The
/// table's channel gets a marker sent after the release: it is the first
/// thing a listener there hears, so no hand-over came before it (NOTIFY
/// delivers in commit order).
#[tokio::test]
async fn postgres_a_hand_over_is_notified_on_the_waiters_own_channel() {
    let (_svc, db) = postgres_at().await;
    let pool = db.pg();
    let mut table = listening(pool, "fencelock_leases").await;
    let mut own = listening(pool, "fencelock_0123456789abcdef").await;
    let held = fair_first_try(pool, "h1", "client", 30.0).await.0;
    let held = held.expect("granted");
    let waiter = "0123456789abcdef.0123456789abcdef0123456789abcdef";
    let queued = fair_first_try(pool, waiter, "client", 30.0).await.0;
    assert_eq!(queued, None, "queued");
    assert!(release(pool, "h1", held).await, "released");
    assert_eq!(
        notified(&mut own).await,
        format!("{waiter}={} page", held + 1),
        "notified on the waiter's own channel"
    );
    sqlx::query("select pg_notify('fencelock_leases', 'marker')")
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(
        notified(&mut table).await,
        "marker",
        "the table's channel heard the hand-over"
    );
}

/// A new service (see [`Db::woken_service`]) waiting for `page`, which must
/// be held: once its place is taken and it waits (refused, listening,
/// refused again).
async fn a_waiter_in_the_queue(
    db: &Db,
    ttl: Duration,
) -> (
    LeaseTable,
    tokio::task::JoinHandle<Result<Lease, LockError>>,
) {
    let waiter = db.woken_service().await;
    let waiting = spawn_acquire(&waiter, "page", ttl, Duration::from_secs(50));
    db.wait_queued("page", 1).await;
    wait_tries(&waiter, db.tries_before_waiting()).await;
    (waiter, waiting)
}

/// A lease on `page` of a new service that waited for it behind one of
/// `svc`'s (so that its release, a waiter's, hands over).
async fn a_lease_granted_after_waiting(svc: &LeaseTable, db: &Db, ttl: Duration) -> Lease {
    let blocker = held(svc, "page", ttl).await;
    let (_holder, holding) = a_waiter_in_the_queue(db, ttl).await;
    blocker.release().await.unwrap();
    granted(holding, "granted after the release").await
}

/// PostgreSQL, through the library: a waiter is handed the lock by the
/// release of a holder that waited. Its acquire returns on the notification
/// without a statement of its own, with the next token, a validity no
/// longer than its TTL, and the holder lookup naming its client.
#[tokio::test]
async fn postgres_a_waiter_handed_the_lock_sends_no_statement_to_take_it() {
    let (svc, db) = postgres_at().await;
    let ttl = Duration::from_secs(30);
    let lease = a_lease_granted_after_waiting(&svc, &db, ttl).await;
    let (waiter, waiting) = a_waiter_in_the_queue(&db, ttl).await;
    let sent = waiter.statements_sent();
    let released = lease.token().unwrap().get();
    lease.release().await.unwrap();
    let granted = granted(waiting, "granted after the release").await;
    assert_eq!(
        waiter.statements_sent(),
        sent,
        "the hand-over cost the waiter no statement"
    );
    assert_eq!(waiter.wait_stats().timed_out, 0, "woken by the release");
    assert_eq!(granted.token().unwrap().get(), released + 1);
    let validity = granted
        .remaining()
        .expect("a lease table lease has a validity");
    assert!(
        validity <= ttl && validity > ttl / 2,
        "counted from the waiter's last refused try: {validity:?}"
    );
    let named = svc.current_holder("page").await.unwrap().expect("held");
    assert_eq!(named.client_id, waiter.client_id());
    assert_eq!(named.token, granted.token().unwrap());
    assert_eq!(db.queued("page").await, 0);
    granted.release().await.unwrap();
    assert!(svc.current_holder("page").await.unwrap().is_none());
}

/// How many statements of the test's database wait for a lock.
async fn waiting_for_a_lock(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "select count(*) from pg_stat_activity \
          where datname = current_database() and wait_event_type = 'Lock'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Wait (bounded) until `n` statements of the test's database wait for a
/// lock.
pub(super) async fn wait_lock_waiters(pool: &PgPool, n: i64) {
    harness::wait_until(Duration::from_secs(10), || async {
        match waiting_for_a_lock(pool).await {
            w if w == n => Ok(()),
            w => Err(format!("{w} statements waiting for a lock, not {n}")),
        }
    })
    .await
    .unwrap();
}

/// PostgreSQL: a waiter that gives up while a release hands it the lock.
/// The release locks the lease row, then deletes the waiter's place; the
/// waiter's leave deletes the same place. The test holds the place's row so
/// that both wait for it, in either order: leave first, nothing is handed
/// over (the release finds no place to serve); release first, the leave
/// finds its place gone and gives back the lease it was handed. Either way
/// the lock is free at once, not after the waiter's 30 s TTL.
#[tokio::test]
async fn postgres_a_waiter_that_gives_up_during_its_hand_over_leaves_the_lock_free() {
    let (svc, db) = postgres_at().await;
    let pool = db.pg();
    let ttl = Duration::from_secs(30);
    for release_first in [false, true] {
        let lease = a_lease_granted_after_waiting(&svc, &db, ttl).await;
        let (_waiter, waiting) = a_waiter_in_the_queue(&db, ttl).await;

        let mut row = pool.begin().await.unwrap();
        sqlx::query("select 1 from fencelock_leases_waiters where name = 'page' for update")
            .execute(&mut *row)
            .await
            .unwrap();
        let token = lease.token().unwrap().get();
        let releasing = if release_first {
            let releasing = tokio::spawn(async move { lease.release().await });
            wait_lock_waiters(pool, 1).await;
            waiting.abort(); // the acquire is dropped: it leaves the queue
            wait_lock_waiters(pool, 2).await;
            releasing
        } else {
            waiting.abort();
            wait_lock_waiters(pool, 1).await;
            let releasing = tokio::spawn(async move { lease.release().await });
            wait_lock_waiters(pool, 2).await;
            releasing
        };
        row.rollback().await.unwrap();
        releasing.await.unwrap().unwrap();

        harness::wait_until(Duration::from_secs(10), || async {
            match svc.current_holder("page").await.unwrap() {
                None => Ok(()),
                Some(h) => Err(format!("still held: {h:?}")),
            }
        })
        .await
        .unwrap();
        let last: i64 =
            sqlx::query_scalar("select token from fencelock_leases where name = 'page'")
                .fetch_one(pool)
                .await
                .unwrap();
        let handed = if release_first { 1 } else { 0 };
        assert_eq!(
            last as u64,
            token + handed,
            "release first: {release_first}; handed over: {handed}"
        );
        assert_eq!(db.queued("page").await, 0);
        // Free at once.
        take_and_release(&svc, "page", ttl).await;
    }
}

/// PostgreSQL: the fair first try of a lock nobody contended lately is the
/// grant alone, judged by the row's `queued_until`, which the statement
/// that takes a place raises. It must pass no live place: here the lock is
/// free and a waiter of another process (the test, with the library's own
/// statement) has a place. Once that place is gone, `queued_until` still
/// lies ahead, so the light grant is refused and the full one grants: two
/// statements where the full one alone would be one.
#[tokio::test]
async fn postgres_the_light_fair_grant_passes_no_live_place() {
    let (svc, db) = postgres_at().await;
    let pool = db.pg();
    let lease = held(&svc, "page", Duration::from_secs(30)).await;
    // A waiter elsewhere is refused and takes a place for 60 s.
    let (token, _, _) = fair_first_try(pool, "elsewhere", "elsewhere", 30.0).await;
    assert_eq!(token, None, "refused while held");
    assert_eq!(db.queued("page").await, 1);
    lease.release().await.unwrap();

    db.light_grant_refused_while_a_place_lives(&db.service().await)
        .await;
    // The waiter goes away; its place's bound stays in the row.
    sqlx::query("delete from fencelock_leases_waiters")
        .execute(pool)
        .await
        .unwrap();
    db.light_grant_after_the_queue_emptied().await;
}

/// Tables made before `queued_until`, the hand-over's columns and the
/// functions existed: the constructor adds the columns and the functions,
/// and a service told not to touch the schema refuses to start, naming the
/// `alter table`s to run and the install.
#[tokio::test]
async fn postgres_tables_from_before_queued_until_and_the_hand_over_get_the_columns_or_a_clear_refusal(
) {
    let url = harness::fresh_database().await;
    let pool = PgPool::connect(&url).await.unwrap();
    for ddl in &Statements::ddl_statements("fencelock_leases", "public")[..2] {
        sqlx::query(ddl).execute(&pool).await.unwrap();
    }
    for drop in [
        "alter table fencelock_leases drop column queued_until",
        "alter table fencelock_leases drop column login",
        "alter table fencelock_leases_waiters drop column client_id",
        "alter table fencelock_leases_waiters drop column ttl_secs",
        "alter table fencelock_leases_waiters drop column login",
    ] {
        sqlx::query(drop).execute(&pool).await.unwrap();
    }
    let options = LeaseTableOptions::default().create_table(false);
    match LeaseTable::postgres_with(&url, options).await {
        Err(LockError::InvalidConfig(msg)) => {
            for alter in [
                "alter table fencelock_leases add column if not exists queued_until timestamptz",
                "alter table fencelock_leases add column if not exists login text",
                "alter table fencelock_leases_waiters add column if not exists client_id text",
                "alter table fencelock_leases_waiters add column if not exists ttl_secs float8",
                "alter table fencelock_leases_waiters add column if not exists login text",
                "functions of lease table fencelock_leases are missing",
                "install_postgres",
            ] {
                assert!(msg.contains(alter), "{msg}");
            }
        }
        other => panic!("expected a refusal naming the alter table: {other:?}"),
    }
    let svc = LeaseTable::postgres(&url).await.unwrap();
    contract::tokens_strictly_increase(&svc, "page", 3).await;
}

/// A PostgreSQL server of the test's own (to crash), and a service on it.
async fn own_server() -> (Postgres, LeaseTable) {
    let pg = Postgres::start().await;
    let svc = LeaseTable::postgres(&pg.create_database().await).await;
    (pg, svc.unwrap())
}

#[tokio::test]
async fn postgres_tokens_keep_increasing_across_a_database_crash() {
    let (mut pg, svc) = own_server().await;
    let crash = async {
        pg.kill();
        pg.start_again().await;
    };
    tokens_keep_increasing_across(svc, crash).await;
}

#[tokio::test]
async fn lost_signal_fires_when_postgres_is_killed_during_hold() {
    let (mut pg, svc) = own_server().await;
    let ttl = Duration::from_millis(600);
    contract::lost_signal_fires_within(&svc, "page", ttl, || pg.kill(), ttl + ttl / 2).await;
}

/// PostgreSQL: a fair waiter that knows a live place is ahead of its own is
/// not woken by a release that names nobody. When the one ahead gives up,
/// its leave names the next waiter, which then knows it is first: the
/// holder's release (light: the holder never waited, so it names nobody)
/// wakes it at once. Fallback poll 60 s: only a wake explains the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_when_the_first_waiter_gives_up_the_next_is_woken_by_a_release_naming_nobody() {
    let (svc, db) = postgres_at().await;
    let (ttl, long) = (Duration::from_secs(30), Duration::from_secs(50));
    let lease = held(&svc, "page", ttl).await;
    let quitter = db.woken_service().await;
    let quitting = spawn_acquire(&quitter, "page", ttl, Duration::from_secs(2));
    db.wait_queued("page", 1).await;
    let next = db.woken_service().await;
    let waiting = spawn_acquire(&next, "page", ttl, long);
    db.wait_queued("page", 2).await;
    assert_timeout(quitting.await.unwrap(), "the first waiter gives up");
    db.wait_queued("page", 1).await;
    // Woken by the leave: it tried again, and learnt it is first.
    wait_tries(&next, 3).await;
    lease.release().await.unwrap();
    let granted = granted(
        waiting,
        "woken by the holder's release, long before the fallback poll",
    )
    .await;
    assert_eq!(next.wait_stats().timed_out, 0, "{:?}", next.wait_stats());
    granted.release().await.unwrap();
}
