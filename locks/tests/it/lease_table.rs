//! The lease-table backend against real PostgreSQL and MariaDB servers.

use std::sync::Arc;
use std::time::Duration;

use crate::support::contract;
use fencelock::lease_table::LeaseTable;
use fencelock::{AcquireOptions, LockError, LockService, WaitStats};
use harness::Postgres;
use tokio::time::Instant;

async fn postgres() -> LeaseTable {
    postgres_at().await.0
}

async fn mysql() -> LeaseTable {
    mysql_at().await.0
}

/// A service on a fresh PostgreSQL database, and a way to look at its tables.
async fn postgres_at() -> (LeaseTable, Db) {
    let url = harness::fresh_database().await;
    let svc = LeaseTable::postgres(&url).await.expect("lease-postgres");
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    (svc, Db::Postgres(pool, url))
}

async fn mysql_at() -> (LeaseTable, Db) {
    let url = harness::fresh_mysql_database().await;
    let svc = LeaseTable::mysql(&url).await.expect("lease-mysql");
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    (svc, Db::MySql(pool, url))
}

/// Raw access to the database a service uses, to check what it wrote, and
/// its URL.
enum Db {
    Postgres(sqlx::PgPool, String),
    MySql(sqlx::MySqlPool, String),
}

impl Db {
    /// Another service on the same database, with its own pool and its own
    /// wait counters: another process, as far as the lock can tell.
    async fn service(&self) -> LeaseTable {
        match self {
            Db::Postgres(_, url) => LeaseTable::postgres(url).await.unwrap(),
            Db::MySql(_, url) => LeaseTable::mysql(url).await.unwrap(),
        }
    }

    /// How many tries a fair waiter of a new service sends before it waits:
    /// PostgreSQL: refused (taking its place), listening, refused again;
    /// MariaDB: refused (then it takes its place and blocks on a bell).
    fn tries_before_waiting(&self) -> u64 {
        match self {
            Db::Postgres(..) => 2,
            Db::MySql(..) => 1,
        }
    }

    /// The tail of the light-grant tests. The queue of `page` has just
    /// emptied while its `queued_until` still lies ahead: a quiet service's
    /// light grant is refused and the full one grants (two statements).
    /// Once the bound has passed, acquire and release are one statement
    /// each.
    async fn light_grant_after_the_queue_emptied(&self) {
        let ttl = Duration::from_secs(30);
        let quiet = self.service().await;
        let sent = quiet.statements_sent();
        let lease = quiet.acquire("page", ttl, Duration::ZERO).await.unwrap();
        assert_eq!(
            quiet.statements_sent() - sent,
            2,
            "the light grant refused, the full one granted"
        );
        lease.release().await.unwrap();

        match self {
            Db::Postgres(p, _) => {
                sqlx::query(
                    "update fencelock_leases set queued_until = now() - interval '1 second'",
                )
                .execute(p)
                .await
                .unwrap();
            }
            Db::MySql(p, _) => {
                sqlx::query(
                    "update fencelock_leases set queued_until = now(6) - interval 1 second",
                )
                .execute(p)
                .await
                .unwrap();
            }
        }
        let quiet = self.service().await;
        let sent = quiet.statements_sent();
        quiet
            .acquire("page", ttl, Duration::ZERO)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        assert_eq!(quiet.statements_sent() - sent, 2);
    }

    /// Rows in the queue of lock `name` (live or lapsed).
    async fn queued(&self, name: &str) -> i64 {
        let sql = "select count(*) from fencelock_leases_waiters where name = ";
        match self {
            Db::Postgres(p, _) => sqlx::query_scalar(&format!("{sql}$1"))
                .bind(name)
                .fetch_one(p)
                .await
                .unwrap(),
            Db::MySql(p, _) => sqlx::query_scalar(&format!("{sql}?"))
                .bind(name)
                .fetch_one(p)
                .await
                .unwrap(),
        }
    }

    /// Wait (bounded) until lock `name`'s queue holds `n` rows.
    async fn wait_queued(&self, name: &str, n: i64) {
        harness::wait_until(Duration::from_secs(10), || async {
            match self.queued(name).await {
                len if len == n => Ok(()),
                len => Err(format!("{len} queued, waiting for {n}")),
            }
        })
        .await
        .unwrap();
    }

    /// Wait (bounded) until `n` waiters on this database block in the
    /// server: on MariaDB in `GET_LOCK` on a bell (the server is shared by
    /// the tests running in parallel, so only this database's count); on
    /// PostgreSQL (nothing blocks there) at once.
    async fn wait_blocked(&self, n: i64) {
        let Db::MySql(p, _) = self else { return };
        harness::wait_until(Duration::from_secs(10), || async {
            let blocked: i64 = sqlx::query_scalar(
                "select count(*) from information_schema.processlist \
                  where db = database() and info like '%is_free_lock%' \
                    and state = 'User lock'",
            )
            .fetch_one(p)
            .await
            .unwrap();
            if blocked == n {
                Ok(())
            } else {
                Err(format!("{blocked} blocked, waiting for {n}"))
            }
        })
        .await
        .unwrap();
    }
}

