//! A PostgreSQL outage: 503 JSON while it is down, and recovery without a
//! gateway restart once it is back.

use std::time::Duration;

use crate::common::Api;
use gateway::FenceCheck;

#[tokio::test]
async fn database_outage_answers_503_json_and_the_gateway_recovers_by_itself() {
    let mut pg = harness::Postgres::start().await;
    let url = pg.create_database().await;
    let gw = gateway::spawn_with_options(&url, crate::common::keyed(FenceCheck::Enforce))
        .await
        .unwrap();
    let api = Api::new(gw.url()).as_client("tester");
    api.put_fenced("p", "before", 1).await.expect(201);

    pg.kill();
    api.expect_database_unavailable("p", 2).await;
    api.get_path("/healthz").await.expect(200);

    pg.start_again().await;
    // The pool reconnects on its own; the first requests may still see a dead
    // connection being replaced, so poll (bounded) for readiness.
    api.wait_ready(Duration::from_secs(20)).await;

    let page = api.get("p", &[]).await.expect(200);
    assert_eq!(page.json["body"], "before", "the failed write left nothing");
    api.put_fenced("p", "after", 2).await.expect(200);
    gw.shutdown().await.unwrap();
}
