//! The dashboard's routes and its event stream, against a real PostgreSQL.
//! (What a browser makes of them: tests/tests/it/dashboard.rs.)

use std::time::Duration;

use crate::common::{gateway_with, key_of, keyed, Api};
use gateway::FenceCheck;
use serde_json::{json, Value};
use sqlx::Connection;

/// How long a test waits for one stream message before it fails.
const WAIT: Duration = Duration::from_secs(10);

/// A `text/event-stream` response, read message by message.
struct Events {
    response: reqwest::Response,
    buffer: String,
    /// The chosen page as the messages so far describe it (an update leaves
    /// out a body that did not change).
    page: Value,
}

impl Events {
    /// Open a stream and read its first message, the snapshot.
    async fn open(api: &Api, query: &str) -> (Events, Value) {
        let response = api
            .http
            .get(api.url(&format!("/dashboard/events{query}")))
            .timeout(Duration::from_secs(600))
            .send()
            .await
            .expect("stream request");
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        let mut events = Events {
            response,
            buffer: String::new(),
            page: Value::Null,
        };
        let snapshot = events.expect("snapshot").await;
        (events, snapshot)
    }

    /// The next message with a name (comments are keep-alives), as
    /// (name, parsed data).
    async fn next(&mut self) -> (String, Value) {
        // One deadline for the message: keep-alive comments do not extend it.
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let message: String = self.buffer.drain(..end + 2).collect();
                let (mut name, mut data) = (String::new(), String::new());
                for line in message.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if name.is_empty() {
                    continue;
                }
                let data: Value = serde_json::from_str(&data).unwrap_or(Value::String(data));
                if let (Some(page), Value::Object(known)) =
                    (data["page"].as_object(), &mut self.page)
                {
                    known.extend(page.clone());
                } else if data["page"].is_object() {
                    self.page = data["page"].clone();
                }
                return (name, data);
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .unwrap_or_else(|_| panic!("no stream message within {WAIT:?}"))
                .expect("stream read")
                .expect("the stream ended");
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    async fn expect(&mut self, name: &str) -> Value {
        let (got, data) = self.next().await;
        assert_eq!(got, name, "message data: {data}");
        data
    }

    /// Updates until one brings attempts of the chosen page: those attempts
    /// and the last update.
    async fn attempts(&mut self) -> (Vec<Value>, Value) {
        self.until(|a| !a.is_empty()).await
    }

    /// Updates until `done` holds for the attempts gathered so far; returns
    /// those attempts and the last update.
    async fn until(&mut self, done: impl Fn(&[Value]) -> bool) -> (Vec<Value>, Value) {
        let mut attempts = Vec::new();
        loop {
            let update = self.expect("update").await;
            attempts.extend(update["attempts"].as_array().unwrap().iter().cloned());
            if done(&attempts) {
                return (attempts, update);
            }
        }
    }
}

/// Assert the attempts, oldest first, as (method, outcome, token, client).
#[track_caller]
fn assert_attempts(attempts: &[Value], expected: &[(&str, &str, u64, &str)]) {
    let expected: Vec<_> = expected
        .iter()
        .map(|(m, o, t, c)| (m.to_string(), o.to_string(), json!(t), json!(c)))
        .collect();
    assert_eq!(summary(attempts), expected);
}

fn summary(attempts: &[Value]) -> Vec<(String, String, Value, Value)> {
    attempts
        .iter()
        .map(|a| {
            (
                a["method"].as_str().unwrap().to_owned(),
                a["outcome"].as_str().unwrap().to_owned(),
                a["token"].clone(),
                a["client_id"].clone(),
            )
        })
        .collect()
}

fn counters(pages: &Value, id: &str) -> Value {
    let page = pages
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .unwrap_or_else(|| panic!("no page {id} in {pages}"))
        .clone();
    json!([
        page["writes"],
        page["reads"],
        page["refused"],
        page["lost_updates"]
    ])
}

fn token(t: u64, client: &str) -> Vec<(&'static str, String)> {
    vec![
        ("Fencing-Token", t.to_string()),
        ("Client-Id", client.into()),
    ]
}

/// The lanes of these tests: each client has its own key on the test gateway.
const LANES: [&str; 5] = ["a", "b", "alice", "bob", "straggler"];

/// A keyed gateway that also knows the [`LANES`] clients.
async fn gateway(fencing: FenceCheck) -> (gateway::RunningGateway, Api, String) {
    let options = LANES
        .iter()
        .fold(keyed(fencing), |o, c| o.api_key(c, &key_of(c)));
    gateway_with(options).await
}

/// A keyed gateway whose page `p` was written once (token 1, client `a`),
/// and a dashboard stream on `p`, past its snapshot.
async fn watching_p() -> (gateway::RunningGateway, Api, String, Events) {
    let (gw, api, url) = gateway(FenceCheck::Enforce).await;
    put(&api, "p", "x", &token(1, "a"), 201).await;
    let (events, _) = Events::open(&api, "?page=p").await;
    (gw, api, url, events)
}

/// `api` as the client the `Client-Id` header names (its key authenticates it).
fn as_sender(api: &Api, headers: &[(&'static str, String)]) -> Api {
    match headers.iter().find(|(k, _)| *k == "Client-Id") {
        Some((_, client)) => api.as_client(client),
        None => api.clone(),
    }
}

async fn put(api: &Api, id: &str, body: &str, headers: &[(&'static str, String)], status: u16) {
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    as_sender(api, headers)
        .put(id, body, &h)
        .await
        .expect(status);
}

async fn get(api: &Api, id: &str, headers: &[(&'static str, String)], status: u16) {
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    as_sender(api, headers).get(id, &h).await.expect(status);
}

#[tokio::test]
async fn root_redirects_to_the_dashboard_whose_page_and_assets_come_from_the_binary() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let root = no_redirects.get(api.url("/")).send().await.unwrap();
    assert!(root.status().is_redirection(), "{}", root.status());
    assert_eq!(root.headers()["location"], "/dashboard");

    let page = api.http.get(api.url("/")).send().await.unwrap();
    assert_eq!(page.url().path(), "/dashboard");
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"<script src="dashboard/dashboard.js" defer>"#));
    assert!(html.contains(r#"href="dashboard/dashboard.css""#));
    for external in [
        "src=\"http",
        "href=\"http",
        "src=\"//",
        "href=\"//",
        "@import",
    ] {
        assert!(!html.contains(external), "the page loads {external}…");
    }

    for (path, content_type, needle) in [
        (
            "/dashboard/dashboard.js",
            "text/javascript; charset=utf-8",
            "new EventSource(",
        ),
        (
            "/dashboard/dashboard.css",
            "text/css; charset=utf-8",
            "#timeline",
        ),
    ] {
        let r = api.http.get(api.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["content-type"], content_type, "{path}");
        let text = r.text().await.unwrap();
        assert!(text.contains(needle), "{path} lacks {needle}");
        assert!(
            !text.contains("https://"),
            "{path} fetches from the network"
        );
    }
}

#[tokio::test]
async fn an_invalid_page_is_a_400_json_error_not_a_stream() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    api.get_path("/dashboard/events?page=no%20spaces")
        .await
        .expect_error(400, "invalid_page_id");
    api.get_path("/dashboard/events?pgae=demo")
        .await
        .expect_error(400, "invalid_query");
}

#[tokio::test]
async fn snapshot_then_live_updates_show_grants_reads_writes_and_refusals_as_they_commit() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    put(&api, "doc", "by alice", &token(33, "alice"), 201).await;

    let (mut events, snapshot) = Events::open(&api, "?page=doc").await;
    assert_eq!(snapshot["fencing"], "enforce");
    assert_eq!(
        snapshot["page"],
        json!({"id": "doc", "body": "by alice", "version": 1, "fence": {"issuer": "default", "token": 33}})
    );
    let attempts = snapshot["attempts"].as_array().unwrap();
    assert_attempts(attempts, &[("PUT", "accepted", 33, "alice")]);
    assert_eq!(counters(&snapshot["pages"], "doc"), json!([1, 0, 0, 0]));

    // Bob is granted 34, reads and writes.
    get(&api, "doc", &token(34, "bob"), 200).await;
    put(&api, "doc", "by bob", &token(34, "bob"), 200).await;
    let (bobs, _) = events.until(|a| a.len() >= 2).await;
    assert_attempts(
        &bobs,
        &[
            ("GET", "accepted", 34, "bob"),
            ("PUT", "accepted", 34, "bob"),
        ],
    );
    assert_eq!(
        events.page,
        json!({"id": "doc", "body": "by bob", "version": 2, "fence": {"issuer": "default", "token": 34}})
    );

    // Alice's late write is refused: on the timeline, and nothing changed.
    api.as_client("alice")
        .put_with_client_id("doc", "late", 33, "alice")
        .await
        .expect_error(409, "stale_token");
    let (attempts, last) = events.attempts().await;
    assert_attempts(&attempts, &[("PUT", "stale_token", 33, "alice")]);
    let refused = &attempts[0];
    assert_eq!(refused["fence_token"], 34);
    assert_eq!(refused["version"], 2);
    assert!(refused["seq"].as_i64() > bobs[1]["seq"].as_i64());
    assert!(refused["at"].is_string());
    assert_eq!(
        last["page"],
        json!({"id": "doc", "version": 2, "fence": {"issuer": "default", "token": 34}}),
        "same version: the body is not sent again"
    );
    assert_eq!(events.page["body"], "by bob");
    assert_eq!(counters(&last["pages"], "doc"), json!([2, 1, 1, 0]));
}

#[tokio::test]
async fn attempts_on_another_page_update_its_counters_but_not_the_chosen_pages_timeline() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    put(&api, "chosen", "x", &token(1, "a"), 201).await;
    let (mut events, _) = Events::open(&api, "?page=chosen").await;

    put(&api, "other", "y", &token(5, "b"), 201).await;
    put(&api, "other", "z", &token(4, "b"), 409).await;
    let mut pages = Vec::new();
    let update = loop {
        let update = events.expect("update").await;
        assert_eq!(update["attempts"], json!([]), "{update}");
        assert_eq!(update["page"], Value::Null);
        pages.extend(update["pages"].as_array().unwrap().iter().cloned());
        if pages
            .iter()
            .any(|p| p["id"] == "other" && p["refused"] == 1)
        {
            break update;
        }
    };
    assert_eq!(counters(&update["pages"], "other"), json!([1, 0, 1, 0]));
}

#[tokio::test]
async fn without_a_page_the_stream_follows_the_page_accessed_last_and_an_empty_database_has_none() {
    let (_gw, api, _) = gateway(FenceCheck::Enforce).await;
    let (_empty, snapshot) = Events::open(&api, "").await;
    assert_eq!(snapshot["pages"], json!([]));
    assert_eq!(snapshot["page"], Value::Null);
    assert_eq!(snapshot["attempts"], json!([]));

    put(&api, "first", "x", &token(1, "a"), 201).await;
    put(&api, "second", "y", &token(1, "a"), 201).await;
    put(&api, "first", "z", &token(2, "a"), 200).await;
    let (_events, snapshot) = Events::open(&api, "").await;
    assert_eq!(snapshot["page"]["id"], "first");
    assert_eq!(snapshot["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(
        snapshot["pages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["first", "second"]
    );
}

#[tokio::test]
async fn with_fencing_off_a_stale_write_lands_and_is_counted_as_a_lost_update() {
    // The fence is the fenced gateway's; the unfenced one, on the same
    // database, writes under it without moving it.
    let (_fenced, fenced, url) = gateway(FenceCheck::Enforce).await;
    put(&fenced, "p", "new holder", &token(34, "bob"), 201).await;
    let options = LANES
        .iter()
        .fold(keyed(FenceCheck::Off), |o, c| o.api_key(c, &key_of(c)));
    let unfenced = gateway::spawn_with_options(&url, options).await.unwrap();
    let api = Api::new(unfenced.url()).as_client("tester");
    let (mut events, snapshot) = Events::open(&api, "?page=p").await;
    assert_eq!(snapshot["fencing"], "off");

    put(&api, "p", "old holder", &token(33, "alice"), 200).await;
    let (attempts, last) = events.attempts().await;
    assert_attempts(&attempts, &[("PUT", "stale", 33, "alice")]);
    assert_eq!(events.page["body"], "old holder", "bob's edit is gone");
    assert_eq!(counters(&last["pages"], "p"), json!([2, 0, 0, 1]));
}

#[tokio::test]
async fn a_dashboard_on_one_gateway_shows_the_attempts_made_through_another() {
    let url = harness::fresh_database().await;
    let fenced = gateway::spawn(&url, FenceCheck::Enforce).await.unwrap();
    let unfenced = gateway::spawn(&url, FenceCheck::Off).await.unwrap();
    let (watch, other) = (Api::new(fenced.url()), Api::new(unfenced.url()));
    put(&watch, "demo", "a", &token(10, "w1"), 201).await;
    let (mut events, _) = Events::open(&watch, "?page=demo").await;

    put(&other, "demo", "late", &token(9, "straggler"), 200).await;
    let (attempts, _) = events.attempts().await;
    assert_attempts(&attempts, &[("PUT", "stale", 9, "straggler")]);
}

/// History ids are taken at insert and become visible at commit, so a row can
/// appear below ids the stream has already passed. Hold one uncommitted, let
/// a later one commit, then commit the first: both arrive, once each.
#[tokio::test]
async fn a_row_that_commits_after_a_higher_id_is_not_missed() {
    let (_gw, api, url, mut events) = watching_p().await;

    let mut slow = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("begin").execute(&mut slow).await.unwrap();
    let held: i64 = sqlx::query_scalar(
        "insert into page_history (page_id, method, outcome, token, issuer, client_id, version, fence_token)
         values ('p', 'PUT', 'some_new_refusal', 1, 'default', 'slow', 1, 1) returning id",
    )
    .fetch_one(&mut slow)
    .await
    .unwrap();

    put(&api, "q", "y", &token(1, "b"), 201).await;
    let later = events.expect("update").await;
    assert_eq!(counters(&later["pages"], "q"), json!([1, 0, 0, 0]));
    assert_eq!(later["attempts"], json!([]));

    sqlx::query("commit").execute(&mut slow).await.unwrap();
    let (attempts, update) = events.attempts().await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["seq"], held);
    assert_eq!(attempts[0]["outcome"], "some_new_refusal");
    assert_eq!(counters(&update["pages"], "p"), json!([1, 0, 1, 0]));

    // And nothing is sent twice: the next update holds only the next attempt.
    put(&api, "p", "z", &token(2, "a"), 200).await;
    let (attempts, _) = events.attempts().await;
    assert_attempts(&attempts, &[("PUT", "accepted", 2, "a")]);
}

/// An event stream never ends by itself, and a graceful shutdown waits for
/// every response: the streams must end when the gateway starts draining.
#[tokio::test]
async fn an_open_dashboard_does_not_hold_up_a_graceful_shutdown() {
    let (gw, _api, _, mut events) = watching_p().await;

    tokio::time::timeout(Duration::from_secs(5), gw.shutdown())
        .await
        .expect("the gateway drained within 5 s with a dashboard open")
        .expect("clean shutdown");
    let end = tokio::time::timeout(WAIT, events.response.chunk()).await;
    assert!(
        matches!(end, Ok(Ok(None))),
        "the stream ended cleanly: {end:?}"
    );
}

/// A stream polls only while someone watches: once the browser has gone, the
/// tail query stops (at the latest at the next keep-alive, which fails).
#[tokio::test]
async fn the_polling_stops_when_the_dashboard_disconnects() {
    let (_gw, api, url) = gateway(FenceCheck::Enforce).await;
    put(&api, "p", "x", &token(1, "a"), 201).await;
    let mut observer = sqlx::PgConnection::connect(&url).await.unwrap();
    let polled_within = |ms: i64| {
        format!(
            "select count(*) from pg_stat_activity
             where datname = current_database() and pid <> pg_backend_pid()
               and query like '%union all%page_history%'
               and state_change > now() - interval '{ms} milliseconds'"
        )
    };

    let (events, _) = Events::open(&api, "?page=p").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let n: i64 = sqlx::query_scalar(&polled_within(500))
            .fetch_one(&mut observer)
            .await
            .unwrap();
        if n > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the open stream never polled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    drop(events);
    let gone = tokio::time::Instant::now();
    let deadline = gone + gateway::dashboard::KEEP_ALIVE + WAIT;
    loop {
        // No poll in the last second (four poll intervals).
        let n: i64 = sqlx::query_scalar(&polled_within(1000))
            .fetch_one(&mut observer)
            .await
            .unwrap();
        if n == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream still polls {:?} after the client left",
            gone.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("polling stopped within {:?}", gone.elapsed());
}