/// The same claims for both databases: `$connect` gives a service on a fresh
/// database.
macro_rules! lease_table_claims {
    ($db:ident, $connect:expr, $at:expr, $issuer:literal) => {
        mod $db {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mutual_exclusion_under_contention() {
                let svc: Arc<dyn LockService> = Arc::new($connect.await);
                contract::mutual_exclusion_under_contention(svc, "page-1", 8, 25).await;
            }

            #[tokio::test]
            async fn tokens_strictly_increase_per_lock_name() {
                let svc = $connect.await;
                assert_eq!(svc.issuer(), $issuer);
                assert_eq!(contract::tokens_strictly_increase(&svc, "a", 5).await, 5);
                assert_eq!(contract::tokens_strictly_increase(&svc, "b", 2).await, 2);
            }

            #[tokio::test]
            async fn holder_lookup_names_the_client_and_token() {
                let svc = $connect.await.with_client_id("alice").unwrap();
                contract::holder_lookup_names_the_client_and_token(
                    &svc, &svc, "alice", "page", true,
                )
                .await;
            }

            #[tokio::test]
            async fn dropped_lease_is_released_in_the_background() {
                contract::dropped_lease_is_released_in_the_background(&$connect.await, "page")
                    .await;
            }

            #[tokio::test]
            async fn late_release_by_expired_holder_is_a_no_op() {
                let svc = $connect.await;
                contract::late_release_is_a_no_op(&svc, "page", Duration::from_millis(300)).await;
            }

            #[tokio::test]
            async fn expiry_lets_next_holder_in_with_higher_token() {
                let svc = $connect.await;
                contract::expiry_lets_next_holder_in_with_higher_token(
                    &svc,
                    "page",
                    Duration::from_millis(300),
                )
                .await;
            }

            #[tokio::test]
            async fn watchdog_keeps_lease_alive_well_past_ttl() {
                let svc = $connect.await;
                contract::renewal_keeps_lease_past_ttl(&svc, "page").await;
            }

            #[tokio::test]
            async fn lapsed_lease_blocks_others_for_the_lock_delay() {
                let ttl = Duration::from_millis(300);
                let delay = Duration::from_millis(700);
                let svc = $connect.await.with_lock_delay(delay);
                let first = svc
                    .acquire_with("page", AcquireOptions::new(ttl).auto_renew(false))
                    .await
                    .unwrap();
                let granted = Instant::now();
                tokio::time::sleep(ttl + Duration::from_millis(100)).await; // the scenario: lapse
                let during = svc.acquire("page", ttl, Duration::ZERO).await;
                assert!(
                    matches!(during, Err(LockError::Timeout { .. })),
                    "lapsed lease must block for the lock-delay, got {during:?}"
                );
                let next = svc
                    .acquire("page", ttl, Duration::from_secs(5))
                    .await
                    .expect("granted after ttl + delay");
                assert!(
                    granted.elapsed() >= ttl + delay - Duration::from_millis(50),
                    "granted {:?} after the first grant",
                    granted.elapsed()
                );
                assert!(next.token() > first.token());
                next.release().await.unwrap();
            }

            #[tokio::test]
            async fn released_lease_is_free_at_once_despite_lock_delay() {
                let svc = $connect.await.with_lock_delay(Duration::from_secs(30));
                let first = svc
                    .acquire("page", Duration::from_secs(5), Duration::ZERO)
                    .await
                    .unwrap();
                first.release().await.unwrap();
                let second = svc
                    .acquire("page", Duration::from_secs(5), Duration::ZERO)
                    .await
                    .expect("a release frees the lock at once");
                second.release().await.unwrap();
            }

            #[tokio::test]
            async fn bad_requests_are_invalid_config() {
                contract::bad_requests_are_invalid_config(&$connect.await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn non_fair_mutual_exclusion_under_contention() {
                let svc: Arc<dyn LockService> = Arc::new($connect.await.non_fair());
                contract::mutual_exclusion_under_contention(svc, "page-1", 8, 25).await;
            }

            #[tokio::test]
            async fn non_fair_holder_lookup_names_the_client_and_token() {
                let svc = $connect.await.non_fair().with_client_id("alice").unwrap();
                assert!(!svc.is_fair());
                contract::holder_lookup_names_the_client_and_token(
                    &svc, &svc, "alice", "page", true,
                )
                .await;
            }

            #[tokio::test]
            async fn fair_waiter_is_woken_by_the_release_not_by_polling() {
                waiter_is_woken_by_the_release($at.await, true).await;
            }

            #[tokio::test]
            async fn non_fair_waiter_is_woken_by_the_release_not_by_polling() {
                waiter_is_woken_by_the_release($at.await, false).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fair_waiters_are_granted_in_the_order_they_queued() {
                let (svc, db) = $at.await;
                let lease = svc
                    .acquire("page", Duration::from_secs(30), Duration::ZERO)
                    .await
                    .unwrap();
                let order = Arc::new(std::sync::Mutex::new(vec![]));
                let mut joins = vec![];
                for i in 0..4 {
                    let (svc, order) = (svc.clone(), order.clone());
                    joins.push(tokio::spawn(async move {
                        let lease = svc
                            .acquire("page", Duration::from_secs(30), Duration::from_secs(30))
                            .await
                            .expect("granted in turn");
                        order
                            .lock()
                            .unwrap()
                            .push((i, lease.token().unwrap().get()));
                        lease.release().await.unwrap();
                    }));
                    db.wait_queued("page", i + 1).await;
                }
                lease.release().await.unwrap();
                for j in joins {
                    j.await.unwrap();
                }
                let order = order.lock().unwrap().clone();
                let who: Vec<i64> = order.iter().map(|(i, _)| *i).collect();
                assert_eq!(who, vec![0, 1, 2, 3], "first come, first served");
                assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "{order:?}");
                db.wait_queued("page", 0).await;
            }

            /// What starved the waiters of the polled lock: the holder
            /// releases and asks again at once. Fair, it queues behind.
            #[tokio::test]
            async fn a_fair_holder_that_asks_again_at_once_queues_behind_the_waiter() {
                let (svc, db) = $at.await;
                let lease = svc
                    .acquire("page", Duration::from_secs(30), Duration::ZERO)
                    .await
                    .unwrap();
                let waiting = tokio::spawn({
                    let svc = svc.clone();
                    async move {
                        let lease = svc
                            .acquire("page", Duration::from_secs(30), Duration::from_secs(30))
                            .await
                            .unwrap();
                        let token = lease.token();
                        lease.release().await.unwrap();
                        token
                    }
                });
                db.wait_queued("page", 1).await;
                lease.release().await.unwrap();
                let again = svc
                    .acquire("page", Duration::from_secs(30), Duration::from_secs(30))
                    .await
                    .unwrap();
                let waiter_token = waiting.await.unwrap();
                assert!(
                    waiter_token < again.token(),
                    "the waiter ({waiter_token:?}) was granted before the holder's second \
                     grant ({:?})",
                    again.token()
                );
                again.release().await.unwrap();
            }

            /// The lock freed while its first waiter is not looking: it stays
            /// that waiter's until its place lapses; a newcomer is refused.
            #[tokio::test]
            async fn a_free_lock_waits_for_the_first_waiter_and_a_newcomer_is_refused() {
                let (svc, db) = $at.await;
                let first = svc.clone().with_poll_fallback(Duration::from_secs(10));
                let lease = svc
                    .acquire("page", Duration::from_secs(30), Duration::ZERO)
                    .await
                    .unwrap();
                let mut waiting = Box::pin(first.acquire(
                    "page",
                    Duration::from_secs(30),
                    Duration::from_secs(60),
                ));
                tokio::select! {
                    r = &mut waiting => panic!("granted while held: {r:?}"),
                    () = async { db.wait_queued("page", 1).await; db.wait_blocked(1).await } => {}
                }
                lease.release().await.unwrap();
                let refused = svc
                    .acquire("page", Duration::from_secs(30), Duration::ZERO)
                    .await;
                assert!(
                    matches!(refused, Err(LockError::Timeout { .. })),
                    "{refused:?}"
                );
                let granted = tokio::time::timeout(Duration::from_secs(5), waiting)
                    .await
                    .expect("the first waiter is granted at once")
                    .unwrap();
                granted.release().await.unwrap();
            }

            /// A waiter that queued, then stopped: never polled again,
            /// never dropped, as a process that froze or died. It stops
            /// after its first refused try (when it starts listening) or
            /// in its wait after the second: a waiter of the same service
            /// must not depend on it in either.
            #[tokio::test]
            async fn a_dead_fair_waiter_is_skipped_once_its_place_lapses() {
                for stop_after_tries in [1, 2] {
                    let (svc, db) = $at.await;
                    // Places last 4 × 100 ms without renewal.
                    let fallback = Duration::from_millis(100);
                    let dead = svc.clone().with_poll_fallback(fallback);
                    let live = svc.clone().with_poll_fallback(fallback);
                    let lease = svc
                        .acquire("page", Duration::from_secs(30), Duration::ZERO)
                        .await
                        .unwrap();
                    let tries = svc.wait_stats().tries;
                    let mut frozen = Box::pin(dead.acquire(
                        "page",
                        Duration::from_secs(30),
                        Duration::from_secs(60),
                    ));
                    poll_until_tries(&mut frozen, &dead, tries + stop_after_tries).await;
                    assert_eq!(db.queued("page").await, 1);
                    std::mem::forget(frozen);
                    let waiting = tokio::spawn(async move {
                        live.acquire("page", Duration::from_secs(30), Duration::from_secs(20))
                            .await
                    });
                    db.wait_queued("page", 2).await;
                    lease.release().await.unwrap();
                    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
                        .await
                        .unwrap_or_else(|_| {
                            panic!(
                                "the live waiter gets the lock once the dead one's place \
                                 lapsed (stopped after {stop_after_tries} tries)"
                            )
                        })
                        .unwrap()
                        .expect("granted");
                    granted.release().await.unwrap();
                    // The dead waiter's row went with a refused try of the live one.
                    db.wait_queued("page", 0).await;
                }
            }

            #[tokio::test]
            async fn a_fair_waiter_that_gives_up_leaves_the_queue() {
                let (svc, db) = $at.await;
                let lease = svc
                    .acquire("page", Duration::from_secs(30), Duration::ZERO)
                    .await
                    .unwrap();
                // Its place would last 40 s: only leaving explains an empty queue.
                let quitter = svc.clone().with_poll_fallback(Duration::from_secs(10));
                let gave_up = quitter
                    .acquire("page", Duration::from_secs(30), Duration::from_millis(300))
                    .await;
                assert!(
                    matches!(gave_up, Err(LockError::Timeout { .. })),
                    "{gave_up:?}"
                );
                db.wait_queued("page", 0).await;
                lease.release().await.unwrap();
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_release_wakes_only_the_next_fair_waiter() {
                a_release_wakes_only_the_next_waiter($at.await).await;
            }
        }
    };
}

lease_table_claims!(pg, postgres(), postgres_at(), "lease-postgres");
lease_table_claims!(my, mysql(), mysql_at(), "lease-mysql");

/// Poll `acquire` (of a service sharing `svc`'s counters) until `svc` has
/// counted `tries` tries, then leave it. The poll that counted the last one
/// went on as far as it could without an answer from the server: after a
/// first refused try, into the start of the `LISTEN` connection
/// (PostgreSQL) or its first wait on a bell (MariaDB); after the second,
/// into its wait.
async fn poll_until_tries<F>(acquire: &mut std::pin::Pin<Box<F>>, svc: &LeaseTable, tries: u64)
where
    F: std::future::Future<Output = Result<fencelock::Lease, LockError>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while svc.wait_stats().tries < tries {
        let polled =
            std::future::poll_fn(|cx| std::task::Poll::Ready(acquire.as_mut().poll(cx))).await;
        if let std::task::Poll::Ready(r) = polled {
            panic!("granted while held: {r:?}");
        }
        assert!(Instant::now() < deadline, "{:?}", svc.wait_stats());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Wait (bounded) until `svc` has sent `n` tries.
async fn wait_tries(svc: &LeaseTable, n: u64) {
    harness::wait_until(Duration::from_secs(10), || async {
        match svc.wait_stats().tries {
            t if t >= n => Ok(()),
            t => Err(format!("{t} tries, waiting for {n}")),
        }
    })
    .await
    .unwrap();
}

/// Three fair waiters, each its own service (its own counters), queued
/// behind a holder; fallback poll 60 s, places 240 s, TTL 30 s: only a wake
/// explains a prompt grant. Each release must wake exactly the next waiter:
/// a waiter woken for somebody else's turn would show one more wake and one
/// more (refused) try, and one handed the lock on PostgreSQL a try at all. On MariaDB the others also stay blocked in the server.
async fn a_release_wakes_only_the_next_waiter((svc, db): (LeaseTable, Db)) {
    let (ttl, wait) = (Duration::from_secs(30), Duration::from_secs(50));
    let lease = svc.acquire("page", ttl, Duration::ZERO).await.unwrap();
    let mut waiters = vec![];
    for i in 0..3 {
        let waiter = db
            .service()
            .await
            .with_poll_fallback(Duration::from_secs(60));
        let task = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.acquire("page", ttl, wait).await }
        });
        db.wait_queued("page", i + 1).await;
        wait_tries(&waiter, db.tries_before_waiting()).await;
        db.wait_blocked(i + 1).await;
        waiters.push((waiter, task));
    }
    let before: Vec<WaitStats> = waiters.iter().map(|(w, _)| w.wait_stats()).collect();
    lease.release().await.unwrap();
    for i in 0..3 {
        let granted = tokio::time::timeout(Duration::from_secs(10), &mut waiters[i].1)
            .await
            .unwrap_or_else(|_| panic!("waiter {i} not granted after the release before it"))
            .unwrap()
            .unwrap();
        for (j, (waiter, _)) in waiters.iter().enumerate().skip(i + 1) {
            assert_eq!(
                waiter.wait_stats(),
                before[j],
                "waiter {j} stirred while waiter {i} was granted"
            );
        }
        db.wait_blocked(2 - i as i64).await;
        granted.release().await.unwrap();
    }
    for (j, (waiter, _)) in waiters.iter().enumerate() {
        let stats = waiter.wait_stats();
        // On PostgreSQL a holder that waited hands the lock to the next
        // waiter in its release, and that waiter's grant sends nothing.
        let handed = matches!(db, Db::Postgres(..)) && j > 0;
        let woken_once = WaitStats {
            tries: before[j].tries + u64::from(!handed),
            notified: before[j].notified + 1,
            timed_out: before[j].timed_out,
        };
        assert_eq!(stats, woken_once, "waiter {j}: woken once, by its turn");
    }
}

/// Hand-overs from a holder to a fair waiter (each its own service): the
/// statements the waiter's acquire and release send, in each of the
/// `rounds`. From the second on, the waiter's service knows the lock's row,
/// listens already and counts the lock as contended, as on a hot lock.
async fn statements_of_hand_overs(
    svc: &LeaseTable,
    db: &Db,
    waiter: &LeaseTable,
    rounds: usize,
) -> Vec<u64> {
    let (ttl, wait) = (Duration::from_secs(30), Duration::from_secs(50));
    let mut sent = vec![];
    for _ in 0..rounds {
        let lease = svc.acquire("page", ttl, Duration::ZERO).await.unwrap();
        let (sent_before, tries_before) = (waiter.statements_sent(), waiter.wait_stats().tries);
        let task = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.acquire("page", ttl, wait).await }
        });
        db.wait_queued("page", 1).await;
        wait_tries(waiter, tries_before + 1).await;
        db.wait_blocked(1).await;
        lease.release().await.unwrap();
        let granted = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("granted after the release")
            .unwrap()
            .unwrap();
        granted.release().await.unwrap();
        sent.push(waiter.statements_sent() - sent_before);
    }
    let stats = waiter.wait_stats();
    assert_eq!(
        stats.timed_out, 0,
        "only releases woke the waiter: {stats:?}"
    );
    sent
}

