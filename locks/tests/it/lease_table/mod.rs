//! The lease-table backend against real PostgreSQL (`pg`) and MariaDB
//! (`mysql`) servers: each test on a fresh database. The claims both meet
//! are written once ([`lease_table_claims`]); this module holds them and the
//! fixture they start from.

use std::time::Duration;

use fencelock::lease_table::LeaseTable;
use fencelock::{HolderLookup, Lease, LockError, LockService, LockState, Token, WaitStats};
use tokio::time::Instant;

use crate::support::fair::{self, Queue};
use crate::support::{
    assert_timeout, assert_unavailable, granted, held, holder_of, spawn_acquire, take_and_release,
};

mod mysql;
mod pg;
mod pg_listen;
mod rights;

/// The same claims for both databases, as tests of the module that invokes
/// it: `$at` gives a service on a fresh database and its [`Db`].
macro_rules! lease_table_claims {
    ($at:expr, $issuer:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn mutual_exclusion_under_contention() {
            let svc: Arc<dyn LockService> = Arc::new($at.await.0);
            contract::mutual_exclusion_under_contention(svc, "page-1", 8, 25).await;
        }

        #[tokio::test]
        async fn tokens_strictly_increase_per_lock_name() {
            let svc = $at.await.0;
            assert_eq!(LockService::issuer(&svc), $issuer);
            assert_eq!(contract::tokens_strictly_increase(&svc, "a", 5).await, 5);
            assert_eq!(contract::tokens_strictly_increase(&svc, "b", 2).await, 2);
        }

        #[tokio::test]
        async fn holder_lookup_names_the_client_and_token() {
            let svc = $at.await.0.with_client_id("alice").unwrap();
            contract::holder_lookup_names_the_client_and_token(&svc, &svc, "alice", "page", true)
                .await;
        }

        #[tokio::test]
        async fn dropped_lease_is_released_in_the_background() {
            contract::dropped_lease_is_released_in_the_background(&$at.await.0, "page").await;
        }

        #[tokio::test]
        async fn late_release_by_expired_holder_is_a_no_op() {
            let svc = $at.await.0;
            contract::late_release_is_a_no_op(&svc, "page", Duration::from_millis(300)).await;
        }

        #[tokio::test]
        async fn expiry_lets_next_holder_in_with_higher_token() {
            let svc = $at.await.0;
            let ttl = Duration::from_millis(300);
            contract::expiry_lets_next_holder_in_with_higher_token(&svc, "page", ttl).await;
        }

        #[tokio::test]
        async fn watchdog_keeps_lease_alive_well_past_ttl() {
            contract::renewal_keeps_lease_past_ttl(&$at.await.0, "page").await;
        }

        #[tokio::test]
        async fn lapsed_lease_blocks_others_for_the_lock_delay() {
            let ttl = Duration::from_millis(300);
            let delay = Duration::from_millis(700);
            let svc = $at.await.0.with_lock_delay(delay);
            let first = svc
                .acquire_with("page", AcquireOptions::new(ttl).auto_renew(false))
                .await
                .unwrap();
            let granted = Instant::now();
            tokio::time::sleep(ttl + Duration::from_millis(100)).await; // the scenario: lapse
            let during = svc.acquire("page", ttl, Duration::ZERO).await;
            assert_timeout(during, "a lapsed lease blocks for the lock-delay");
            let after_the_delay = AcquireOptions::new(ttl).wait(Duration::from_secs(5));
            let next = held_with(&svc, "page", after_the_delay).await;
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
            let svc = $at.await.0.with_lock_delay(Duration::from_secs(30));
            take_and_release(&svc, "page", Duration::from_secs(5)).await;
            // A release frees the lock at once.
            take_and_release(&svc, "page", Duration::from_secs(5)).await;
        }

        #[tokio::test]
        async fn bad_requests_are_invalid_config() {
            contract::bad_requests_are_invalid_config(&$at.await.0).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn non_fair_mutual_exclusion_under_contention() {
            let svc: Arc<dyn LockService> = Arc::new($at.await.0.non_fair());
            contract::mutual_exclusion_under_contention(svc, "page-1", 8, 25).await;
        }

        #[tokio::test]
        async fn non_fair_holder_lookup_names_the_client_and_token() {
            let svc = $at.await.0.non_fair().with_client_id("alice").unwrap();
            assert!(!svc.is_fair());
            contract::holder_lookup_names_the_client_and_token(&svc, &svc, "alice", "page", true)
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
            let waiters = vec![svc.clone(); 4];
            fair::fair_waiters_are_granted_in_the_order_they_queued(&svc, waiters, &db).await;
        }

        /// What starved the waiters of the polled lock: the holder
        /// releases and asks again at once. Fair, it queues behind.
        #[tokio::test]
        async fn a_fair_holder_that_asks_again_at_once_queues_behind_the_waiter() {
            let (svc, db) = $at.await;
            fair::a_fair_holder_that_asks_again_at_once_queues_behind_the_waiter(
                &svc,
                &svc.clone(),
                &db,
            )
            .await;
        }

        /// The lock freed while its first waiter is not looking: it stays
        /// that waiter's until its place lapses; a newcomer is refused.
        #[tokio::test]
        async fn a_free_lock_waits_for_the_first_waiter_and_a_newcomer_is_refused() {
            let (svc, db) = $at.await;
            let first = svc.clone().with_poll_fallback(Duration::from_secs(10));
            fair::a_free_lock_waits_for_the_first_waiter_and_a_newcomer_is_refused(
                &svc,
                &first,
                std::slice::from_ref(&svc),
                &db,
            )
            .await;
        }

        /// A waiter that queued, then stopped: never polled again, never
        /// dropped, as a process that froze or died. It stops after its
        /// first refused try (when it starts listening) or in its wait
        /// after the second: a waiter of the same service must not depend
        /// on it in either.
        #[tokio::test]
        async fn a_dead_fair_waiter_is_skipped_once_its_place_lapses() {
            for stop_after_tries in [1, 2] {
                a_dead_fair_waiter_is_skipped($at.await, stop_after_tries).await;
            }
        }

        #[tokio::test]
        async fn a_fair_waiter_that_gives_up_leaves_the_queue() {
            let (svc, db) = $at.await;
            // Its place would last 40 s: only leaving explains an empty queue.
            let quitter = svc.clone().with_poll_fallback(Duration::from_secs(10));
            fair::a_fair_waiter_that_gives_up_leaves_the_queue(&svc, &quitter, &db).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_release_wakes_only_the_next_fair_waiter() {
            a_release_wakes_only_the_next_waiter($at.await).await;
        }

        #[tokio::test]
        async fn lock_names_differing_in_case_are_two_locks() {
            names_are_compared_byte_for_byte(&$at.await.0).await;
        }

        #[tokio::test]
        async fn the_lookup_says_the_highest_token_minted() {
            the_highest_token_minted(&$at.await.0).await;
        }
    };
}
use lease_table_claims;

/// A service on a fresh PostgreSQL database, and a way to look at its tables.
async fn postgres_at() -> (LeaseTable, Db) {
    let url = harness::fresh_database().await;
    let svc = LeaseTable::postgres(&url).await.expect("lease-postgres");
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    (svc, Db::Postgres(pool, url))
}

/// A service on a fresh MariaDB database, and a way to look at its tables.
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
    /// The PostgreSQL pool (the test is PostgreSQL's).
    fn pg(&self) -> &sqlx::PgPool {
        match self {
            Db::Postgres(pool, _) => pool,
            Db::MySql(..) => unreachable!("a PostgreSQL test"),
        }
    }

    /// The MariaDB pool (the test is MariaDB's).
    fn mysql(&self) -> &sqlx::MySqlPool {
        match self {
            Db::MySql(pool, _) => pool,
            Db::Postgres(..) => unreachable!("a MariaDB test"),
        }
    }

    /// Another service on the same database, with its own pool and its own
    /// wait counters: another process, as far as the lock can tell.
    async fn service(&self) -> LeaseTable {
        match self {
            Db::Postgres(_, url) => LeaseTable::postgres(url).await.unwrap(),
            Db::MySql(_, url) => LeaseTable::mysql(url).await.unwrap(),
        }
    }

    /// [`Db::service`] with a fallback poll (60 s) far beyond every bound of
    /// these tests: only a wake explains a prompt grant.
    async fn woken_service(&self) -> LeaseTable {
        self.service()
            .await
            .with_poll_fallback(Duration::from_secs(60))
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
        let lease = held(&quiet, "page", ttl).await;
        assert_eq!(
            quiet.statements_sent() - sent,
            2,
            "the light grant refused, the full one granted"
        );
        lease.release().await.unwrap();

        let passed = "update fencelock_leases set queued_until = now";
        match self {
            Db::Postgres(p, _) => {
                let passed = format!("{passed}() - interval '1 second'");
                sqlx::query(&passed).execute(p).await.unwrap();
            }
            Db::MySql(p, _) => {
                let passed = format!("{passed}(6) - interval 1 second");
                sqlx::query(&passed).execute(p).await.unwrap();
            }
        }
        let quiet = self.service().await;
        let sent = quiet.statements_sent();
        take_and_release(&quiet, "page", ttl).await;
        assert_eq!(quiet.statements_sent() - sent, 2);
    }

    /// A quiet service's (`quiet`, never refused) acquire of `page`, which is
    /// free while a live place waits in its queue: refused, after two
    /// statements (the light grant, then the full one).
    async fn light_grant_refused_while_a_place_lives(&self, quiet: &LeaseTable) {
        let sent = quiet.statements_sent();
        let refused = quiet
            .acquire("page", Duration::from_secs(30), Duration::ZERO)
            .await;
        assert_timeout(
            refused,
            "a free lock with a live place in its queue, for a newcomer",
        );
        assert_eq!(
            quiet.statements_sent() - sent,
            2,
            "light, then the full grant"
        );
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
}

/// The queue as the claims of a fair lock look at it.
impl Queue for Db {
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

/// A fair waiter of `svc`'s (a clone: the same counters) that stops being
/// polled once `svc` counted `stop_after_tries` more tries, as a process
/// that froze or died; then a live one, polled. After the holder's release
/// the live one must be granted once the dead one's place lapses (places
/// last 4 × 100 ms without renewal), and the dead one's row goes with a
/// refused try of the live one.
async fn a_dead_fair_waiter_is_skipped((svc, db): (LeaseTable, Db), stop_after_tries: u64) {
    let fallback = Duration::from_millis(100);
    let dead = svc.clone().with_poll_fallback(fallback);
    let live = svc.clone().with_poll_fallback(fallback);
    let lease = held(&svc, "page", Duration::from_secs(30)).await;
    let tries = svc.wait_stats().tries;
    let mut frozen =
        Box::pin(dead.acquire("page", Duration::from_secs(30), Duration::from_secs(60)));
    poll_until_tries(&mut frozen, &dead, tries + stop_after_tries).await;
    assert_eq!(db.queued("page").await, 1);
    std::mem::forget(frozen);
    let waiting = spawn_acquire(
        &live,
        "page",
        Duration::from_secs(30),
        Duration::from_secs(20),
    );
    db.wait_queued("page", 2).await;
    lease.release().await.unwrap();
    let why = format!(
        "the live waiter gets the lock once the dead one's place lapsed (stopped after \
         {stop_after_tries} tries)"
    );
    granted(waiting, &why).await.release().await.unwrap();
    db.wait_queued("page", 0).await;
}

/// Poll `acquire` (of a service sharing `svc`'s counters) until `svc` has
/// counted `tries` tries, then leave it. The poll that counted the last one
/// went on as far as it could without an answer from the server: after a
/// first refused try, into the start of the `LISTEN` connection
/// (PostgreSQL) or its first wait on a bell (MariaDB); after the second,
/// into its wait.
async fn poll_until_tries<F>(acquire: &mut std::pin::Pin<Box<F>>, svc: &LeaseTable, tries: u64)
where
    F: std::future::Future<Output = Result<Lease, LockError>>,
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

/// Three fair waiters, each its own service (its own counters), queued
/// behind a holder; fallback poll 60 s, places 240 s, TTL 30 s: only a wake
/// explains a prompt grant. Each release must wake exactly the next waiter:
/// a waiter woken for somebody else's turn would show one more wake and one
/// more (refused) try, and one handed the lock on PostgreSQL a try at all.
/// On MariaDB the others also stay blocked in the server.
async fn a_release_wakes_only_the_next_waiter((svc, db): (LeaseTable, Db)) {
    let (ttl, wait) = (Duration::from_secs(30), Duration::from_secs(50));
    let lease = held(&svc, "page", ttl).await;
    let (mut waiters, mut tasks) = (vec![], vec![]);
    for i in 0..3 {
        let waiter = db.woken_service().await;
        tasks.push(spawn_acquire(&waiter, "page", ttl, wait));
        db.wait_queued("page", i + 1).await;
        wait_tries(&waiter, db.tries_before_waiting()).await;
        db.wait_blocked(i + 1).await;
        waiters.push(waiter);
    }
    let before: Vec<WaitStats> = waiters.iter().map(LeaseTable::wait_stats).collect();
    lease.release().await.unwrap();
    for (i, task) in tasks.into_iter().enumerate() {
        let why = format!("waiter {i} granted after the release before it");
        let granted = granted(task, &why).await;
        for (j, waiter) in waiters.iter().enumerate().skip(i + 1) {
            assert_eq!(
                waiter.wait_stats(),
                before[j],
                "waiter {j} stirred while waiter {i} was granted"
            );
        }
        db.wait_blocked(2 - i as i64).await;
        granted.release().await.unwrap();
    }
    for (j, waiter) in waiters.iter().enumerate() {
        // On PostgreSQL a holder that waited hands the lock to the next
        // waiter in its release, and that waiter's grant sends nothing.
        let handed = matches!(db, Db::Postgres(..)) && j > 0;
        let woken_once = WaitStats {
            tries: before[j].tries + u64::from(!handed),
            notified: before[j].notified + 1,
            timed_out: before[j].timed_out,
        };
        assert_eq!(
            waiter.wait_stats(),
            woken_once,
            "waiter {j}: woken once, by its turn"
        );
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
        let lease = held(svc, "page", ttl).await;
        let (sent_before, tries_before) = (waiter.statements_sent(), waiter.wait_stats().tries);
        let task = spawn_acquire(waiter, "page", ttl, wait);
        db.wait_queued("page", 1).await;
        wait_tries(waiter, tries_before + 1).await;
        db.wait_blocked(1).await;
        lease.release().await.unwrap();
        let granted = granted(task, "granted after the release").await;
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

/// The claim of [`fair::waiter_is_woken_by_the_release`], fair or not: the
/// waiter is a clone of the holder, so they share their counters (the
/// holder's try counts too). PostgreSQL: refused, listening, refused again;
/// MariaDB: refused, then blocked on the bell.
async fn waiter_is_woken_by_the_release((svc, db): (LeaseTable, Db), fair: bool) {
    let holder = if fair { svc } else { svc.non_fair() };
    let waiter = holder.clone().with_poll_fallback(Duration::from_secs(60));
    let tries_before_waiting = 1 + db.tries_before_waiting();
    fair::waiter_is_woken_by_the_release(&holder, &waiter, tries_before_waiting, &db).await;
}

/// `svc`'s tokens keep growing across `crash` of its server (a kill, then
/// a start on the same data): they are committed rows. The pool replaces
/// its dead connections; the next acquire gets the wait to do so.
async fn tokens_keep_increasing_across(
    svc: LeaseTable,
    crash: impl std::future::Future<Output = ()>,
) {
    let before = crate::support::contract::tokens_strictly_increase(&svc, "page", 3).await;
    crash.await;
    let wait = Duration::from_secs(10);
    crate::support::contract::the_next_token_is_higher(&svc, "page", before, wait).await;
}

/// `page:demo` and `page:DEMO` (and a name with a trailing space) are
/// locks of their own, each with its own tokens.
async fn names_are_compared_byte_for_byte(svc: &LeaseTable) {
    let ttl = Duration::from_secs(30);
    let demo = held(svc, "page:demo", ttl).await;
    let upper = held(svc, "page:DEMO", ttl).await;
    let spaced = held(svc, "page:demo ", ttl).await;
    for lease in [&demo, &upper, &spaced] {
        assert_eq!(lease.token().unwrap().get(), 1, "{}", lease.name());
    }
    for lease in [demo, upper, spaced] {
        lease.release().await.unwrap();
    }
}

/// The holder lookup's state: no row, nothing minted (0); while held,
/// the holder and its token; released, no holder and the same token.
async fn the_highest_token_minted(svc: &LeaseTable) {
    let ttl = Duration::from_secs(30);
    let never = svc.state("page").await.unwrap();
    assert_eq!(
        never,
        LockState {
            holder: None,
            minted: Some(Token::MIN)
        }
    );
    take_and_release(svc, "page", ttl).await;
    let lease = held(svc, "page", ttl).await;
    let token = lease.token().unwrap();
    assert_eq!(token.get(), 2);
    let state = svc.state("page").await.unwrap();
    assert_eq!(state.holder, holder_of(&lease));
    assert_eq!(state.minted, Some(token));
    lease.release().await.unwrap();
    assert_eq!(svc.minted("page").await.unwrap(), Some(token));
    assert_eq!(svc.current_holder("page").await.unwrap(), None);
}

/// The constructors and installs can run in a spawned task (the gateway
/// connects its issuers so): their futures are `Send`.
#[test]
fn the_constructors_and_installs_are_send() {
    fn send<T: Send>(_: T) {}
    let install = fencelock::lease_table::Install::new();
    send(LeaseTable::postgres(""));
    send(LeaseTable::mysql(""));
    send(LeaseTable::postgres_reader(""));
    send(LeaseTable::mysql_reader(""));
    send(fencelock::lease_table::install_postgres("", &install));
    send(fencelock::lease_table::install_mysql("", &install));
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
    let nobody = format!("postgres://postgres@127.0.0.1:{port}/x");
    assert_unavailable(LeaseTable::postgres(&nobody).await, "lease-postgres");
    let nobody = format!("mysql://root@127.0.0.1:{port}/x");
    assert_unavailable(LeaseTable::mysql(&nobody).await, "lease-mysql");
    assert!(started.elapsed() < Duration::from_secs(10), "fail fast");
}
