//! The HTTP contract, against a real PostgreSQL.

use crate::common::{gateway, keyed, outcomes, wait_statements_waiting_for_a_lock, Api, Reply};
use gateway::{FenceCheck, RunningGateway};
use rand::Rng;
use serde_json::{json, Value};

#[tokio::test]
async fn put_creates_with_201_then_updates_with_200_and_etag_follows_version() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;

    let created = api.put_fenced("home", "v1", 1).await.expect(201);
    assert_eq!(
        created.json,
        json!({"id": "home", "body": "v1", "version": 1, "fence": {"issuer": "default", "token": 1}})
    );
    assert_eq!(created.etag(), Some("\"1\""));

    let updated = api.put_fenced("home", "v2", 1).await.expect(200);
    assert_eq!(updated.json["version"], 2);
    assert_eq!(updated.etag(), Some("\"2\""));

    let read = api.get("home", &[]).await.expect(200);
    assert_eq!(read.json["body"], "v2");
    assert_eq!(read.etag(), Some("\"2\""));
}

#[tokio::test]
async fn missing_page_is_404_json() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.get("nobody-wrote-me", &[])
        .await
        .expect_error(404, "page_not_found");
}

#[tokio::test]
async fn fenced_read_raises_the_fence_so_the_older_holders_late_write_is_refused() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.put_fenced("doc", "from 30", 30).await.expect(201);

    // The new holder (34) reads; the old holder (33) wakes up and writes.
    let read = api.get("doc", &[("Fencing-Token", "34")]).await.expect(200);
    assert_eq!(read.json["fence"]["token"], 34);
    let late = api
        .put_fenced("doc", "from 33", 33)
        .await
        .expect_error(409, "stale_token");
    assert_eq!(late.json["offered_token"], 33);
    assert_eq!(late.json["current_token"], 34);

    api.put_fenced("doc", "from 34", 34).await.expect(200);
    let page = api.get("doc", &[]).await.expect(200);
    assert_eq!(page.json["body"], "from 34");
    assert_eq!(page.json["version"], 2);
}

#[tokio::test]
async fn fenced_read_of_a_page_never_written_records_its_fence() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    let read = api
        .get("fresh", &[("Fencing-Token", "34")])
        .await
        .expect_error(404, "page_not_found");
    assert_eq!(read.json["fence"]["token"], 34);

    api.put_fenced("fresh", "late", 33)
        .await
        .expect_error(409, "stale_token");
    api.get("fresh", &[])
        .await
        .expect_error(404, "page_not_found");
    api.put_fenced("fresh", "mine", 34).await.expect(201);
}

#[tokio::test]
async fn equal_token_is_accepted_and_an_older_one_changes_nothing() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.put_fenced("p", "a", 7).await.expect(201);
    api.put_fenced("p", "b", 7).await.expect(200);
    api.put_fenced("p", "c", 6)
        .await
        .expect_error(409, "stale_token");
    api.get("p", &[("Fencing-Token", "5")])
        .await
        .expect_error(409, "stale_token");

    let page = api.get("p", &[]).await.expect(200);
    assert_eq!(
        page.json,
        json!({"id": "p", "body": "b", "version": 2, "fence": {"issuer": "default", "token": 7}})
    );
    assert_eq!(
        outcomes(&api.history("p").await),
        ["stale_token", "stale_token", "accepted", "accepted"]
    );
}

#[tokio::test]
async fn tokens_of_another_issuer_are_refused_with_issuer_mismatch() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.put_issued("p", "a", 5, "redis:main").await.expect(201);
    let r = api
        .put_issued("p", "b", 500, "zookeeper")
        .await
        .expect_error(409, "issuer_mismatch");
    assert_eq!(r.json["current_issuer"], "redis:main");
    assert_eq!(r.json["offered_issuer"], "zookeeper");
    api.get("p", &[("Fencing-Token", "500")])
        .await
        .expect_error(409, "issuer_mismatch");
    assert_eq!(api.get("p", &[]).await.expect(200).json["version"], 1);
}

