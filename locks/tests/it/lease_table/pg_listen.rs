//! PostgreSQL: the `LISTEN` connection of a service, which every
//! notifying commit of the database wakes: it must close soon after the
//! last waiter, stay open while waiters keep coming, and open again for the
//! next one.

use std::time::Duration;

use sqlx::PgPool;

use super::pg::wait_lock_waiters;
use super::{postgres_at, wait_tries};
use crate::support::{granted, held, spawn_acquire, take_and_release};

const TTL: Duration = Duration::from_secs(30);

/// PostgreSQL connections of the test's database, other than the caller's,
/// whose last statement was a `LISTEN`.
async fn pg_listening(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "select count(*) from pg_stat_activity \
          where datname = current_database() and pid <> pg_backend_pid() \
            and query ilike 'listen %'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Waits until no connection listens, failing with `why` after `within`.
async fn pg_listener_closes(pool: &PgPool, within: Duration, why: &str) {
    harness::wait_until(within, || async {
        match pg_listening(pool).await {
            0 => Ok(()),
            n => Err(format!("{n} LISTEN connection(s) {why}")),
        }
    })
    .await
    .unwrap();
}

/// Releases `lease`, then waits (10 s at most) for `waiting`, the acquire
/// that release should wake, and releases what it was granted.
async fn release_then_the_woken(
    lease: fencelock::Lease,
    waiting: tokio::task::JoinHandle<Result<fencelock::Lease, fencelock::LockError>>,
) {
    lease.release().await.unwrap();
    let woken = granted(waiting, "woken by the release").await;
    woken.release().await.unwrap();
}

/// While the `LISTEN` connection is open, every release is delivered to it,
/// waited for or not (it made uncontended acquire+release 2–3× slower after
/// one contended moment): it closes when nobody has waited for a while, and
/// the next waiter opens it again and is still woken by the release, not by
/// the 60 s fallback poll.
#[tokio::test]
async fn postgres_the_listen_connection_closes_when_nobody_waits_and_the_next_waiter_reopens_it() {
    let (svc, db) = postgres_at().await;
    let pool = db.pg();
    let waiter = svc.clone().with_poll_fallback(Duration::from_secs(60));
    for round in 1..=2 {
        let notified = waiter.wait_stats().notified;
        let tries = waiter.wait_stats().tries;
        let lease = held(&svc, "page", TTL).await;
        let waiting = spawn_acquire(&waiter, "page", TTL, Duration::from_secs(50));
        // The holder's try, then the waiter's two: refused, listening,
        // refused again (the clones share their counters).
        wait_tries(&waiter, tries + 3).await;
        assert_eq!(
            pg_listening(pool).await,
            1,
            "round {round}: one LISTEN connection"
        );
        release_then_the_woken(lease, waiting).await;
        assert_eq!(waiter.wait_stats().notified, notified + 1, "round {round}");
        pg_listener_closes(pool, Duration::from_secs(10), "with nobody waiting").await;
    }
}

/// On a hot lock, this process's waiters come and go all the time, and a
/// check of the idle listener may fall in a moment when none waits. The
/// listener must stay open all the same: when only the moment of the check
/// counted, it closed about once a second on the hot page (each time one
/// more `LISTEN`, and one more try of the next waiter). Here each cycle holds
/// the lock 50 ms with nobody waiting, then a waiter comes, is woken by the
/// release and releases: nobody waits at most checks, but one came between
/// every two of them.
#[tokio::test]
async fn postgres_the_listen_connection_stays_open_while_waiters_come_and_go() {
    let (svc, db) = postgres_at().await;
    let pool = db.pg();
    // The listening connection and when it sent its `LISTEN`.
    let listener = || async {
        sqlx::query_scalar::<_, String>(
            "select pid::text || ' ' || query_start::text from pg_stat_activity \
              where datname = current_database() and pid <> pg_backend_pid() \
                and query ilike 'listen %'",
        )
        .fetch_all(pool)
        .await
        .unwrap()
    };
    let waiter = svc.clone().with_poll_fallback(Duration::from_secs(60));
    let mut opened = None;
    for cycle in 0..30 {
        let tries = waiter.wait_stats().tries;
        let lease = held(&svc, "page", TTL).await;
        if cycle > 0 {
            // The shape of the load, not a synchronisation: held alone.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let waiting = spawn_acquire(&waiter, "page", TTL, Duration::from_secs(10));
        // The holder's try and the waiter's refused one (in the first cycle
        // also its second, after it started listening).
        wait_tries(&waiter, tries + if cycle == 0 { 3 } else { 2 }).await;
        if cycle == 0 {
            let now = listener().await;
            assert_eq!(now.len(), 1, "one LISTEN connection: {now:?}");
            opened = Some(now);
        }
        release_then_the_woken(lease, waiting).await;
    }
    assert_eq!(
        Some(listener().await),
        opened,
        "the same LISTEN connection, listening since the first cycle"
    );
    pg_listener_closes(pool, Duration::from_secs(10), "with nobody waiting").await;
}

/// An acquire of a lock that nobody contended lately does not register as
/// a waiter before its first try, so its try does not keep the `LISTEN`
/// connection open: a stream of such acquires right after one contended
/// moment kept it open (every release then went through it) and cost the
/// uncontended path up to a quarter of its rate. Here that first try is held
/// in the server (the test locks the row) while the contended moment ends:
/// the listener must close all the same.
#[tokio::test]
async fn postgres_an_uncontended_try_in_flight_does_not_keep_the_listen_connection_open() {
    let (svc, db) = postgres_at().await;
    let pool = db.pg();
    // The quiet lock's row exists, and was never refused.
    take_and_release(&svc, "quiet", TTL).await;
    // A contended moment on another lock opens the listener.
    let waiter = svc.clone().with_poll_fallback(Duration::from_secs(60));
    let tries = waiter.wait_stats().tries;
    let lease = held(&svc, "page", TTL).await;
    let waiting = spawn_acquire(&waiter, "page", TTL, Duration::from_secs(50));
    wait_tries(&waiter, tries + 3).await;
    assert_eq!(pg_listening(pool).await, 1, "the contended moment listens");

    // The quiet lock's acquire starts while the listener runs, and its try
    // waits in the server for the row the test holds.
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("select 1 from fencelock_leases where name = 'quiet' for update")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let quiet = spawn_acquire(&svc, "quiet", TTL, Duration::from_secs(30));
    wait_lock_waiters(pool, 1).await;

    // The contended moment ends; only the quiet lock's try is in flight.
    release_then_the_woken(lease, waiting).await;
    pg_listener_closes(
        pool,
        Duration::from_secs(5),
        "kept open by a try that is not waiting",
    )
    .await;

    blocker.commit().await.unwrap();
    let quiet = granted(quiet, "granted once the row is let go").await;
    quiet.release().await.unwrap();
}
