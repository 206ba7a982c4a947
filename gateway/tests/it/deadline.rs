//! A request whose deadline passes answers what happened. Before
//! its statement was sent: 504 `timeout`, nothing written. After: the
//! statement's own result if it finishes within the outcome wait, else 504
//! `outcome_unknown`, and never an error for a write that lands. The
//! statement is held up the way production would hold it: another
//! transaction holds the page's row lock.

use std::time::Duration;

use crate::common::{keyed, wait_statements_waiting_for_a_lock, Api, Reply};
use gateway::FenceCheck;
use sqlx::{Connection, PgConnection};
use tokio::task::JoinHandle;

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

/// Wait (bounded) until the deadlines of `n` requests passed while their
/// statement was in flight.
async fn wait_deadlines_passed_in_flight(gw: &gateway::RunningGateway, n: u64) {
    harness::wait_until(Duration::from_secs(20), || async {
        match gw.state().metrics.deadlines_passed_in_flight() {
            passed if passed == n => Ok(()),
            passed => Err(format!("{passed} deadlines passed in flight")),
        }
    })
    .await
    .expect("the deadline passes while the statement waits");
}

/// A PUT of page `p` in a task of its own, so that the test can go on while
/// it waits for the row lock.
fn put_p_in_background(api: &Api, body: &'static str, token: u64) -> JoinHandle<Reply> {
    let api = api.clone();
    tokio::spawn(async move { api.put_fenced("p", body, token).await })
}

async fn gateway_with(
    request: Duration,
    outcome_wait: Duration,
    pool: u32,
) -> (gateway::RunningGateway, Api, String) {
    crate::common::gateway_with(
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
    let late = put_p_in_background(&api, "second", 2);
    wait_deadlines_passed_in_flight(&gw, 1).await;
    lock.release().await;

    let reply = late.await.unwrap().expect(200);
    assert_eq!(reply.json["body"], "second");
    assert_eq!(reply.json["version"], 2);

    // A refusal that finishes late is answered as the refusal it is.
    let lock = RowLock::take(&url, "p").await;
    let late = put_p_in_background(&api, "stale", 1);
    wait_deadlines_passed_in_flight(&gw, 2).await;
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
    let blocked = put_p_in_background(&api, "second", 2);
    wait_statements_waiting_for_a_lock(&url, 1).await;
    api.put_fenced("q", "never", 1)
        .await
        .expect_error(504, "timeout");
    assert_eq!(gw.state().metrics.deadlines_passed_in_flight(), 1);

    lock.release().await;
    blocked.await.unwrap().expect(200);
    api.get("q", &[]).await.expect_error(404, "page_not_found");
    assert!(api.history("q").await.is_empty(), "q was never attempted");
}