/// PostgreSQL: the refused try that takes the waiter's place, the grant
/// (which deletes it), the release (which notifies the next waiter): the
/// notification itself is no statement of the waiter's.
#[tokio::test]
async fn postgres_a_fair_hand_over_costs_the_waiter_three_statements() {
    let (svc, db) = postgres_at().await;
    let waiter = db
        .service()
        .await
        .with_poll_fallback(Duration::from_secs(60));
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
    let Db::Postgres(pool, _) = &db else {
        unreachable!()
    };
    let sql = fencelock::lease_table::postgres::Statements::for_table("fencelock_leases");
    let mut listener = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .unwrap();
    listener.listen("fencelock_leases").await.unwrap();
    // `$1` name, `$2` holder, `$3` TTL, `$4` lock-delay, `$5` client id,
    // `$6` how long a place lasts.
    let first_try = |holder: &'static str, client: &'static str, ttl: f64| {
        sqlx::query_as::<_, (Option<i64>, Option<f64>, Option<bool>)>(&sql.acquire_fair_first)
            .bind("page")
            .bind(holder)
            .bind(ttl)
            .bind(0.0_f64)
            .bind(client)
            .bind(60.0_f64)
            .fetch_one(pool)
    };
    let (held, _, _) = first_try("h1", "holder-client", 30.0).await.unwrap();
    let held = held.expect("granted, nobody queued");
    let (refused, _, _) = first_try("w1", "waiter-client", 12.0).await.unwrap();
    assert_eq!(refused, None);
    assert_eq!(db.queued("page").await, 1);

    let release = |holder: &'static str, token: i64| {
        sqlx::query(&sql.release)
            .bind("page")
            .bind(holder)
            .bind(token)
            .fetch_optional(pool)
    };
    assert!(release("h1", held).await.unwrap().is_some(), "released");
    let note = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("notified")
        .unwrap();
    assert_eq!(note.payload(), format!("w1={} page", held + 1));
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
        sqlx::query_as(&sql.acquire_fair)
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
    assert!(release("w1", held + 1).await.unwrap().is_some());
    let note = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("notified")
        .unwrap();
    assert_eq!(note.payload(), "* page");
    assert!(
        release("w1", held + 1).await.unwrap().is_none(),
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
    let Db::Postgres(pool, _) = &db else {
        unreachable!()
    };
    let sql = fencelock::lease_table::postgres::Statements::for_table("fencelock_leases");
    let mut table = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .unwrap();
    table.listen("fencelock_leases").await.unwrap();
    let mut own = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .unwrap();
    own.listen("fencelock_0123456789abcdef").await.unwrap();
    let first_try = |holder: &'static str| {
        sqlx::query_as::<_, (Option<i64>, Option<f64>, Option<bool>)>(&sql.acquire_fair_first)
            .bind("page")
            .bind(holder)
            .bind(30.0_f64)
            .bind(0.0_f64)
            .bind("client")
            .bind(60.0_f64)
            .fetch_one(pool)
    };
    let held = first_try("h1").await.unwrap().0.expect("granted");
    let waiter = "0123456789abcdef.0123456789abcdef0123456789abcdef";
    assert_eq!(first_try(waiter).await.unwrap().0, None, "queued");
    let released = sqlx::query(&sql.release)
        .bind("page")
        .bind("h1")
        .bind(held)
        .fetch_optional(pool)
        .await
        .unwrap();
    assert!(released.is_some(), "released");
    let note = tokio::time::timeout(Duration::from_secs(10), own.recv())
        .await
        .expect("notified on the waiter's own channel")
        .unwrap();
    assert_eq!(note.payload(), format!("{waiter}={} page", held + 1));
    sqlx::query("select pg_notify('fencelock_leases', 'marker')")
        .execute(pool)
        .await
        .unwrap();
    let note = tokio::time::timeout(Duration::from_secs(10), table.recv())
        .await
        .expect("the marker")
        .unwrap();
    assert_eq!(
        note.payload(),
        "marker",
        "the table's channel heard the hand-over"
    );
}

