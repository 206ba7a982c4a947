//! The lease table on MariaDB: the claims both databases meet, then what
//! only MariaDB does (its waiters block on bells, a chain of them, one per
//! place; the rounds of a lock handed from waiter to waiter; a crash).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use fencelock::lease_table::{mysql::Statements, LeaseTable};
use fencelock::{AcquireOptions, HolderLookup, Lease, LockError, LockService, WaitStats};
use tokio::time::Instant;

use super::{
    a_dead_fair_waiter_is_skipped, a_release_wakes_only_the_next_waiter, lease_table_claims,
    mysql_at, names_are_compared_byte_for_byte, statements_of_hand_overs, the_highest_token_minted,
    tokens_keep_increasing_across, waiter_is_woken_by_the_release, Db,
};
use crate::support::fair::{self, Queue};
use crate::support::{
    assert_timeout, contract, granted, held, held_with, spawn_acquire, take_and_release,
};

/// An acquire's task.
type Task = tokio::task::JoinHandle<Result<Lease, LockError>>;

lease_table_claims!(mysql_at(), "lease-mysql");

const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(50);

/// MariaDB: a new service's first hand-over: the light try and the fair
/// one, both refused, the insert that would create the row, the place (with
/// the waiter's bell), one wait (woken by the release), the grant, the
/// deletion of the place (in the background, awaited by the release), the
/// release: eight. The next times, the lock having been handed to this
/// waiter by a release it waited for, its tries are skipped and it takes its
/// place at once: five (six before the skip). Once the round ends (the lock
/// is free when it asks, nobody ahead), the acquire that finds so pays the
/// place, the wait that returns at once, the grant and the place's deletion,
/// and the one after it is back to the grant and the release.
#[tokio::test]
async fn mysql_a_waiter_handed_the_lock_round_takes_its_place_without_a_refused_try() {
    let (svc, db) = mysql_at().await;
    let waiter = db.woken_service().await;
    let sent = statements_of_hand_overs(&svc, &db, &waiter, 3).await;
    assert_eq!(sent, [8, 5, 5], "the refused try skipped once handed round");

    // The round ends: the lock is free when the waiter asks again.
    let mut after = vec![];
    for _ in 0..2 {
        let before = waiter.statements_sent();
        let free = AcquireOptions::new(TTL).wait(Duration::from_secs(5));
        let lease = held_with(&waiter, "page", free).await;
        lease.release().await.unwrap();
        after.push(waiter.statements_sent() - before);
    }
    assert_eq!(
        after,
        [5, 2],
        "the end of the round costs one acquire a place, a wait and its deletion"
    );
    assert_eq!(db.queued("page").await, 0);
}

/// MariaDB: poll `acquire` (of lock "page") until it is the `n`th waiter
/// queued and blocked on a bell, then leave it unpolled (as a stalled or
/// dead process). `who` names it if it is granted instead.
async fn queue_unpolled<F>(db: &Db, acquire: &mut F, n: i64, who: &str)
where
    F: Future + Unpin,
    F::Output: std::fmt::Debug,
{
    tokio::select! {
        r = acquire => panic!("{who} was granted: {r:?}"),
        () = async { db.wait_queued("page", n).await; db.wait_blocked(n).await } => {}
    }
}

/// MariaDB: the server closes the connection of the second place in the
/// queue of lock "page" (the one that holds its bell), as when its process
/// dies.
async fn kill_the_second_waiters_connection(admin: &sqlx::MySqlPool) {
    let connection: i64 = sqlx::query_scalar(
        "select cast(is_used_lock(concat('fencelock:w:', waiter)) as signed) \
           from fencelock_leases_waiters \
          where name = 'page' order by ticket limit 1 offset 1",
    )
    .fetch_one(admin)
    .await
    .unwrap();
    sqlx::query(&format!("kill connection {connection}"))
        .execute(admin)
        .await
        .unwrap();
}

