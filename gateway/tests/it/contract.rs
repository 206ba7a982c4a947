//! The OpenAPI description served, and what schemathesis found
//! (tests/tests/it/openapi_fuzz.rs), each fixed in the gateway and pinned here
//! on a real PostgreSQL.

use crate::common::{gateway, gateway_with, keyed, ADMIN};
use gateway::{AuthMode, FenceCheck, GatewayOptions};
use serde_json::{json, Value};

#[tokio::test]
async fn openapi_json_is_the_3_1_description_of_every_route_and_docs_serve_swagger_ui() {
    let (gw, _api, _) = gateway(FenceCheck::Enforce).await;
    let http = reqwest::Client::new();
    let get = |path: &str| http.get(format!("{}{path}", gw.url())).send();

    let spec = get("/openapi.json").await.unwrap();
    assert_eq!(spec.status(), 200);
    assert_eq!(spec.headers()["content-type"], "application/json");
    let spec: Value = spec.json().await.unwrap();
    assert_eq!(spec["openapi"], "3.1.0");
    assert_eq!(&spec, gateway::http::description());
    let put = &spec["paths"]["/pages/{id}"]["put"];
    let headers: Vec<&str> = put["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["in"] == "header")
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        headers,
        ["Fencing-Token", "Fencing-Issuer", "Client-Id", "If-Match"]
    );
    assert_eq!(put["security"], json!([{"writer_key": []}]));
    assert_eq!(put["responses"]["201"]["headers"]["ETag"]["required"], true);
    assert_eq!(
        put["responses"]["401"]["headers"]["WWW-Authenticate"]["required"],
        true
    );
    assert_eq!(
        spec["paths"]["/admin/pages/{id}/fence"]["post"]["security"],
        json!([{"admin_key": []}])
    );

    let docs = get("/docs/").await.unwrap();
    assert_eq!(docs.status(), 200);
    assert!(docs.text().await.unwrap().contains("swagger-ui-bundle.js"));
    // Swagger UI reads this gateway's description, and asks nobody else to
    // validate it.
    let init = get("/docs/swagger-initializer.js")
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(init.contains("\"/openapi.json\""), "{init}");
    assert!(init.contains("\"validatorUrl\": \"none\""), "{init}");
    let missing = get("/docs/nothing-here.js").await.unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.json::<Value>().await.unwrap()["error"], "not_found");
}

/// Found by schemathesis: a `Client-Id` with a tab was accepted (and, with
/// keys off, recorded in the history), though no lock holder can have one.
#[tokio::test]
async fn client_id_with_a_tab_or_a_space_is_refused_and_leaves_no_history() {
    let (_gw, api, _) =
        gateway_with(GatewayOptions::new(FenceCheck::Off).auth(AuthMode::Off)).await;
    for bad in ["MOw=c',:JIm0U_\toL`Qh", "two words"] {
        api.put("p", "x", &[("Fencing-Token", "1"), ("Client-Id", bad)])
            .await
            .expect_error(400, "invalid_client_id");
        api.get("p", &[("Fencing-Token", "1"), ("Client-Id", bad)])
            .await
            .expect_error(400, "invalid_client_id");
    }
    assert_eq!(api.snapshot("p").await, (None, vec![]));
    // Leading and trailing spaces are the header's, not the value's.
    api.put_with_client_id("p", "x", 1, " alice ")
        .await
        .expect(201);
    assert_eq!(api.history("p").await[0]["client_id"], "alice");
}

/// Found by schemathesis: the admin body's `token: 28.0` (the integer 28 to
/// JSON Schema) was refused as "invalid type: floating point". Taken now,
/// as long as a double holds it exactly; a fence is never rounded.
#[tokio::test]
async fn admin_fence_token_written_as_an_integral_number_with_a_fraction_is_taken_exactly() {
    let (_gw, api, _) = gateway_with(keyed(FenceCheck::Enforce)).await;
    api.put_fenced("p", "x", 5).await.expect(201);
    let admin = api.as_client(ADMIN);
    let set = |token: Value| {
        let admin = admin.clone();
        async move {
            let body =
                json!({"issuer": "default", "token": token, "reason": "fuzz", "force": true});
            admin.set_fence("p", &body).await
        }
    };
    let reply = set(json!(28.0)).await.expect(200);
    assert_eq!(
        reply.json["fence"],
        json!({"issuer": "default", "token": 28})
    );
    let reply = set(json!(9_007_199_254_740_992.0)).await.expect(200);
    assert_eq!(
        reply.json["fence"]["token"],
        json!(9_007_199_254_740_992_u64)
    );
    // Above 2^53 a double is not exact; a fraction is not a token; nor is a
    // negative number.
    for bad in [
        json!(18_014_398_509_481_988.0),
        json!(2.5),
        json!(-1.0),
        json!(9_223_372_036_854_775_808_u64),
    ] {
        set(bad.clone()).await.expect_error(400, "invalid_json");
    }
    assert_eq!(
        api.fence("p").await,
        json!({"issuer": "default", "token": 9_007_199_254_740_992_u64})
    );
}