/// A new service (fallback poll 60 s) waiting for `page`, alone in its
/// queue: refused (queued), listening, refused again. `page` must be held.
async fn a_waiter_in_the_queue(
    db: &Db,
    ttl: Duration,
) -> (
    LeaseTable,
    tokio::task::JoinHandle<Result<fencelock::Lease, LockError>>,
) {
    let waiter = db
        .service()
        .await
        .with_poll_fallback(Duration::from_secs(60));
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire("page", ttl, Duration::from_secs(50)).await }
    });
    db.wait_queued("page", 1).await;
    wait_tries(&waiter, 2).await;
    (waiter, waiting)
}

/// A lease on `page` of a new service that waited for it behind one of
/// `svc`'s (so that its release, a waiter's, hands over).
async fn a_lease_granted_after_waiting(
    svc: &LeaseTable,
    db: &Db,
    ttl: Duration,
) -> fencelock::Lease {
    let blocker = svc.acquire("page", ttl, Duration::ZERO).await.unwrap();
    let (_holder, holding) = a_waiter_in_the_queue(db, ttl).await;
    blocker.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), holding)
        .await
        .expect("granted after the release")
        .unwrap()
        .unwrap()
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
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("granted after the release")
        .unwrap()
        .unwrap();
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
    let named = fencelock::HolderLookup::current_holder(&svc, "page")
        .await
        .unwrap()
        .expect("held");
    assert_eq!(named.client_id, waiter.client_id());
    assert_eq!(named.token, granted.token().unwrap());
    assert_eq!(db.queued("page").await, 0);
    granted.release().await.unwrap();
    assert!(fencelock::HolderLookup::current_holder(&svc, "page")
        .await
        .unwrap()
        .is_none());
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
    let Db::Postgres(pool, _) = &db else {
        unreachable!()
    };
    let ttl = Duration::from_secs(30);
    for release_first in [false, true] {
        let lease = a_lease_granted_after_waiting(&svc, &db, ttl).await;
        let (_waiter, waiting) = a_waiter_in_the_queue(&db, ttl).await;

        let mut row = pool.begin().await.unwrap();
        sqlx::query("select 1 from fencelock_leases_waiters where name = 'page' for update")
            .execute(&mut *row)
            .await
            .unwrap();
        let blocked = |n: i64| async move {
            harness::wait_until(Duration::from_secs(10), || async {
                let waiting: i64 = sqlx::query_scalar(
                    "select count(*) from pg_stat_activity \
                      where datname = current_database() and wait_event_type = 'Lock'",
                )
                .fetch_one(pool)
                .await
                .unwrap();
                match waiting {
                    w if w == n => Ok(()),
                    w => Err(format!("{w} statements waiting for a lock, not {n}")),
                }
            })
            .await
            .unwrap();
        };
        let token = lease.token().unwrap().get();
        let releasing = if release_first {
            let releasing = tokio::spawn(async move { lease.release().await });
            blocked(1).await;
            waiting.abort(); // the acquire is dropped: it leaves the queue
            blocked(2).await;
            Some(releasing)
        } else {
            waiting.abort();
            blocked(1).await;
            let releasing = tokio::spawn(async move { lease.release().await });
            blocked(2).await;
            Some(releasing)
        };
        row.rollback().await.unwrap();
        releasing.unwrap().await.unwrap().unwrap();

        harness::wait_until(Duration::from_secs(10), || async {
            match fencelock::HolderLookup::current_holder(&svc, "page")
                .await
                .unwrap()
            {
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
        svc.acquire("page", ttl, Duration::ZERO)
            .await
            .expect("free at once")
            .release()
            .await
            .unwrap();
    }
}

/// MariaDB: a new service's first hand-over: the light try and the fair
/// one, both refused, the insert that would create the row, the place (with
/// the waiter's bell), one wait (woken by the release), the grant, the
/// deletion of the place (in the background, awaited by the release), the
/// release: eight. The next times, the lock having been handed to this
/// waiter by a release it waited for, its tries are skipped and it takes its
/// place at once: five (six before the skip). Once the round ends (the lock is free when
/// it asks, nobody ahead), the acquire that finds so pays the place, the
/// wait that returns at once, the grant and the place's deletion, and the
/// one after it is back to the grant and the release.
#[tokio::test]
async fn mysql_a_waiter_handed_the_lock_round_takes_its_place_without_a_refused_try() {
    let (svc, db) = mysql_at().await;
    let waiter = db
        .service()
        .await
        .with_poll_fallback(Duration::from_secs(60));
    let sent = statements_of_hand_overs(&svc, &db, &waiter, 3).await;
    assert_eq!(sent, [8, 5, 5], "the refused try skipped once handed round");

    // The round ends: the lock is free when the waiter asks again.
    let ttl = Duration::from_secs(30);
    let mut after = vec![];
    for _ in 0..2 {
        let before = waiter.statements_sent();
        let lease = waiter
            .acquire("page", ttl, Duration::from_secs(5))
            .await
            .expect("free");
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
    F: std::future::Future<Output = Result<fencelock::Lease, LockError>> + Unpin,
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

/// MariaDB: three fair waiters queued, and the middle one's process dies
/// (its connection is killed by the server, its place would last 240 s).
/// The one behind it, which was blocked on the dead one's bell, wakes, finds
/// it gone and blocks on the first one's bell instead; then it is granted
/// right after the first one's turn, not after the dead place lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_dead_waiter_in_the_middle_of_the_chain_does_not_stall_the_ones_behind_it() {
    let (svc, db) = mysql_at().await;
    let Db::MySql(admin, _) = &db else {
        unreachable!()
    };
    let (ttl, wait) = (Duration::from_secs(30), Duration::from_secs(50));
    let fallback = Duration::from_secs(60);
    let lease = svc.acquire("page", ttl, Duration::ZERO).await.unwrap();
    let first = db.service().await.with_poll_fallback(fallback);
    let first_task = tokio::spawn({
        let first = first.clone();
        async move { first.acquire("page", ttl, wait).await }
    });
    db.wait_queued("page", 1).await;
    db.wait_blocked(1).await;
    let dying = db.service().await.with_poll_fallback(fallback);
    let mut dying_acquire = Box::pin(dying.acquire("page", ttl, wait));
    queue_unpolled(&db, &mut dying_acquire, 2, "the middle waiter").await;
    let last = db.service().await.with_poll_fallback(fallback);
    let last_task = tokio::spawn({
        let last = last.clone();
        async move { last.acquire("page", ttl, wait).await }
    });
    db.wait_queued("page", 3).await;
    db.wait_blocked(3).await;
    let last_before = last.wait_stats();

    // The middle waiter's process dies: never polled again, and the server
    // closes its connection (which holds its bell).
    kill_the_second_waiters_connection(admin).await;
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
    let granted = tokio::time::timeout(Duration::from_secs(10), first_task)
        .await
        .expect("the first waiter is granted after the release")
        .unwrap()
        .unwrap();
    granted.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), last_task)
        .await
        .expect("the last waiter is granted after the first, not after the dead place lapses")
        .unwrap()
        .unwrap();
    granted.release().await.unwrap();
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
    let Db::MySql(admin, _) = &db else {
        unreachable!()
    };
    let (ttl, wait) = (Duration::from_secs(30), Duration::from_secs(50));
    let fallback = Duration::from_secs(60);
    let lease = svc.acquire("page", ttl, Duration::ZERO).await.unwrap();
    let first = db.service().await.with_poll_fallback(fallback);
    let mut first_acquire = Box::pin(first.acquire("page", ttl, wait));
    queue_unpolled(&db, &mut first_acquire, 1, "the first waiter").await;
    let dying = db.service().await.with_poll_fallback(fallback);
    let mut dying_acquire = Box::pin(dying.acquire("page", ttl, wait));
    queue_unpolled(&db, &mut dying_acquire, 2, "the middle waiter").await;
    let last = db.service().await.with_poll_fallback(fallback);
    let mut last_task = tokio::spawn({
        let last = last.clone();
        async move { last.acquire("page", ttl, wait).await }
    });
    db.wait_queued("page", 3).await;
    db.wait_blocked(3).await;

    // The holder releases: the first waiter's wait ends in the server (it
    // holds the name's bell now), but its process does not go on.
    lease.release().await.unwrap();
    db.wait_blocked(2).await; // the middle and the last waiter
    let last_before = last.wait_stats();

    // The middle waiter's process dies; the server closes its connection.
    kill_the_second_waiters_connection(admin).await;
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
        fencelock::HolderLookup::current_holder(&svc, "page")
            .await
            .unwrap()
            .is_none(),
        "the lock was granted while the first waiter was stalled"
    );

    // The first waiter goes on: granted; then the last one, after it.
    let granted = tokio::time::timeout(Duration::from_secs(10), &mut first_acquire)
        .await
        .expect("the first waiter is granted once it goes on")
        .unwrap();
    assert!(!last_task.is_finished(), "the last waiter passed the first");
    granted.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), &mut last_task)
        .await
        .expect("the last waiter is granted after the first")
        .unwrap()
        .unwrap();
    granted.release().await.unwrap();
}

