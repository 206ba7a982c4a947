//! Only known clients write, plain reads stay public, and an operator can
//! reset a page's fence through the audited admin endpoint.
//! Against a real PostgreSQL; no issuer here (see issuers.rs).

use crate::common::{gateway, key_of, ADMIN};
use gateway::{FenceCheck, GatewayOptions};
use serde_json::json;

#[tokio::test]
async fn writes_and_fenced_reads_without_a_known_key_are_401_and_change_nothing() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.put_fenced("p", "original", 5).await.expect(201);
    let before = api.snapshot("p").await;

    let nobody = api.with_key(None);
    let wrong = api.with_key(Some("not-a-key-of-anybody-here".into()));
    for (who, client) in [("no key", &nobody), ("unknown key", &wrong)] {
        for reply in [
            client
                .put_fenced("p", "owned", 9_223_372_036_854_775_807)
                .await,
            client.put("p", "no token", &[]).await,
            client.get("p", &[("Fencing-Token", "9")]).await,
            client.get("fresh", &[("Fencing-Token", "9")]).await,
            // Authentication comes first, even before a malformed header.
            client.put("p", "x", &[("Fencing-Token", "abc")]).await,
        ] {
            let reply = reply.expect_error(401, "unauthorized");
            assert_eq!(
                reply
                    .headers
                    .get("www-authenticate")
                    .map(|v| v.to_str().unwrap()),
                Some("Bearer"),
                "{who}: {}",
                reply.json
            );
        }
    }
    for malformed in [
        "Basic dGVzdGVyOnRlc3Q=",
        "Bearer",
        "tester-test-key-not-secret",
    ] {
        let reply = api
            .with_key(None)
            .send(
                api.http
                    .put(api.url("/pages/p"))
                    .header("Authorization", malformed)
                    .header("Fencing-Token", "9")
                    .json(&json!({"body": "x"})),
            )
            .await;
        reply.expect_error(401, "unauthorized");
    }

    assert_eq!(api.snapshot("p").await, before, "a 401 changed the page");
    assert_eq!(api.fence("fresh").await, json!(null), "a 401 fenced a page");
}

#[tokio::test]
async fn a_client_id_naming_another_client_is_403_and_the_keys_client_is_recorded() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    let alice = api.as_client("alice");
    alice.put_fenced("p", "by alice", 3).await.expect(201);
    let before = api.snapshot("p").await;

    for reply in [
        alice.put_with_client_id("p", "as bob", 4, "bob").await,
        alice
            .get("p", &[("Fencing-Token", "4"), ("Client-Id", "bob")])
            .await,
    ] {
        let reply = reply.expect_error(403, "client_id_mismatch");
        assert_eq!(reply.json["client_id"], "alice", "{}", reply.json);
    }
    assert_eq!(api.snapshot("p").await, before, "a 403 changed the page");

    alice
        .put_with_client_id("p", "again", 4, "alice")
        .await
        .expect(200);
    let history = api.history("p").await;
    let clients: Vec<_> = history.iter().map(|h| h["client_id"].clone()).collect();
    assert_eq!(clients, [json!("alice"), json!("alice")]);
}

#[tokio::test]
async fn plain_reads_stay_public() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.put_fenced("p", "text", 1).await.expect(201);
    let public = api.with_key(None);
    assert_eq!(public.get("p", &[]).await.expect(200).json["body"], "text");
    public
        .get("none", &[])
        .await
        .expect_error(404, "page_not_found");
    assert_eq!(public.history("p").await.len(), 1);
    for path in ["/pages", "/healthz", "/readyz"] {
        public.get_path(path).await.expect(200);
    }
    let metrics = public
        .http
        .get(public.url("/metrics"))
        .send()
        .await
        .unwrap();
    assert!(metrics.status().is_success());
}

#[tokio::test]
async fn with_auth_off_anybody_writes_as_before() {
    let (_gw, api, _) = crate::common::gateway_with(GatewayOptions::new(FenceCheck::Enforce)).await;
    let anybody = api.with_key(None);
    anybody
        .put_with_client_id("p", "x", 1, "whoever")
        .await
        .expect(201);
    assert_eq!(api.history("p").await[0]["client_id"], "whoever");
}

#[tokio::test]
async fn required_auth_without_keys_refuses_to_start_and_bad_keys_are_named() {
    let url = harness::fresh_database().await;
    let err = gateway::spawn_with_options(
        &url,
        GatewayOptions::new(FenceCheck::Enforce).auth(gateway::AuthMode::Required),
    )
    .await
    .err()
    .expect("no key: refused")
    .to_string();
    assert!(err.contains("GATEWAY_AUTH=off"), "{err}");

    let err = gateway::spawn_with_options(
        &url,
        GatewayOptions::new(FenceCheck::Enforce).api_key("alice", "short-key"),
    )
    .await
    .err()
    .expect("short key: refused")
    .to_string();
    assert!(
        err.contains("shorter than 16 bytes") && !err.contains("short-key"),
        "{err}"
    );
}

