//! Fencing off never touches the fence: a gateway with GATEWAY_FENCING=off
//! on the fenced gateways' database writes pages and records `stale` writes,
//! but cannot raise a page's fence nor give a page an issuer, by its
//! statements (on a superuser's login) and by its role's rights (on its own
//! login, where PostgreSQL would refuse it).

use gateway::{FenceCheck, RunningGateway};
use serde_json::{json, Value};

use crate::common::{keyed, outcomes, Api, ADMIN};
use crate::roles::database_with_roles;

const MAX: u64 = i64::MAX as u64;

/// A fenced and an unfenced gateway on one database, as `fenced_url` and
/// `unfenced_url`'s logins; the database already set up when not `migrate`.
async fn both(
    fenced_url: &str,
    unfenced_url: &str,
    migrate: bool,
) -> ([RunningGateway; 2], Api, Api) {
    let fenced =
        gateway::spawn_with_options(fenced_url, keyed(FenceCheck::Enforce).migrate(migrate))
            .await
            .expect("the fenced gateway");
    let unfenced =
        gateway::spawn_with_options(unfenced_url, keyed(FenceCheck::Off).migrate(migrate))
            .await
            .expect("the unfenced gateway");
    let apis = (
        Api::new(fenced.url()).as_client("alice"),
        Api::new(unfenced.url()).as_client("mallory"),
    );
    ([fenced, unfenced], apis.0, apis.1)
}

fn fence(issuer: &str, token: u64) -> Value {
    json!({"issuer": issuer, "token": token})
}

/// What the unfenced gateway tried against the fence, and what stopped it.
async fn the_unfenced_gateway_cannot_raise_a_fence_nor_claim_an_issuer(fenced: Api, unfenced: Api) {
    let issued = |issuer: &'static str| [("Fencing-Issuer", issuer)];

    // Before any fenced access: the largest token, a bogus issuer. The
    // pages are written, and no fence is set.
    unfenced
        .put_fenced_with("p", "by mallory", MAX, &issued("redis"))
        .await
        .expect(201);
    let claimed = unfenced
        .put_fenced_with("q", "by mallory", 5, &issued("zz-bogus-issuer"))
        .await
        .expect(201);
    assert_eq!(claimed.json["fence"], json!(null));
    unfenced
        .get(
            "r",
            &[
                ("Fencing-Token", "9223372036854775807"),
                ("Fencing-Issuer", "zz-bogus-issuer"),
            ],
        )
        .await
        .expect_error(404, "page_not_found");
    for page in ["p", "q", "r"] {
        assert_eq!(fenced.fence(page).await, json!(null), "{page}");
    }

    // The fenced holders of token 1 are neither stale nor of the wrong issuer.
    for page in ["p", "q", "r"] {
        let r = fenced
            .put_fenced_with(page, "by alice", 1, &issued("redis"))
            .await;
        assert!(r.status.is_success(), "{page}: {} {}", r.status, r.json);
        assert_eq!(r.json["fence"], fence("redis", 1), "{page}");
    }

    // Once fenced: the unfenced gateway's writes land (that is what fencing
    // off means), older ones are recorded stale, and the fence stays.
    let late = unfenced
        .put_fenced_with("p", "late", 0, &issued("redis"))
        .await
        .expect(200);
    assert_eq!(late.json["fence"], fence("redis", 1), "shown as it is");
    unfenced
        .put_fenced_with("p", "huge", MAX, &issued("redis"))
        .await
        .expect(200);
    unfenced
        .put_fenced_with("p", "bogus", MAX, &issued("zz-bogus-issuer"))
        .await
        .expect(200);
    unfenced
        .get(
            "p",
            &[
                ("Fencing-Token", "9223372036854775807"),
                ("Fencing-Issuer", "redis"),
            ],
        )
        .await
        .expect(200);
    assert_eq!(fenced.fence("p").await, fence("redis", 1));
    let history = fenced.history("p").await;
    assert_eq!(
        outcomes(&history),
        ["accepted", "accepted", "accepted", "stale", "accepted", "accepted"]
    );
    assert!(
        history
            .iter()
            .all(|h| h["fence_token"] == json!(1) || h["fence_token"].is_null()),
        "{history:?}"
    );

    // The fenced holder goes on with its next token.
    fenced
        .put_fenced_with("p", "by alice again", 2, &issued("redis"))
        .await
        .expect(200);
    assert_eq!(fenced.fence("p").await, fence("redis", 2));

    // The admin endpoint of the unfenced gateway refuses to touch a fence.
    unfenced
        .as_client(ADMIN)
        .set_fence(
            "p",
            &json!({"issuer": null, "token": null, "reason": "clear it", "force": true}),
        )
        .await
        .expect_error(409, "fencing_off");
    assert_eq!(fenced.fence("p").await, fence("redis", 2));
}

#[tokio::test]
async fn on_a_superusers_login_the_unfenced_statements_never_move_the_fence() {
    let url = harness::fresh_database().await;
    let (_gws, fenced, unfenced) = both(&url, &url, true).await;
    the_unfenced_gateway_cannot_raise_a_fence_nor_claim_an_issuer(fenced, unfenced).await;
}

#[tokio::test]
async fn on_their_own_logins_a_fenced_and_an_unfenced_gateway_share_a_database() {
    let db = database_with_roles().await;
    let (_gws, fenced, unfenced) = both(&db.gateway, &db.unfenced, false).await;
    the_unfenced_gateway_cannot_raise_a_fence_nor_claim_an_issuer(fenced, unfenced).await;
}

#[tokio::test]
async fn alone_the_unfenced_gateway_writes_every_token_and_fences_nothing() {
    let url = harness::fresh_database().await;
    let unfenced = gateway::spawn_with_options(&url, keyed(FenceCheck::Off))
        .await
        .unwrap();
    let api = Api::new(unfenced.url()).as_client("tester");
    api.put("p", "no token", &[]).await.expect(201);
    api.put_fenced("p", "new holder", 34).await.expect(200);
    let late = api.put_fenced("p", "old holder", 33).await.expect(200);
    assert_eq!(late.json["body"], "old holder");
    assert_eq!(late.json["fence"], json!(null), "nothing fenced the page");
    api.put("p", "x", &[("Fencing-Token", "40"), ("If-Match", "\"1\"")])
        .await
        .expect_error(412, "version_mismatch");
    let history = api.history("p").await;
    assert_eq!(
        outcomes(&history),
        ["version_mismatch", "accepted", "accepted", "accepted"]
    );
    assert_eq!(history[1]["token"], 33);
    assert!(history.iter().all(|h| h["fence_token"].is_null()));
    assert_eq!(api.get("p", &[]).await.json["version"], 3);
}