/// A waiter whose fallback poll (60 s) and holder's TTL (30 s) are far
/// beyond the test's bound: a prompt grant after the release can only come
/// from the notification (PostgreSQL) or the bell (MariaDB).
async fn waiter_is_woken_by_the_release((svc, db): (LeaseTable, Db), fair: bool) {
    let holder = if fair {
        svc.clone()
    } else {
        svc.clone().non_fair()
    };
    let waiter = holder.clone().with_poll_fallback(Duration::from_secs(60));
    let lease = holder
        .acquire("page", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(holder.wait_stats().tries, 1, "uncontended: one try");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            waiter
                .acquire("page", Duration::from_secs(30), Duration::from_secs(50))
                .await
        }
    });
    // PostgreSQL: refused, listening, refused again. MariaDB: refused, then
    // blocked on the bell.
    let tries_before_waiting = match db {
        Db::Postgres(..) => 3,
        Db::MySql(..) => 2,
    };
    harness::wait_until(Duration::from_secs(10), || async {
        match waiter.wait_stats().tries {
            n if n >= tries_before_waiting => Ok(()),
            n => Err(n),
        }
    })
    .await
    .unwrap();
    db.wait_blocked(1).await;
    let released = Instant::now();
    lease.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("granted long before the fallback poll or the holder's TTL")
        .unwrap()
        .unwrap();
    eprintln!("granted {:?} after the release", released.elapsed());
    let stats = waiter.wait_stats();
    assert_eq!(stats.notified, 1, "{stats:?}");
    assert_eq!(stats.timed_out, 0, "{stats:?}");
    assert_eq!(stats.tries, tries_before_waiting + 1, "{stats:?}");
    granted.release().await.unwrap();
}