/// An acquire left unpolled, as a process that stalls or dies.
type Unpolled = Pin<Box<dyn Future<Output = Result<Lease, LockError>> + Send>>;

/// Behind a lease on "page" and `first` (an acquire of it, polled here until
/// it is queued and blocked), a dying waiter and a last one queue, each its
/// own service (fallback poll 60 s), and block on bells. The dying one's
/// acquire comes back unpolled; the last one runs in a task.
async fn a_chain_behind<F>(db: &Db, first: &mut F) -> (Unpolled, LeaseTable, Task)
where
    F: Future + Unpin,
    F::Output: std::fmt::Debug,
{
    queue_unpolled(db, first, 1, "the first waiter").await;
    let dying = db.woken_service().await;
    let mut dying_acquire: Unpolled =
        Box::pin(async move { dying.acquire("page", TTL, WAIT).await });
    queue_unpolled(db, &mut dying_acquire, 2, "the middle waiter").await;
    let last = db.woken_service().await;
    let last_task = spawn_acquire(&last, "page", TTL, WAIT);
    db.wait_queued("page", 3).await;
    db.wait_blocked(3).await;
    (dying_acquire, last, last_task)
}

/// MariaDB: three fair waiters queued, and the middle one's process dies
/// (its connection is killed by the server, its place would last 240 s).
/// The one behind it, which was blocked on the dead one's bell, wakes, finds
/// it gone and blocks on the first one's bell instead; then it is granted
/// right after the first one's turn, not after the dead place lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_dead_waiter_in_the_middle_of_the_chain_does_not_stall_the_ones_behind_it() {
    let (svc, db) = mysql_at().await;
    let lease = held(&svc, "page", TTL).await;
    let first = db.woken_service().await;
    let mut first_task = spawn_acquire(&first, "page", TTL, WAIT);
    let (dying_acquire, last, last_task) = a_chain_behind(&db, &mut first_task).await;
    let last_before = last.wait_stats();

    // The middle waiter's process dies: never polled again, and the server
    // closes its connection (which holds its bell).
    kill_the_second_waiters_connection(db.mysql()).await;
    std::mem::forget(dying_acquire);
    harness::wait_until(Duration::from_secs(10), || async {
        match last.wait_stats() {
            s if s.notified == last_before.notified + 1 => Ok(()),
            s => Err(format!("the last waiter not woken yet: {s:?}")),
        }
    })
    .await
    .unwrap();
    db.wait_blocked(2).await; // the first and the last waiter
    assert_eq!(db.queued("page").await, 3, "the dead place is still there");

    lease.release().await.unwrap();
    let why = "the first waiter is granted after the release";
    granted(first_task, why).await.release().await.unwrap();
    let why = "the last waiter is granted after the first, not after the dead place lapses";
    granted(last_task, why).await.release().await.unwrap();
    // Woken twice (the dead waiter's bell, then the first waiter's release),
    // tried three times, never by the fallback poll.
    assert_eq!(
        last.wait_stats(),
        WaitStats {
            tries: last_before.tries + 2,
            notified: last_before.notified + 2,
            timed_out: last_before.timed_out,
        }
    );
}