#[tokio::test]
async fn if_match_on_another_version_is_412_and_on_the_current_one_writes() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.put("p", "a", &[("Fencing-Token", "1"), ("If-Match", "\"1\"")])
        .await
        .expect_error(412, "version_mismatch");
    let created = api.put_fenced("p", "a", 1).await.expect(201);
    let etag = created.etag().unwrap().to_owned();

    let r = api
        .put("p", "b", &[("Fencing-Token", "1"), ("If-Match", "\"7\"")])
        .await
        .expect_error(412, "version_mismatch");
    assert_eq!(r.json["expected_version"], 7);
    assert_eq!(r.json["current_version"], 1);

    api.put("p", "b", &[("Fencing-Token", "1"), ("If-Match", &etag)])
        .await
        .expect(200);
    assert_eq!(api.get("p", &[]).await.json["body"], "b");
}

#[tokio::test]
async fn write_without_token_is_428_when_fencing_is_enforced() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.put("p", "a", &[])
        .await
        .expect_error(428, "fencing_token_required");
    api.get("p", &[]).await.expect_error(404, "page_not_found");
}

#[tokio::test]
async fn every_bad_input_gets_its_status_and_json_code_and_writes_nothing() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.put_fenced("p", "original", 5).await.expect(201);
    let page_url = api.url("/pages/p");
    let put = || api.http.put(&page_url).header("Fencing-Token", "9");
    let json_put = |v: Value| put().json(&v);
    let with_token = |token: &str| {
        api.http
            .put(&page_url)
            .header("Fencing-Token", token)
            .json(&json!({"body": "x"}))
    };
    let with_id = |id: &str| {
        api.http
            .put(api.url(&format!("/pages/{id}")))
            .header("Fencing-Token", "9")
            .json(&json!({"body": "x"}))
    };

    let cases: Vec<(&str, reqwest::RequestBuilder, u16, &str)> = vec![
        (
            "token not a number",
            with_token("abc"),
            400,
            "invalid_fencing_token",
        ),
        (
            "two tokens",
            json_put(json!({"body": "x"})).header("Fencing-Token", "10"),
            400,
            "invalid_fencing_token",
        ),
        (
            "negative token",
            with_token("-1"),
            400,
            "invalid_fencing_token",
        ),
        (
            "token over i64::MAX",
            with_token("9223372036854775808"),
            400,
            "invalid_fencing_token",
        ),
        (
            "fractional token",
            with_token("1.5"),
            400,
            "invalid_fencing_token",
        ),
        ("empty token", with_token(""), 400, "invalid_fencing_token"),
        (
            "upper-case issuer",
            json_put(json!({"body": "x"})).header("Fencing-Issuer", "Redis"),
            400,
            "invalid_fencing_issuer",
        ),
        (
            "issuer of 65 chars",
            json_put(json!({"body": "x"})).header("Fencing-Issuer", "a".repeat(65)),
            400,
            "invalid_fencing_issuer",
        ),
        (
            "bad If-Match",
            json_put(json!({"body": "x"})).header("If-Match", "\"one\""),
            400,
            "invalid_if_match",
        ),
        ("page id with a dot", with_id("a.b"), 400, "invalid_page_id"),
        (
            "page id of 129 chars",
            with_id(&"a".repeat(129)),
            400,
            "invalid_page_id",
        ),
        (
            "page id with an escaped space",
            with_id("a%20b"),
            400,
            "invalid_page_id",
        ),
        (
            "malformed JSON",
            put()
                .header("content-type", "application/json")
                .body("{\"body\": "),
            400,
            "invalid_json",
        ),
        (
            "body field missing",
            json_put(json!({"text": "x"})),
            400,
            "invalid_json",
        ),
        (
            "body not a string",
            json_put(json!({"body": 3})),
            400,
            "invalid_json",
        ),
        (
            "NUL in body",
            json_put(json!({"body": "a\u{0}b"})),
            400,
            "invalid_body",
        ),
        (
            "text/plain body",
            put()
                .header("content-type", "text/plain")
                .body("{\"body\":\"x\"}"),
            415,
            "unsupported_media_type",
        ),
        (
            "no content type",
            put().body("{\"body\":\"x\"}"),
            415,
            "unsupported_media_type",
        ),
        (
            "body over 1 MiB",
            json_put(json!({"body": "x".repeat(1024 * 1024)})),
            413,
            "body_too_large",
        ),
        (
            "history limit not a number",
            api.http.get(api.url("/pages/p/history?limit=lots")),
            400,
            "invalid_query",
        ),
        (
            "history limit zero",
            api.http.get(api.url("/pages/p/history?limit=0")),
            400,
            "invalid_limit",
        ),
        (
            "history limit over the maximum",
            api.http.get(api.url("/pages/p/history?limit=1001")),
            400,
            "invalid_limit",
        ),
        (
            "history before zero",
            api.http.get(api.url("/pages/p/history?before=0")),
            400,
            "invalid_query",
        ),
        (
            "list limit over the maximum",
            api.http.get(api.url("/pages?limit=1001")),
            400,
            "invalid_limit",
        ),
        (
            "list after an invalid page id",
            api.http.get(api.url("/pages?after=a%20b")),
            400,
            "invalid_page_id",
        ),
        (
            "unknown route",
            api.http.get(api.url("/nowhere")),
            404,
            "not_found",
        ),
        (
            "method not allowed",
            api.http.delete(&page_url),
            405,
            "method_not_allowed",
        ),
    ];
    for (what, req, status, code) in cases {
        let reply = api.send(req).await;
        assert_eq!(reply.status.as_u16(), status, "{what}: {}", reply.json);
        assert_eq!(reply.error(), code, "{what}: {}", reply.json);
    }

    let page = api.get("p", &[]).await.expect(200);
    assert_eq!(
        page.json,
        json!({"id": "p", "body": "original", "version": 1, "fence": {"issuer": "default", "token": 5}})
    );
    assert_eq!(api.history("p").await.len(), 1, "bad input left history");
    let list = api.get_path("/pages").await.expect(200);
    assert_eq!(list.json["pages"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn history_lists_every_attempt_newest_first_with_its_details() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    // The key's client is the history's client_id; Client-Id may repeat it
    // or be left out.
    api.as_client("worker-1")
        .put_with_client_id("p", "a", 3, "worker-1")
        .await
        .expect(201);
    api.as_client("worker-2")
        .put("p", "b", &[("Fencing-Token", "2")])
        .await
        .expect(409);
    api.as_client("worker-3")
        .get("p", &[("Fencing-Token", "4")])
        .await
        .expect(200);

    let history = api.history("p").await;
    assert_eq!(history.len(), 3);
    let summary: Vec<_> = history
        .iter()
        .map(|h| {
            (
                h["method"].clone(),
                h["outcome"].clone(),
                h["token"].clone(),
                h["client_id"].clone(),
                h["version"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                json!("GET"),
                json!("accepted"),
                json!(4),
                json!("worker-3"),
                json!(1)
            ),
            (
                json!("PUT"),
                json!("stale_token"),
                json!(2),
                json!("worker-2"),
                json!(1)
            ),
            (
                json!("PUT"),
                json!("accepted"),
                json!(3),
                json!("worker-1"),
                json!(1)
            ),
        ]
    );
    assert!(history[0]["seq"].as_i64() > history[1]["seq"].as_i64());
    assert!(history[0]["at"].is_string());

    let limited = api.get_path("/pages/p/history?limit=1").await.expect(200);
    assert_eq!(limited.json["history"].as_array().unwrap().len(), 1);
}

/// The next page's URL, from `Link: <URL>; rel="next"`.
fn next_link(reply: &Reply) -> Option<String> {
    let link = reply.headers.get("link")?.to_str().unwrap();
    let url = link.strip_prefix('<')?.split_once(">; rel=\"next\"")?.0;
    Some(url.to_owned())
}

/// The lists are answered a page at a time: a default of 100, at most 1000,
/// and a `Link` to the next page while a page is full; following the links
/// gives every item once, in order.
#[tokio::test]
async fn lists_and_history_come_a_page_at_a_time_with_a_link_to_the_next() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    for i in 0..5 {
        api.put_fenced(&format!("p{i}"), "x", 1).await.expect(201);
    }
    for t in 2..=7 {
        api.put_fenced("p0", "x", t).await.expect(200);
    }

    let mut ids = Vec::new();
    let mut path = "/pages?limit=2".to_owned();
    loop {
        let reply = api.get_path(&path).await.expect(200);
        for p in reply.json["pages"].as_array().unwrap() {
            ids.push(p["id"].as_str().unwrap().to_owned());
        }
        match next_link(&reply) {
            Some(next) => path = next,
            None => break,
        }
    }
    assert_eq!(ids, ["p0", "p1", "p2", "p3", "p4"]);
    let all = api.get_path("/pages").await.expect(200);
    assert_eq!(all.json["pages"].as_array().unwrap().len(), 5);
    assert!(
        next_link(&all).is_none(),
        "a page that is not full has no next"
    );

    let mut seqs = Vec::new();
    let mut path = "/pages/p0/history?limit=3".to_owned();
    let mut pages = 0;
    loop {
        let reply = api.get_path(&path).await.expect(200);
        pages += 1;
        for h in reply.json["history"].as_array().unwrap() {
            seqs.push(h["seq"].as_i64().unwrap());
        }
        match next_link(&reply) {
            Some(next) => path = next,
            None => break,
        }
    }
    assert_eq!(seqs.len(), 7, "every attempt once: {seqs:?}");
    assert!(
        seqs.windows(2).all(|w| w[0] > w[1]),
        "newest first: {seqs:?}"
    );
    // 3 + 3 + 1; a last page that happens to be full is followed by an empty one.
    assert_eq!(pages, 3);
}

#[tokio::test]
async fn list_health_readiness_and_metrics_answer() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.put_fenced("b", "x", 2).await.expect(201);
    api.put_fenced("a", "x", 1).await.expect(201);
    api.put_fenced("a", "x", 0).await.expect(409);

    let list = api.get_path("/pages").await.expect(200);
    assert_eq!(
        list.json["pages"],
        json!([
            {"id": "a", "version": 1, "fence": {"issuer": "default", "token": 1}},
            {"id": "b", "version": 1, "fence": {"issuer": "default", "token": 2}},
        ])
    );
    api.get_path("/healthz").await.expect(200);
    api.get_path("/readyz").await.expect(200);

    let metrics = api
        .http
        .get(api.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"gateway_requests_total{method="PUT",outcome="accepted"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"gateway_requests_total{method="PUT",outcome="stale_token"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains("gateway_request_duration_seconds_bucket"));
}

/// Two gateways on one fresh database, each with its own pool: the only
/// state they share is PostgreSQL. Their [`Api`]s write as `tester`.
async fn two_gateways() -> (String, [RunningGateway; 2], [Api; 2]) {
    let url = harness::fresh_database().await;
    let spawn = || gateway::spawn_with_options(&url, keyed(FenceCheck::Enforce));
    let gws = [spawn().await.unwrap(), spawn().await.unwrap()];
    let apis = [0, 1].map(|i| Api::new(gws[i].url()).as_client("tester"));
    (url, gws, apis)
}

/// One client request in the concurrency test, and what came back.
struct Attempt {
    write: bool,
    token: i64,
    reply: Reply,
}

#[tokio::test]
async fn two_gateways_under_concurrent_random_tokens_never_accept_a_decreasing_token() {
    let (_, gws, apis) = two_gateways().await;

    let mut tasks = Vec::new();
    for client in 0..16 {
        let api = apis[client % 2].clone();
        tasks.push(tokio::spawn(async move {
            let mut attempts = Vec::new();
            for i in 0..30 {
                let (token, write) = {
                    let mut rng = rand::rng();
                    (rng.random_range(1..=40_i64), rng.random_bool(0.7))
                };
                let t = token.to_string();
                let reply = if write {
                    api.put(
                        "hot",
                        &format!("client {client} op {i} token {token}"),
                        &[("Fencing-Token", &t)],
                    )
                    .await
                } else {
                    api.get("hot", &[("Fencing-Token", &t)]).await
                };
                attempts.push(Attempt {
                    write,
                    token,
                    reply,
                });
            }
            attempts
        }));
    }
    let mut attempts = Vec::new();
    for t in tasks {
        attempts.extend(t.await.unwrap());
    }

    // What the clients saw.
    let mut accepted = 0;
    let mut max_accepted = 0;
    for a in &attempts {
        let json = &a.reply.json;
        match a.reply.status.as_u16() {
            200 | 201 => {
                accepted += 1;
                max_accepted = max_accepted.max(a.token);
            }
            404 => {
                assert!(!a.write, "a write got 404: {json}");
                accepted += 1; // fenced read of an unwritten page: its fence counts
                max_accepted = max_accepted.max(a.token);
            }
            409 => {
                assert_eq!(json["error"], "stale_token", "{json}");
                assert!(json["current_token"].as_i64().unwrap() > a.token, "{json}");
            }
            s => panic!("unexpected {s}: {json}"),
        }
    }

    // What the database committed, in commit order.
    let mut history = apis[0].history("hot").await;
    history.reverse();
    assert_eq!(history.len(), attempts.len(), "one history row per attempt");
    let (mut fence, mut version, mut accepted_in_history) = (0_i64, 0_i64, 0);
    for h in &history {
        let token = h["token"].as_i64().unwrap();
        let after_fence = h["fence_token"].as_i64().unwrap_or(0);
        let after_version = h["version"].as_i64().unwrap();
        match h["outcome"].as_str().unwrap() {
            "accepted" => {
                assert!(
                    token >= fence,
                    "accepted token {token} below fence {fence}: {h}"
                );
                accepted_in_history += 1;
                fence = token;
                if h["method"] == "PUT" {
                    version += 1;
                }
            }
            "stale_token" => assert!(
                token < fence,
                "rejected token {token} not below fence {fence}: {h}"
            ),
            other => panic!("unexpected outcome {other}: {h}"),
        }
        assert_eq!(
            (after_fence, after_version),
            (fence, version),
            "state after {h}"
        );
    }
    assert_eq!(accepted_in_history, accepted);

    let page = apis[1].get("hot", &[]).await.expect(200);
    assert_eq!(page.json["fence"]["token"], max_accepted);
    assert_eq!(page.json["version"], version);
    // The body is the one written by the write that produced the final version.
    let last_write = attempts
        .iter()
        .find(|a| a.write && a.reply.status.is_success() && a.reply.json["version"] == version)
        .expect("the final version's write");
    assert_eq!(page.json["body"], last_write.reply.json["body"]);

    for gw in gws {
        gw.shutdown().await.unwrap();
    }
}

/// The insert path's race. Two first writers of a page, on two
/// gateways, both find no row (a transaction holding an uncommitted insert
/// of the page makes them queue on its primary key, then rolls back), so
/// both take the insert path at once: exactly one creates the page (201),
/// the other goes back to the locked statement and is decided on the
/// winner's row (200, or 409 if its token is the lower one), and the history
/// has one row per attempt, in commit order.
#[tokio::test]
async fn two_first_writers_race_on_the_insert_path_and_exactly_one_creates_the_page() {
    use sqlx::Connection;
    let (url, gws, apis) = two_gateways().await;

    let mut blocker = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("begin").execute(&mut blocker).await.unwrap();
    sqlx::query("insert into pages (id) values ('race')")
        .execute(&mut blocker)
        .await
        .unwrap();
    let writers: Vec<_> = [(0, 5_u64), (1, 7_u64)]
        .into_iter()
        .map(|(i, token)| {
            let api = apis[i].clone();
            tokio::spawn(async move {
                let r = api
                    .put_fenced("race", &format!("from {token}"), token)
                    .await;
                (token, r.status.as_u16(), r.json)
            })
        })
        .collect();
    // Both wait on the uncommitted row's key: both took the insert path.
    wait_statements_waiting_for_a_lock(&url, 2).await;
    sqlx::query("rollback").execute(&mut blocker).await.unwrap();

    let mut results = Vec::new();
    for w in writers {
        results.push(w.await.unwrap());
    }
    let created: Vec<_> = results.iter().filter(|r| r.1 == 201).collect();
    assert_eq!(created.len(), 1, "exactly one creator: {results:?}");
    let (winner, _, _) = created[0];
    let (loser, status, json) = results.iter().find(|r| r.1 != 201).unwrap();
    if loser > winner {
        assert_eq!(*status, 200, "{json}");
        assert_eq!(json["version"], 2, "{json}");
    } else {
        assert_eq!(*status, 409, "{json}");
        assert_eq!(json["error"], "stale_token", "{json}");
    }

    let history = apis[0].history("race").await;
    let rows: Vec<_> = history
        .iter()
        .rev()
        .map(|h| {
            (
                h["token"].as_u64().unwrap(),
                h["outcome"].as_str().unwrap().to_owned(),
                h["version"].as_i64().unwrap(),
            )
        })
        .collect();
    let loser_outcome = if loser > winner {
        "accepted"
    } else {
        "stale_token"
    };
    let loser_version = if loser > winner { 2 } else { 1 };
    assert_eq!(
        rows,
        [
            (*winner, "accepted".to_owned(), 1),
            (*loser, loser_outcome.to_owned(), loser_version)
        ]
    );
    let page = apis[1].get("race", &[]).await.expect(200);
    assert_eq!(page.json["fence"]["token"], 7);
    for gw in gws {
        gw.shutdown().await.unwrap();
    }
}