/// PostgreSQL connections of the test's database, other than the caller's,
/// whose last statement was a `LISTEN`.
async fn pg_listening(pool: &sqlx::PgPool) -> i64 {
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
async fn pg_listener_closes(pool: &sqlx::PgPool, within: Duration, why: &str) {
    harness::wait_until(within, || async {
        match pg_listening(pool).await {
            0 => Ok(()),
            n => Err(format!("{n} LISTEN connection(s) {why}")),
        }
    })
    .await
    .unwrap();
}

/// While the `LISTEN` connection is open, every release is delivered to it,
/// waited for or not (it made uncontended acquire+release 2–3× slower after
/// one contended moment): it closes when nobody has waited for a while, and
/// the next waiter opens it again and is still woken by the release, not by
/// the 60 s fallback poll.
#[tokio::test]
async fn postgres_the_listen_connection_closes_when_nobody_waits_and_the_next_waiter_reopens_it() {
    let (svc, db) = postgres_at().await;
    let Db::Postgres(pool, _) = &db else {
        unreachable!()
    };
    let waiter = svc.clone().with_poll_fallback(Duration::from_secs(60));
    for round in 1..=2 {
        let notified = waiter.wait_stats().notified;
        let tries = waiter.wait_stats().tries;
        let lease = svc
            .acquire("page", Duration::from_secs(30), Duration::ZERO)
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                waiter
                    .acquire("page", Duration::from_secs(30), Duration::from_secs(50))
                    .await
            }
        });
        // The holder's try, then the waiter's two: refused, listening,
        // refused again (the clones share their counters).
        wait_tries(&waiter, tries + 3).await;
        assert_eq!(
            pg_listening(pool).await,
            1,
            "round {round}: one LISTEN connection"
        );
        lease.release().await.unwrap();
        let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("woken by the release, long before the fallback poll")
            .unwrap()
            .unwrap();
        assert_eq!(waiter.wait_stats().notified, notified + 1, "round {round}");
        granted.release().await.unwrap();
        pg_listener_closes(pool, Duration::from_secs(10), "with nobody waiting").await;
    }
}

