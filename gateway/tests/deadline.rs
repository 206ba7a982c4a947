//! Issue 18: a request whose deadline passes answers what happened. Before
//! its statement was sent: 504 `timeout`, nothing written. After: the
//! statement's own result if it finishes within the outcome wait, else 504
//! `outcome_unknown`, and never an error for a write that lands. The
//! statement is held up the way production would hold it: another
//! transaction holds the page's row lock.

mod common;

use std::time::Duration;

use common::{keyed, Api};
use gateway::FenceCheck;
use sqlx::{Connection, PgConnection};

/// A transaction holding page `id`'s row lock until [`RowLock::release`].
struct RowLock(PgConnection);

impl RowLock {
    async fn take(url: &str, id: &str) -> RowLock {
        let mut conn = PgConnection::connect(url).await.expect("connect");
        sqlx::query("begin").execute(&mut conn).await.unwrap();
        let locked = sqlx::query("select 1 from pages where id = $1 for update")
            .bind(id)
            .execute(&mut conn)
            .await
            .unwrap();
        assert_eq!(locked.rows_affected(), 1, "page {id} has a row to lock");
        RowLock(conn)
    }

    async fn release(mut self) {
        sqlx::query("commit").execute(&mut self.0).await.unwrap();
    }
}

/// Wait (bounded) until `n` statements of the gateway wait for a lock.
async fn gateway_statements_waiting_for_a_lock(url: &str, n: i64) {
    harness::wait_until(Duration::from_secs(20), || async move {
        let mut conn = PgConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let waiting = sqlx::query_scalar::<_, i64>(
            "select count(*) from pg_stat_activity
             where application_name = 'gateway' and wait_event_type = 'Lock'
               and datname = current_database()",
        )
        .fetch_one(&mut conn)
        .await;
        {
            match waiting {
                Ok(waiting) if waiting == n => Ok(()),
                Ok(waiting) => Err(format!("{waiting} statements waiting, expected {n}")),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await
    .expect("the gateway's statements wait for the row lock");
}

async fn gateway_with(
    request: Duration,
    outcome_wait: Duration,
    pool: u32,
) -> (gateway::RunningGateway, Api, String) {
    common::gateway_with(
        keyed(FenceCheck::Enforce)
            .request_timeout(request)
            .outcome_wait(outcome_wait)
            .pool_size(pool),
    )
    .await
}

#[tokio::test]
async fn a_write_still_blocked_after_the_outcome_wait_is_answered_outcome_unknown_and_lands_later()
{
    let (gw, api, url) = gateway_with(Duration::from_secs(1), Duration::from_secs(1), 4).await;
    api.put_fenced("p", "first", 1).await.expect(201);

    let lock = RowLock::take(&url, "p").await;
    let reply = api
        .put_fenced("p", "second", 2)
        .await
        .expect_error(504, "outcome_unknown");
    assert_eq!(reply.json["id"], "p");
    assert_eq!(reply.json["method"], "PUT");
    assert_eq!(reply.json["token"], 2);
    assert_eq!(gw.state().metrics.deadlines_passed_in_flight(), 1);
    // Not written yet: the statement waits for the lock.
    assert_eq!(api.get("p", &[]).await.expect(200).json["body"], "first");

    // The statement was not abandoned: once the lock goes, the write lands.
    lock.release().await;
    harness::wait_until(Duration::from_secs(20), || {
        let api = api.clone();
        async move {
            let page = api.get("p", &[]).await.expect(200);
            match page.json["version"].as_i64() {
                Some(2) => Ok(page),
                v => Err(format!("version {v:?}")),
            }
        }
    })
    .await
    .map(|page| assert_eq!(page.json["body"], "second"))
    .expect("the write answered outcome_unknown landed");
    let history = api.history("p").await;
    assert_eq!(history[0]["outcome"], "accepted", "{history:?}");
    assert_eq!(history[0]["token"], 2);
    assert_eq!(history.len(), 2);
}

#[tokio::test]
async fn a_write_that_finishes_within_the_outcome_wait_is_answered_with_its_result() {
    // The outcome wait is long; the lock goes once the deadline has passed.
    let (gw, api, url) = gateway_with(Duration::from_secs(1), Duration::from_secs(60), 4).await;
    api.put_fenced("p", "first", 1).await.expect(201);

    let lock = RowLock::take(&url, "p").await;
    let late = tokio::spawn({
        let api = api.clone();
        async move { api.put_fenced("p", "second", 2).await }
    });
    harness::wait_until(Duration::from_secs(20), || async {
        match gw.state().metrics.deadlines_passed_in_flight() {
            1 => Ok(()),
            n => Err(format!("{n} deadlines passed in flight")),
        }
    })
    .await
    .expect("the deadline passes while the statement waits");
    lock.release().await;

    let reply = late.await.unwrap().expect(200);
    assert_eq!(reply.json["body"], "second");
    assert_eq!(reply.json["version"], 2);

    // A refusal that finishes late is answered as the refusal it is.
    let lock = RowLock::take(&url, "p").await;
    let late = tokio::spawn({
        let api = api.clone();
        async move { api.put_fenced("p", "stale", 1).await }
    });
    harness::wait_until(Duration::from_secs(20), || async {
        match gw.state().metrics.deadlines_passed_in_flight() {
            2 => Ok(()),
            n => Err(format!("{n} deadlines passed in flight")),
        }
    })
    .await
    .expect("the deadline passes while the statement waits");
    lock.release().await;
    late.await.unwrap().expect_error(409, "stale_token");
}

#[tokio::test]
async fn a_request_whose_deadline_passes_before_its_statement_is_sent_answers_timeout_and_writes_nothing(
) {
    // One connection, held by a write that waits for a row lock: the next
    // request never gets to send its statement.
    let (gw, api, url) = gateway_with(Duration::from_secs(1), Duration::from_secs(60), 1).await;
    api.put_fenced("p", "first", 1).await.expect(201);

    let lock = RowLock::take(&url, "p").await;
    let blocked = tokio::spawn({
        let api = api.clone();
        async move { api.put_fenced("p", "second", 2).await }
    });
    gateway_statements_waiting_for_a_lock(&url, 1).await;
    api.put_fenced("q", "never", 1)
        .await
        .expect_error(504, "timeout");
    assert_eq!(gw.state().metrics.deadlines_passed_in_flight(), 1);

    lock.release().await;
    blocked.await.unwrap().expect(200);
    api.get("q", &[]).await.expect_error(404, "page_not_found");
    assert!(api.history("q").await.is_empty(), "q was never attempted");
}