#[tokio::test]
async fn an_admin_lowers_a_fence_with_an_audited_history_row() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    // A fence far above what the lock service can grant (e.g. its counter was lost).
    api.put_issued("p", "text", 1000, "redis").await.expect(201);
    api.put_issued("p", "late", 7, "redis")
        .await
        .expect_error(409, "stale_token");

    let admin = api.with_key(Some(key_of(ADMIN)));
    // No issuer is configured, so none can say what it has minted: the
    // admin must force the fence.
    let mut lower =
        json!({"issuer": "redis", "token": 6, "reason": "redis counter lost in restart"});
    let before = api.snapshot("p").await;
    let refused = admin
        .set_fence("p", &lower)
        .await
        .expect_error(409, "force_required");
    assert_eq!(
        (
            &refused.json["issuer"],
            &refused.json["token"],
            &refused.json["minted"]
        ),
        (&json!("redis"), &json!(6), &json!(null))
    );
    assert_eq!(
        api.snapshot("p").await,
        before,
        "a refused admin call wrote"
    );
    lower["force"] = json!(true);
    let reply = admin.set_fence("p", &lower).await.expect(200);
    assert_eq!(
        reply.json,
        json!({"id": "p", "version": 1, "fence": {"issuer": "redis", "token": 6},
               "previous_fence": {"issuer": "redis", "token": 1000}})
    );
    let audit = &api.history("p").await[0];
    assert_eq!(audit["method"], "ADMIN");
    assert_eq!(audit["outcome"], "fence_set");
    assert_eq!(audit["client_id"], format!("admin:{ADMIN}"));
    assert_eq!(audit["token"], 6);
    assert_eq!(audit["fence_token"], 6);
    assert_eq!(audit["reason"], "redis counter lost in restart");
    assert_eq!(audit["force"], true);
    // Ordinary rows carry no reason nor force field at all.
    let write = &api.history("p").await[1];
    assert!(
        write.get("reason").is_none() && write.get("force").is_none(),
        "{write}"
    );

    // The holder of token 7 writes again.
    api.put_issued("p", "late", 7, "redis").await.expect(200);

    // Clearing: both null. Then any issuer may fence the page again.
    let clear = json!({"issuer": null, "token": null, "reason": "moving to zookeeper"});
    let cleared = admin.set_fence("p", &clear).await.expect(200);
    assert_eq!(cleared.json["fence"], json!(null));
    assert_eq!(api.history("p").await[0]["force"], false);
    api.put_issued("p", "zk", 3, "zookeeper").await.expect(200);
}

#[tokio::test]
async fn the_admin_endpoint_refuses_writers_strangers_and_bad_bodies_changing_nothing() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.put_fenced("p", "text", 50).await.expect(201);
    let before = api.snapshot("p").await;
    let body = json!({"issuer": "default", "token": 1, "reason": "test", "force": true});

    api.with_key(None)
        .set_fence("p", &body)
        .await
        .expect_error(401, "unauthorized");
    api.with_key(Some("unknown-key-0123456789".into()))
        .set_fence("p", &body)
        .await
        .expect_error(401, "unauthorized");
    // A writer's key is not an admin key.
    api.set_fence("p", &body)
        .await
        .expect_error(403, "forbidden");

    let admin = api.with_key(Some(key_of(ADMIN)));
    for (bad, code) in [
        (json!({"issuer": "default", "token": 1}), "invalid_json"),
        (
            json!({"issuer": "default", "token": 1, "reason": "  "}),
            "invalid_reason",
        ),
        (
            json!({"issuer": "default", "token": null, "reason": "x"}),
            "invalid_fence",
        ),
        (
            json!({"issuer": "Bad Name", "token": 1, "reason": "x"}),
            "invalid_fencing_issuer",
        ),
        (
            json!({"issuer": "default", "token": -1, "reason": "x"}),
            "invalid_json",
        ),
        (
            json!({"issuer": "default", "token": 1, "reason": "x", "extra": 1}),
            "invalid_json",
        ),
    ] {
        admin.set_fence("p", &bad).await.expect_error(400, code);
    }
    admin
        .set_fence("nobody", &body)
        .await
        .expect_error(404, "page_not_found");
    assert_eq!(
        api.snapshot("p").await,
        before,
        "a refused admin call changed the page"
    );
    assert_eq!(api.fence("nobody").await, json!(null));
}
