//! The lease-table backend against real PostgreSQL and MariaDB servers.

mod support;

use std::sync::Arc;
use std::time::Duration;

use fencelock::lease_table::LeaseTable;
use fencelock::{AcquireOptions, LockError, LockService};
use harness::Postgres;
use support::contract;
use tokio::time::Instant;

async fn postgres() -> LeaseTable {
    LeaseTable::postgres(&harness::fresh_database().await)
        .await
        .expect("lease-postgres")
}

async fn mysql() -> LeaseTable {
    LeaseTable::mysql(&harness::fresh_mysql_database().await)
        .await
        .expect("lease-mysql")
}

/// The same claims for both databases: `$connect` gives a service on a fresh
/// database.
macro_rules! lease_table_claims {
    ($db:ident, $connect:expr, $issuer:literal) => {
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
        }
    };
}

lease_table_claims!(pg, postgres(), "lease-postgres");
lease_table_claims!(my, mysql(), "lease-mysql");

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
