//! A gateway on a primary with a streaming standby, reached through a
//! multi-host `DATABASE_URL` with `target_session_attrs=read-write`: while no
//! server accepts writes it answers 503 (never a 500, never the standby's
//! stale data), and after the promotion it follows the new primary without a
//! restart.

use std::time::Duration;

use crate::common::Api;
use gateway::store::{fenced_access, Access};
use gateway::{ApiError, FenceCheck};
use harness::{PostgresPair, Replication};

#[tokio::test]
async fn requests_follow_the_primary_to_the_promoted_standby() {
    let mut pg = PostgresPair::start(Replication::Sync).await;
    let url = pg.create_database().await;
    let gw = gateway::spawn(&url, FenceCheck::Enforce).await.unwrap();
    let api = Api::new(gw.url());
    api.put_fenced("p", "before the failover", 5)
        .await
        .expect(201);

    pg.kill_primary();
    // The standby is up and has the page, but does not accept writes: reads
    // and writes alike are refused rather than served from it.
    for _ in 0..3 {
        api.expect_database_unavailable("p", 6).await;
    }

    pg.promote().await;
    api.wait_ready(Duration::from_secs(30)).await;
    let page = api.get("p", &[]).await.expect(200);
    assert_eq!(page.json["body"], "before the failover");
    assert_eq!(page.json["fence"]["token"], 5, "the fence survived (sync)");
    api.put_fenced("p", "stale", 4)
        .await
        .expect_error(409, "stale_token");
    api.put_fenced("p", "after the failover", 6)
        .await
        .expect(200);
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_statement_refused_by_a_read_only_server_is_a_503() {
    let pg = PostgresPair::start(Replication::Async).await;
    let url = pg.create_database().await;
    // The schema exists on the primary, and so, once replayed, on the standby.
    let gw = gateway::spawn(&url, FenceCheck::Enforce).await.unwrap();
    pg.wait_caught_up(Duration::from_secs(30)).await.unwrap();
    let db_name = url.rsplit('/').next().unwrap().split('?').next().unwrap();
    let standby = pg.standby_url(db_name).expect("a standby");
    let db = gateway::db::Db::from_url(&standby, 1).unwrap();
    let write = Access {
        id: "p".into(),
        write: Some("on a standby".into()),
        token: None,
        issuer: "default".into(),
        if_match: None,
        enforce: false,
        page_issuer: None,
        client_id: None,
    };
    let err = fenced_access(&db, &write, || true).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(err.to_string().contains("read-only"), "{err}");
    assert_eq!(
        db.idle_connections(),
        0,
        "the standby's connection was dropped"
    );
    let api_error = ApiError::from(err);
    assert_eq!(api_error.status().as_u16(), 503, "{api_error:?}");
    assert_eq!(api_error.code(), "database_unavailable");
    gw.shutdown().await.unwrap();
}