/// MariaDB: a waiter woken by its predecessor's bell takes the lock with
/// the plain grant only when nobody else is before it. Three fair waiters
/// queue; the holder releases while the first one's process is stalled
/// (its wait has ended in the server, its future is not polled), so the
/// lock is free and the first place still live. The middle waiter dies:
/// the last one, woken by the dead one's bell, must not take the free lock
/// ahead of the first; it waits on the first one's bell instead, and is
/// granted after the first one's turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_waiter_woken_by_a_dead_predecessor_does_not_pass_a_live_first_place() {
    let (svc, db) = mysql_at().await;
    let lease = held(&svc, "page", TTL).await;
    let first = db.woken_service().await;
    let mut first_acquire = Box::pin(first.acquire("page", TTL, WAIT));
    let (dying_acquire, last, mut last_task) = a_chain_behind(&db, &mut first_acquire).await;

    // The holder releases: the first waiter's wait ends in the server (it
    // holds the name's bell now), but its process does not go on.
    lease.release().await.unwrap();
    db.wait_blocked(2).await; // the middle and the last waiter
    let last_before = last.wait_stats();

    // The middle waiter's process dies; the server closes its connection.
    kill_the_second_waiters_connection(db.mysql()).await;
    std::mem::forget(dying_acquire);
    // The last waiter is woken, tries (refused: the first place is live),
    // and blocks again, on the first waiter's bell.
    harness::wait_until(Duration::from_secs(10), || async {
        match last.wait_stats() {
            s if s.notified > last_before.notified && s.tries > last_before.tries => Ok(()),
            s => Err(format!("the last waiter not woken and tried yet: {s:?}")),
        }
    })
    .await
    .unwrap();
    tokio::select! {
        r = &mut last_task => panic!("the last waiter passed the first: {r:?}"),
        () = db.wait_blocked(1) => {}
    }
    assert!(
        svc.current_holder("page").await.unwrap().is_none(),
        "the lock was granted while the first waiter was stalled"
    );

    // The first waiter goes on: granted; then the last one, after it.
    let granted_first = tokio::time::timeout(Duration::from_secs(10), &mut first_acquire)
        .await
        .expect("the first waiter is granted once it goes on")
        .unwrap();
    assert!(!last_task.is_finished(), "the last waiter passed the first");
    granted_first.release().await.unwrap();
    let why = "the last waiter is granted after the first";
    granted(last_task, why).await.release().await.unwrap();
}

/// MariaDB: the fair first try of a lock nobody contended lately is the
/// grant alone, judged by the row's `queued_until` (which the queue's
/// trigger raises). It must pass no live place: here the lock is free and
/// a waiter of another process (the test's own connection, holding its
/// bell) has a place. Once that place is gone, `queued_until` still lies
/// ahead, so the light grant is refused and the statement that looks at
/// the queue grants: two statements, where the full statement alone would
/// be one, which shows the light one ran.
#[tokio::test]
async fn mysql_the_light_fair_grant_passes_no_live_place() {
    let (_svc, db) = mysql_at().await;
    let pool = db.mysql();
    // The newcomer's service knows the lock's row (so a refusal tries no
    // insert), and has never been refused.
    let quiet = db.service().await;
    take_and_release(&quiet, "page", TTL).await;

    // A waiter elsewhere takes a place, with the library's own statement.
    let mut elsewhere = pool.acquire().await.unwrap();
    let sql = Statements::for_table("fencelock_leases");
    sqlx::query(&sql.join)
        .bind("page")
        .bind("0123456789abcdef0123456789abcdef")
        .bind(60_000_000_i64)
        .execute(&mut *elsewhere)
        .await
        .unwrap();
    db.light_grant_refused_while_a_place_lives(&quiet).await;

    // The waiter goes away; its place's bound stays in the row.
    for gone in [
        "delete from fencelock_leases_waiters",
        "select release_all_locks()",
    ] {
        sqlx::query(gone).execute(&mut *elsewhere).await.unwrap();
    }
    let queued_ahead: i64 = sqlx::query_scalar(
        "select count(*) from fencelock_leases where name = 'page' and queued_until > now(6)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(queued_ahead, 1, "the trigger raised queued_until");
    db.light_grant_after_the_queue_emptied().await;
}

#[tokio::test]
async fn mysql_tokens_keep_increasing_across_a_database_crash() {
    let mut maria = harness::MariaDb::start().await;
    let svc = LeaseTable::mysql(&maria.create_database().await)
        .await
        .unwrap();
    let crash = async {
        maria.kill();
        maria.start_again().await;
    };
    tokens_keep_increasing_across(svc, crash).await;
}