/// Releases `lease`, then waits (10 s at most) for `waiting`, the acquire
/// that release should wake, and releases what it was granted.
async fn release_then_the_woken(
    lease: fencelock::Lease,
    waiting: tokio::task::JoinHandle<Result<fencelock::Lease, LockError>>,
) {
    lease.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
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
    let Db::Postgres(pool, _) = &db else {
        unreachable!()
    };
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
        let lease = svc
            .acquire("page", Duration::from_secs(30), Duration::ZERO)
            .await
            .unwrap();
        if cycle > 0 {
            // The shape of the load, not a synchronisation: held alone.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                waiter
                    .acquire("page", Duration::from_secs(30), Duration::from_secs(10))
                    .await
            }
        });
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
    let Db::Postgres(pool, _) = &db else {
        unreachable!()
    };
    let count = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(pool)
            .await
            .unwrap()
    };
    // The quiet lock's row exists, and was never refused.
    svc.acquire("quiet", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // A contended moment on another lock opens the listener.
    let waiter = svc.clone().with_poll_fallback(Duration::from_secs(60));
    let tries = waiter.wait_stats().tries;
    let lease = svc
        .acquire("page", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            waiter
                .acquire("page", Duration::from_secs(30), Duration::from_secs(50))
                .await
        }
    });
    wait_tries(&waiter, tries + 3).await;
    assert_eq!(pg_listening(pool).await, 1, "the contended moment listens");

    // The quiet lock's acquire starts while the listener runs, and its try
    // waits in the server for the row the test holds.
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("select 1 from fencelock_leases where name = 'quiet' for update")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let quiet = tokio::spawn({
        let svc = svc.clone();
        async move {
            svc.acquire("quiet", Duration::from_secs(30), Duration::from_secs(30))
                .await
        }
    });
    harness::wait_until(Duration::from_secs(10), || async {
        match count(
            "select count(*) from pg_stat_activity \
              where datname = current_database() and wait_event_type = 'Lock'",
        )
        .await
        {
            1 => Ok(()),
            n => Err(format!("{n} statements waiting for a row lock")),
        }
    })
    .await
    .unwrap();

    // The contended moment ends; only the quiet lock's try is in flight.
    release_then_the_woken(lease, waiting).await;
    pg_listener_closes(
        pool,
        Duration::from_secs(5),
        "kept open by a try that is not waiting",
    )
    .await;

    blocker.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), quiet)
        .await
        .expect("granted once the row is let go")
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
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
    let Db::Postgres(pool, _) = &db else {
        unreachable!()
    };
    let ttl = Duration::from_secs(30);
    let lease = svc.acquire("page", ttl, Duration::ZERO).await.unwrap();
    // A waiter elsewhere is refused and takes a place for 60 s.
    let sql = fencelock::lease_table::postgres::Statements::for_table("fencelock_leases");
    let (token, _, _): (Option<i64>, Option<f64>, Option<bool>) =
        sqlx::query_as(&sql.acquire_fair_first)
            .bind("page")
            .bind("elsewhere")
            .bind(30.0_f64)
            .bind(0.0_f64)
            .bind("elsewhere")
            .bind(60.0_f64)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(token, None, "refused while held");
    assert_eq!(db.queued("page").await, 1);
    lease.release().await.unwrap();

    let quiet = db.service().await;
    let sent = quiet.statements_sent();
    let refused = quiet.acquire("page", ttl, Duration::ZERO).await;
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "a free lock with a live place in its queue is not granted to a newcomer: {refused:?}"
    );
    assert_eq!(
        quiet.statements_sent() - sent,
        2,
        "light, then the full grant"
    );

    // The waiter goes away; its place's bound stays in the row.
    sqlx::query("delete from fencelock_leases_waiters")
        .execute(pool)
        .await
        .unwrap();
    db.light_grant_after_the_queue_emptied().await;
}

/// Tables made before `queued_until` and the hand-over's columns existed:
/// the constructor adds the columns, and a service told not to touch the
/// schema refuses to start, naming the `alter table`s to run.
#[tokio::test]
async fn postgres_tables_from_before_queued_until_and_the_hand_over_get_the_columns_or_a_clear_refusal(
) {
    let url = harness::fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    for ddl in fencelock::lease_table::postgres::Statements::ddl_statements("fencelock_leases") {
        sqlx::query(&ddl).execute(&pool).await.unwrap();
    }
    for drop in [
        "alter table fencelock_leases drop column queued_until",
        "alter table fencelock_leases_waiters drop column client_id",
        "alter table fencelock_leases_waiters drop column ttl_secs",
    ] {
        sqlx::query(drop).execute(&pool).await.unwrap();
    }
    let refused = LeaseTable::postgres_with(
        &url,
        fencelock::lease_table::LeaseTableOptions::default().create_table(false),
    )
    .await;
    match refused {
        Err(LockError::InvalidConfig(msg)) => {
            for alter in [
                "alter table fencelock_leases add column if not exists queued_until timestamptz",
                "alter table fencelock_leases_waiters add column if not exists client_id text",
                "alter table fencelock_leases_waiters add column if not exists ttl_secs float8",
            ] {
                assert!(msg.contains(alter), "{msg}");
            }
        }
        other => panic!("expected a refusal naming the alter table: {other:?}"),
    }
    let svc = LeaseTable::postgres(&url).await.unwrap();
    contract::tokens_strictly_increase(&svc, "page", 3).await;
}

#[tokio::test]
async fn postgres_tokens_keep_increasing_across_a_database_crash() {
    let mut pg = Postgres::start().await;
    let url = pg.create_database().await;
    let svc = LeaseTable::postgres(&url).await.unwrap();
    let before = contract::tokens_strictly_increase(&svc, "page", 3).await;
    pg.kill();
    pg.start_again().await;
    // The pool replaces its dead connections; give it the wait to do so.
    let after = svc
        .acquire("page", Duration::from_secs(5), Duration::from_secs(10))
        .await
        .expect("acquire after restart");
    assert!(after.token().unwrap().get() > before);
    after.release().await.unwrap();
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
    let Db::MySql(pool, _) = &db else {
        unreachable!()
    };
    let ttl = Duration::from_secs(30);
    // The newcomer's service knows the lock's row (so a refusal tries no
    // insert), and has never been refused.
    let quiet = db.service().await;
    quiet
        .acquire("page", ttl, Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // A waiter elsewhere takes a place, with the library's own statement.
    let mut elsewhere = pool.acquire().await.unwrap();
    let sql = fencelock::lease_table::mysql::Statements::for_table("fencelock_leases");
    sqlx::query(&sql.join)
        .bind("page")
        .bind("0123456789abcdef0123456789abcdef")
        .bind("0123456789abcdef0123456789abcdef")
        .bind(60_000_000_i64)
        .execute(&mut *elsewhere)
        .await
        .unwrap();
    let sent = quiet.statements_sent();
    let refused = quiet.acquire("page", ttl, Duration::ZERO).await;
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "a free lock with a live place in its queue is not granted to a newcomer: {refused:?}"
    );
    assert_eq!(
        quiet.statements_sent() - sent,
        2,
        "light, then the full grant"
    );

    // The waiter goes away; its place's bound stays in the row.
    sqlx::query("delete from fencelock_leases_waiters")
        .execute(&mut *elsewhere)
        .await
        .unwrap();
    sqlx::query("select release_all_locks()")
        .execute(&mut *elsewhere)
        .await
        .unwrap();
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
    let url = maria.create_database().await;
    let svc = LeaseTable::mysql(&url).await.unwrap();
    let before = contract::tokens_strictly_increase(&svc, "page", 3).await;
    maria.kill();
    maria.start_again().await;
    let after = svc
        .acquire("page", Duration::from_secs(5), Duration::from_secs(10))
        .await
        .expect("acquire after restart");
    assert!(after.token().unwrap().get() > before);
    after.release().await.unwrap();
}

#[tokio::test]
async fn lost_signal_fires_when_postgres_is_killed_during_hold() {
    let mut pg = Postgres::start().await;
    let svc = LeaseTable::postgres(&pg.create_database().await)
        .await
        .unwrap();
    let ttl = Duration::from_millis(600);
    contract::lost_signal_fires_within(&svc, "page", ttl, || pg.kill(), ttl + ttl / 2).await;
}

#[tokio::test]
async fn bad_config_is_a_clear_error() {
    let err = LeaseTable::postgres("not a url").await.err().unwrap();
    assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");
    let err = LeaseTable::mysql("mysql://root@127.0.0.1:notaport/x")
        .await
        .err()
        .unwrap();
    assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");

    let port = harness::free_port();
    let started = Instant::now();
    let err = LeaseTable::postgres(&format!("postgres://postgres@127.0.0.1:{port}/x"))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, LockError::Unavailable { service, .. } if service == "lease-postgres"),
        "{err:?}"
    );
    let err = LeaseTable::mysql(&format!("mysql://root@127.0.0.1:{port}/x"))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, LockError::Unavailable { service, .. } if service == "lease-mysql"),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "fail fast");
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
    let lease = svc.acquire("page", ttl, Duration::ZERO).await.unwrap();
    let quitter = db
        .service()
        .await
        .with_poll_fallback(Duration::from_secs(60));
    let quitting = tokio::spawn({
        let quitter = quitter.clone();
        async move { quitter.acquire("page", ttl, Duration::from_secs(2)).await }
    });
    db.wait_queued("page", 1).await;
    let next = db
        .service()
        .await
        .with_poll_fallback(Duration::from_secs(60));
    let waiting = tokio::spawn({
        let next = next.clone();
        async move { next.acquire("page", ttl, long).await }
    });
    db.wait_queued("page", 2).await;
    let gave_up = quitting.await.unwrap();
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{gave_up:?}"
    );
    db.wait_queued("page", 1).await;
    // Woken by the leave: it tried again, and learnt it is first.
    wait_tries(&next, 3).await;
    lease.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken by the holder's release, long before the fallback poll")
        .unwrap()
        .unwrap();
    assert_eq!(next.wait_stats().timed_out, 0, "{:?}", next.wait_stats());
    granted.release().await.unwrap();
}
