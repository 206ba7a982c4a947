//! The `worker` binary end to end: real lock services, a real gateway on a real
//! PostgreSQL, and worker processes whose JSONL events the tests follow.
//!
//! Trust is on as in the demo: the gateway requires API keys (one per client
//! in [`CLIENTS`]; each worker sends its own) and, with its fence on, checks
//! tokens with the lock service the workers use (unless a test says
//! otherwise). The last tests give a worker the wrong key, the wrong client
//! id, an untrusted or unreachable issuer, and check what it does.
//!
//! Build the binaries first (`cargo build --workspace --bins`; `scripts/test`
//! does it): the tests spawn `target/<profile>/worker`.

use std::collections::HashMap;
use std::time::Duration;

use harness::worker_proc::{WorkerEvent, WorkerProcess};
use harness::{Redis, ZooKeeper};
use serde_json::Value;
use sqlx::Connection;

/// Edits per worker in the three-worker runs.
const K: u64 = 5;

/// A lock service running for one test, and the worker flags that reach it.
enum LockService {
    Redis(Redis),
    Redlock(Vec<Redis>),
    ZooKeeper(ZooKeeper),
    LeasePostgres(String),
    LeaseMysql(String),
}

impl LockService {
    async fn start(backend: &str) -> LockService {
        match backend {
            "redis" => LockService::Redis(Redis::start().await),
            "redlock" => {
                let (a, b, c) = tokio::join!(Redis::start(), Redis::start(), Redis::start());
                LockService::Redlock(vec![a, b, c])
            }
            "zookeeper" => LockService::ZooKeeper(ZooKeeper::start().await),
            "lease-postgres" => LockService::LeasePostgres(harness::fresh_database().await),
            "lease-mysql" => LockService::LeaseMysql(harness::fresh_mysql_database().await),
            other => panic!("unknown backend {other}"),
        }
    }

    /// The gateway's issuer for these locks: (Fencing-Issuer name, URL).
    fn issuer(&self) -> Option<(&'static str, String)> {
        match self {
            LockService::Redis(r) => Some(("redis", r.url())),
            LockService::Redlock(_) => None,
            LockService::ZooKeeper(zk) => {
                Some(("zookeeper", format!("zookeeper://{}", zk.connect_string())))
            }
            LockService::LeasePostgres(url) => Some(("lease-postgres", url.clone())),
            LockService::LeaseMysql(url) => Some(("lease-mysql", url.clone())),
        }
    }

    fn args(&self) -> Vec<String> {
        let (backend, flag, value) = match self {
            LockService::Redis(r) => ("redis", "--redis-url", r.url()),
            LockService::Redlock(nodes) => (
                "redlock",
                "--redlock-urls",
                nodes.iter().map(Redis::url).collect::<Vec<_>>().join(","),
            ),
            LockService::ZooKeeper(zk) => ("zookeeper", "--zookeeper-connect", zk.connect_string()),
            LockService::LeasePostgres(url) => ("lease-postgres", "--database-url", url.clone()),
            LockService::LeaseMysql(url) => ("lease-mysql", "--mysql-url", url.clone()),
        };
        vec!["--backend".into(), backend.into(), flag.into(), value]
    }
}

/// Every client the tests run: the gateway has a key for each.
const CLIENTS: &[&str] = &[
    "w1", "w2", "w3", "paused", "live", "w", "next", "before", "after",
];

/// A client's API key.
fn key_of(client: &str) -> String {
    format!("e2e-{client}-key-not-secret")
}

/// The gateway's options with every test client's key and, `issuer` given,
/// that lock service asked about every token.
fn keyed(fencing: gateway::FenceCheck, issuer: Option<(&str, String)>) -> gateway::GatewayOptions {
    let mut options = gateway::GatewayOptions::new(fencing);
    for client in CLIENTS {
        options = options.api_key(client, &key_of(client));
    }
    if let Some((name, url)) = issuer {
        options = options.issuer(name, &url);
    }
    options
}

async fn spawn_gateway(options: gateway::GatewayOptions) -> gateway::RunningGateway {
    let db = harness::fresh_database().await;
    gateway::spawn_with_options(&db, options)
        .await
        .expect("start the gateway in-process")
}

/// A gateway that requires the test clients' keys and, with the fence on,
/// checks tokens with `locks` (when they have tokens).
async fn start_gateway(
    fencing: gateway::FenceCheck,
    locks: &LockService,
) -> gateway::RunningGateway {
    let issuer = match fencing {
        gateway::FenceCheck::Enforce => locks.issuer(),
        gateway::FenceCheck::Off => None,
    };
    spawn_gateway(keyed(fencing, issuer)).await
}

/// Worker flags: the lock service's, the gateway, the page, the client id
/// and its key, and `extra`.
fn worker_args(
    locks: &LockService,
    gateway: &str,
    page: &str,
    client: &str,
    extra: &[&str],
) -> Vec<String> {
    let mut args = locks.args();
    args.extend(["--gateway", gateway, "--page", page, "--client-id", client].map(String::from));
    args.extend(["--api-key".to_string(), key_of(client)]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn spawn_worker(args: Vec<String>) -> WorkerProcess {
    WorkerProcess::spawn(args, std::iter::empty::<(&str, &str)>())
}

async fn get_json(url: &str) -> Value {
    let resp = reqwest::get(url).await.expect("GET the gateway");
    assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
    resp.json().await.expect("JSON from the gateway")
}

/// The page's body lines.
async fn page_lines(gateway: &str, page: &str) -> Vec<String> {
    let doc = get_json(&format!("{gateway}/pages/{page}")).await;
    doc["body"]
        .as_str()
        .expect("page body")
        .lines()
        .map(str::to_string)
        .collect()
}

/// The tokens of the page's accepted writes, in commit order (`null` when the
/// write carried none).
async fn accepted_write_tokens(gateway: &str, page: &str) -> Vec<Option<u64>> {
    let doc = get_json(&format!("{gateway}/pages/{page}/history?limit=10000")).await;
    let mut entries: Vec<&Value> = doc["history"]
        .as_array()
        .expect("history array")
        .iter()
        .filter(|e| e["method"] == "PUT" && e["outcome"] == "accepted")
        .collect();
    entries.sort_by_key(|e| e["seq"].as_i64());
    entries.iter().map(|e| e["token"].as_u64()).collect()
}

fn events_named<'a>(events: &'a [WorkerEvent], name: &str) -> Vec<&'a WorkerEvent> {
    events.iter().filter(|e| e["event"] == name).collect()
}

fn count(summary: &Value, field: &str) -> u64 {
    summary[field]
        .as_u64()
        .unwrap_or_else(|| panic!("summary field {field} missing: {summary}"))
}

#[track_caller]
fn assert_summary_adds_up(summary: &Value) {
    assert_eq!(
        count(summary, "attempted"),
        count(summary, "acknowledged")
            + count(summary, "rejected")
            + count(summary, "abandoned")
            + count(summary, "errors"),
        "attempted != acknowledged + rejected + abandoned + errors: {summary}"
    );
}

/// The token written into an edit line `<client> #<n> token=<t>`.
fn line_token(line: &str) -> Option<u64> {
    line.rsplit_once("token=").and_then(|(_, t)| t.parse().ok())
}

#[track_caller]
fn assert_non_decreasing(tokens: &[u64], what: &str) {
    for pair in tokens.windows(2) {
        assert!(
            pair[0] <= pair[1],
            "{what} decreased ({} then {}): {tokens:?}",
            pair[0],
            pair[1]
        );
    }
}

/// Three workers × K edits on one page. Checks that every acknowledged edit is
/// in the body exactly once and nothing else is, that accepted tokens never
/// decrease, and that each summary adds up.
async fn three_workers_edit_one_page(backend: &str, fencing: bool, extra: &[&str]) {
    let locks = LockService::start(backend).await;
    let gateway = start_gateway(
        if fencing {
            gateway::FenceCheck::Enforce
        } else {
            gateway::FenceCheck::Off
        },
        &locks,
    )
    .await;
    let url = gateway.url();
    let page = format!("e2e-{backend}");
    let fencing_flag = if fencing { "on" } else { "off" };
    let edits = K.to_string();
    let mut workers: Vec<WorkerProcess> = (1..=3)
        .map(|i| {
            spawn_worker(worker_args(
                &locks,
                &url,
                &page,
                &format!("w{i}"),
                &[
                    &[
                        "--edits",
                        &edits,
                        "--work-ms",
                        "20",
                        "--ttl",
                        "2s",
                        "--fencing",
                        fencing_flag,
                    ],
                    extra,
                ]
                .concat(),
            ))
        })
        .collect();

    let mut acknowledged_lines = Vec::new();
    let mut total_acknowledged = 0;
    for w in &mut workers {
        let (summary, status) = w.wait_summary().await;
        assert!(
            status.success(),
            "worker exited with {status}\n{}",
            w.log_tail(30)
        );
        assert_summary_adds_up(&summary);
        assert_eq!(count(&summary, "attempted"), K, "{summary}");
        assert_eq!(
            count(&summary, "errors"),
            0,
            "{summary}\n{}",
            w.log_tail(30)
        );
        let wrote = events_named(w.events(), "wrote");
        assert_eq!(wrote.len() as u64, count(&summary, "acknowledged"));
        total_acknowledged += count(&summary, "acknowledged");
        acknowledged_lines.extend(
            wrote
                .iter()
                .map(|e| e["line"].as_str().unwrap().to_string()),
        );
    }
    assert!(total_acknowledged > 0, "no edit was acknowledged at all");

    let body = page_lines(&url, &page).await;
    let mut in_body: HashMap<&str, usize> = HashMap::new();
    for line in &body {
        *in_body.entry(line.as_str()).or_default() += 1;
    }
    for line in &acknowledged_lines {
        assert_eq!(
            in_body.get(line.as_str()).copied().unwrap_or(0),
            1,
            "acknowledged edit {line:?} is not in the body exactly once; body:\n{}",
            body.join("\n")
        );
    }
    assert_eq!(
        body.len() as u64,
        total_acknowledged,
        "the body holds lines nobody had acknowledged:\n{}",
        body.join("\n")
    );

    // Commit order (the body's line order and the history) never goes back in tokens.
    let body_tokens: Vec<u64> = body.iter().filter_map(|l| line_token(l)).collect();
    assert_non_decreasing(&body_tokens, "tokens in the body's line order");
    let history = accepted_write_tokens(&url, &page).await;
    assert_eq!(
        history.len() as u64,
        total_acknowledged,
        "accepted writes in history"
    );
    if fencing {
        let tokens: Vec<u64> = history
            .iter()
            .map(|t| t.expect("a fenced write carries its token"))
            .collect();
        assert_non_decreasing(&tokens, "accepted tokens in the page's history");
    } else {
        assert!(
            history.iter().all(Option::is_none),
            "--fencing off must send no token: {history:?}"
        );
    }
}

#[tokio::test]
async fn three_redis_workers_keep_every_acknowledged_edit() {
    three_workers_edit_one_page("redis", true, &[]).await;
}

#[tokio::test]
async fn three_lease_postgres_workers_keep_every_acknowledged_edit() {
    three_workers_edit_one_page("lease-postgres", true, &[]).await;
}

#[tokio::test]
async fn three_lease_mysql_workers_keep_every_acknowledged_edit() {
    three_workers_edit_one_page("lease-mysql", true, &[]).await;
}

#[tokio::test]
async fn three_zookeeper_workers_keep_every_acknowledged_edit() {
    three_workers_edit_one_page("zookeeper", true, &[]).await;
}

#[tokio::test]
async fn three_redlock_workers_without_fencing_keep_every_acknowledged_edit() {
    three_workers_edit_one_page("redlock", false, &[]).await;
}

#[tokio::test]
async fn three_redis_workers_without_fencing_on_an_unfenced_gateway_keep_every_acknowledged_edit() {
    three_workers_edit_one_page("redis", false, &[]).await;
}

#[tokio::test]
async fn three_redis_workers_with_if_match_keep_every_acknowledged_edit() {
    three_workers_edit_one_page("redis", true, &["--if-match"]).await;
}

/// Wait until the kernel shows the worker stopped (it raised SIGSTOP itself).
async fn wait_stopped(w: &WorkerProcess) {
    harness::wait_until(Duration::from_secs(10), || async {
        if w.is_stopped() {
            Ok(())
        } else {
            Err(())
        }
    })
    .await
    .unwrap_or_else(|()| panic!("worker {} did not stop itself", w.pid()));
}

/// The core demo: a worker paused after its lost-lock check, just before its
/// PUT, sleeps past its TTL; another worker takes the lock and edits; the
/// paused one wakes and writes with its old token, and the gateway refuses
/// it: by its issuer check (`token_not_current`: the lock service names
/// another holder now) when it has one, else by its fence (`stale_token`).
async fn write_after_a_pause_at_writing_is_rejected(issuer_check: bool) {
    let locks = LockService::start("redis").await;
    let gateway = spawn_gateway(keyed(
        gateway::FenceCheck::Enforce,
        if issuer_check { locks.issuer() } else { None },
    ))
    .await;
    let url = gateway.url();
    let page = "pause-at-writing";

    let mut paused = spawn_worker(worker_args(
        &locks,
        &url,
        page,
        "paused",
        &[
            "--edits",
            "1",
            "--ttl",
            "500ms",
            "--work-ms",
            "10",
            "--stop-self-at",
            "writing",
        ],
    ));
    let writing = paused.wait_for_event("writing").await;
    let old_token = writing["token"].as_u64().expect("token in writing");
    wait_stopped(&paused).await;

    // Takes the lock once the paused worker's grant expires, and edits twice.
    let mut live = spawn_worker(worker_args(
        &locks,
        &url,
        page,
        "live",
        &["--edits", "2", "--ttl", "500ms", "--work-ms", "10"],
    ));
    let (live_summary, status) = live.wait_summary().await;
    assert!(status.success());
    assert_eq!(count(&live_summary, "acknowledged"), 2, "{live_summary}");

    paused.sigcont();
    let rejected = paused.wait_for_event("rejected").await;
    assert_eq!(rejected["status"], 409, "{rejected}");
    assert_eq!(rejected["during"], "write", "{rejected}");
    assert_eq!(rejected["token"].as_u64(), Some(old_token), "{rejected}");
    let message = rejected["message"].as_str().unwrap();
    if issuer_check {
        assert_eq!(rejected["error"], "token_not_current", "{rejected}");
        assert!(
            message.contains("lease was lost and the issuer check rejected the write"),
            "{rejected}"
        );
    } else {
        assert_eq!(rejected["error"], "stale_token", "{rejected}");
        assert!(
            rejected["current"].as_u64().expect("current fence") > old_token,
            "{rejected}"
        );
        assert!(
            message.contains("lease was lost and the fence rejected the write"),
            "{rejected}"
        );
    }
    let history = get_json(&format!("{url}/pages/{page}/history?limit=100")).await;
    let outcome = if issuer_check {
        "token_not_current"
    } else {
        "stale_token"
    };
    assert!(
        history["history"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["client_id"] == "paused" && e["method"] == "PUT" && e["outcome"] == outcome),
        "the refusal is in the history as {outcome}: {history}"
    );
    let (summary, status) = paused.wait_summary().await;
    assert!(status.success());
    assert_summary_adds_up(&summary);
    assert_eq!(count(&summary, "rejected"), 1, "{summary}");
    assert_eq!(count(&summary, "acknowledged"), 0, "{summary}");

    let body = page_lines(&url, page).await;
    let live_lines: Vec<String> = events_named(live.events(), "wrote")
        .iter()
        .map(|e| e["line"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        body, live_lines,
        "the live worker's edits survive, the stale one is not there"
    );
}

#[tokio::test]
async fn write_after_a_pause_at_writing_is_rejected_by_the_fence() {
    write_after_a_pause_at_writing_is_rejected(false).await;
}

#[tokio::test]
async fn write_after_a_pause_at_writing_is_rejected_by_the_issuer_check() {
    write_after_a_pause_at_writing_is_rejected(true).await;
}

/// The same pause without fencing: nothing stops the late write, and it
/// silently overwrites the edits the other worker had acknowledged. This is
/// the damage the fence exists to prevent.
#[tokio::test]
async fn without_fencing_a_write_after_a_pause_at_writing_loses_acknowledged_edits() {
    let locks = LockService::start("redis").await;
    let gateway = start_gateway(gateway::FenceCheck::Off, &locks).await;
    let url = gateway.url();
    let page = "pause-at-writing-unfenced";
    let unfenced = ["--ttl", "500ms", "--work-ms", "10", "--fencing", "off"];

    let mut paused = spawn_worker(worker_args(
        &locks,
        &url,
        page,
        "paused",
        &[
            &unfenced[..],
            &["--edits", "1", "--stop-self-at", "writing"],
        ]
        .concat(),
    ));
    let writing = paused.wait_for_event("writing").await;
    assert_eq!(writing["fenced"], false, "{writing}");
    wait_stopped(&paused).await;

    let mut live = spawn_worker(worker_args(
        &locks,
        &url,
        page,
        "live",
        &[&unfenced[..], &["--edits", "2"]].concat(),
    ));
    let (live_summary, _) = live.wait_summary().await;
    assert_eq!(count(&live_summary, "acknowledged"), 2, "{live_summary}");
    assert_eq!(page_lines(&url, page).await.len(), 2);

    paused.sigcont();
    let wrote = paused.wait_for_event("wrote").await;
    let (summary, status) = paused.wait_summary().await;
    assert!(status.success());
    assert_eq!(count(&summary, "acknowledged"), 1, "{summary}");

    // The late write was based on the empty page it read before the pause.
    let body = page_lines(&url, page).await;
    assert_eq!(body, vec![wrote["line"].as_str().unwrap().to_string()]);
    for e in events_named(live.events(), "wrote") {
        let line = e["line"].as_str().unwrap();
        assert!(!body.iter().any(|l| l == line), "{line:?} survived?");
    }
}

/// A pause before the lost-lock check is caught by the worker itself.
#[tokio::test]
async fn pause_at_read_is_caught_by_the_lost_lock_check() {
    let locks = LockService::start("redis").await;
    let gateway = start_gateway(gateway::FenceCheck::Enforce, &locks).await;
    let url = gateway.url();
    let page = "pause-at-read";

    let mut paused = spawn_worker(worker_args(
        &locks,
        &url,
        page,
        "paused",
        &[
            "--edits",
            "1",
            "--ttl",
            "500ms",
            "--work-ms",
            "10",
            "--stop-self-at",
            "read",
        ],
    ));
    paused.wait_for_event("read").await;
    wait_stopped(&paused).await;

    let mut live = spawn_worker(worker_args(
        &locks,
        &url,
        page,
        "live",
        &["--edits", "1", "--ttl", "500ms", "--work-ms", "10"],
    ));
    let (live_summary, status) = live.wait_summary().await;
    assert!(status.success());
    assert_eq!(count(&live_summary, "acknowledged"), 1, "{live_summary}");

    paused.sigcont();
    let lost = paused.wait_for_event("lost").await;
    assert!(
        lost["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{lost}"
    );
    let (summary, status) = paused.wait_summary().await;
    assert!(status.success());
    assert_summary_adds_up(&summary);
    assert_eq!(count(&summary, "abandoned"), 1, "{summary}");
    assert!(
        events_named(paused.events(), "writing").is_empty(),
        "an abandoned edit must not write"
    );
    assert_eq!(page_lines(&url, page).await.len(), 1);
}

#[tokio::test]
async fn sigterm_mid_run_releases_prints_the_summary_and_exits_zero() {
    let locks = LockService::start("redis").await;
    let gateway = start_gateway(gateway::FenceCheck::Enforce, &locks).await;
    let url = gateway.url();

    // Unbounded: only SIGTERM ends it.
    let mut w = spawn_worker(worker_args(
        &locks,
        &url,
        "sigterm",
        "w",
        &["--work-ms", "30", "--ttl", "2s"],
    ));
    for _ in 0..3 {
        w.wait_for_event("wrote").await;
    }
    w.terminate();
    let (summary, status) = w.wait_summary().await;
    assert_eq!(status.code(), Some(0), "{}", w.log_tail(20));
    assert_summary_adds_up(&summary);
    assert!(count(&summary, "acknowledged") >= 3, "{summary}");
    let events = w.events();
    let last_edit_event = &events[events.len() - 2];
    assert_eq!(
        last_edit_event["event"], "released",
        "the lock is released before the summary: {events:?}"
    );

    // Released, not left to expire: another worker gets it at once.
    let mut next = spawn_worker(worker_args(
        &locks,
        &url,
        "sigterm",
        "next",
        &["--edits", "1", "--wait", "0s", "--ttl", "2s"],
    ));
    let (summary, _) = next.wait_summary().await;
    assert_eq!(count(&summary, "acknowledged"), 1, "{summary}");
    assert_eq!(count(&summary, "lock_failures"), 0, "{summary}");
}

#[tokio::test]
async fn redlock_with_fencing_on_is_refused_with_the_reason() {
    let args: Vec<String> = [
        "--backend",
        "redlock",
        "--redlock-urls",
        "redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3",
        "--gateway",
        "http://127.0.0.1:1",
        "--fencing",
        "on",
    ]
    .map(String::from)
    .to_vec();
    let mut w = spawn_worker(args);
    let status = w.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(2));
    let log = w.log_tail(10);
    assert!(log.contains("no safe fencing token"), "{log}");
    assert!(log.contains("--fencing off"), "{log}");
}

/// Redis restarted without persistence forgets its counter: the new holder's
/// token is below the page's fence although it just got the lock. The worker
/// says exactly that instead of "lease lost".
#[tokio::test]
async fn token_counter_reset_by_a_redis_restart_is_named_as_such() {
    let mut redis = Redis::start().await;
    let redis_url = redis.url();
    // The issuer check passes after the restart (the new holder does hold
    // its token 1); only the fence catches the counter that went back.
    let gateway = spawn_gateway(keyed(
        gateway::FenceCheck::Enforce,
        Some(("redis", redis_url.clone())),
    ))
    .await;
    let url = gateway.url();
    let page = "counter-reset";
    let args = |client: &str, edits: &str| {
        vec![
            "--backend".to_string(),
            "redis".into(),
            "--redis-url".into(),
            redis_url.clone(),
            "--gateway".into(),
            url.clone(),
            "--page".into(),
            page.into(),
            "--client-id".into(),
            client.into(),
            "--api-key".into(),
            key_of(client),
            "--edits".into(),
            edits.into(),
            "--work-ms".into(),
            "10".into(),
        ]
    };
    let mut before = spawn_worker(args("before", "3"));
    let (summary, _) = before.wait_summary().await;
    assert_eq!(count(&summary, "acknowledged"), 3, "{summary}");

    redis.restart().await;
    let mut after = spawn_worker(args("after", "1"));
    let rejected = after.wait_for_event("rejected").await;
    assert_eq!(rejected["error"], "stale_token", "{rejected}");
    let message = rejected["message"].as_str().unwrap();
    assert!(message.contains("counter went backwards"), "{message}");
    assert!(message.contains("docs/OPERATIONS.md"), "{message}");
    let (summary, status) = after.wait_summary().await;
    assert!(status.success());
    assert_summary_adds_up(&summary);
    assert_eq!(count(&summary, "rejected"), 1, "{summary}");
}

/// The gateway is unreachable for a while: the worker keeps its lease (the
/// watchdog renews it), retries the read with backoff, and completes the edit
/// once the gateway appears. It never crashes.
#[tokio::test]
async fn unreachable_gateway_is_retried_until_it_answers() {
    let locks = LockService::start("redis").await;
    let port = harness::free_port();
    let mut w = spawn_worker(worker_args(
        &locks,
        &format!("http://127.0.0.1:{port}"),
        "unreachable",
        "w",
        &["--edits", "1", "--ttl", "1s", "--work-ms", "10"],
    ));
    for _ in 0..2 {
        let error = w.wait_for_event("error").await;
        assert_eq!(error["transient"], true, "{error}");
        assert_eq!(error["during"], "read", "{error}");
    }

    // Now a gateway comes up on that port.
    let url = harness::fresh_database().await;
    let migrations = gateway::connect(&url, 1).await.expect("connect");
    gateway::migrate(&migrations).await.expect("migrate");
    let db = gateway::connect_db(&url, 4).expect("database URL");
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the gateway's port");
    tokio::spawn(gateway::serve(
        listener,
        gateway::AppState::new(db, gateway::FenceCheck::Enforce),
        std::future::pending(),
    ));

    let (summary, status) = w.wait_summary().await;
    assert!(status.success(), "{}", w.log_tail(20));
    assert_summary_adds_up(&summary);
    assert_eq!(count(&summary, "acknowledged"), 1, "{summary}");
}

/// The lock service is down at startup: the worker keeps trying to connect,
/// says so, and still shuts down cleanly on SIGTERM.
#[tokio::test]
async fn unreachable_lock_service_is_retried_and_sigterm_still_exits_zero() {
    let gateway = spawn_gateway(keyed(gateway::FenceCheck::Enforce, None)).await;
    let args: Vec<String> = [
        "--backend",
        "redis",
        "--redis-url",
        &format!("redis://127.0.0.1:{}", harness::free_port()),
        "--gateway",
        &gateway.url(),
        "--edits",
        "1",
    ]
    .map(String::from)
    .to_vec();
    let mut w = spawn_worker(args);
    let error = w.wait_for_event("error").await;
    assert_eq!(error["during"], "connect", "{error}");
    assert_eq!(error["transient"], true, "{error}");
    w.wait_for_event("error").await;
    w.terminate();
    let (summary, status) = w.wait_summary().await;
    assert_eq!(status.code(), Some(0), "{}", w.log_tail(20));
    assert_eq!(count(&summary, "attempted"), 0, "{summary}");
}

#[tokio::test]
async fn duration_ends_an_unbounded_run_with_a_summary() {
    let locks = LockService::start("redis").await;
    let gateway = start_gateway(gateway::FenceCheck::Enforce, &locks).await;
    let mut w = spawn_worker(worker_args(
        &locks,
        &gateway.url(),
        "duration",
        "w",
        &["--duration", "700ms", "--work-ms", "20"],
    ));
    let (summary, status) = w.wait_summary().await;
    assert_eq!(status.code(), Some(0), "{}", w.log_tail(20));
    assert_summary_adds_up(&summary);
    assert!(count(&summary, "acknowledged") >= 1, "{summary}");
    assert_eq!(
        page_lines(&gateway.url(), "duration").await.len() as u64,
        count(&summary, "acknowledged")
    );
}

/// A write held up by a row lock until the gateway's deadline passed: the
/// gateway answers 504 `outcome_unknown` (its statement was sent and may
/// still land). The worker neither counts an error nor retries blindly: it
/// reads the page, and once the write has landed it finds its line and counts
/// the edit acknowledged, even with If-Match, where the blind retry of an
/// edit that was written gets 412 (issue 18).
#[tokio::test]
async fn a_write_answered_outcome_unknown_is_checked_and_counted_once_it_landed() {
    let locks = LockService::start("redis").await;
    let url = harness::fresh_database().await;
    let gateway = gateway::spawn_with_options(
        &url,
        keyed(gateway::FenceCheck::Enforce, locks.issuer())
            .request_timeout(Duration::from_millis(500))
            .outcome_wait(Duration::from_millis(500)),
    )
    .await
    .expect("gateway");
    let page = "unknown";
    let mut w = spawn_worker(worker_args(
        &locks,
        &gateway.url(),
        page,
        "w",
        &[
            "--edits",
            "2",
            "--if-match",
            "--work-ms",
            "1000",
            "--ttl",
            "10s",
        ],
    ));
    let first = w.wait_for_event("wrote").await;
    assert_eq!(first["status"], 201, "{first}");

    // During the second edit's work, hold the page's row lock: its write
    // waits for it past the gateway's deadline.
    let read = w.wait_for_event("read").await;
    assert_eq!(read["version"], 1, "{read}");
    let mut holder = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query("begin").execute(&mut holder).await.unwrap();
    sqlx::query("select 1 from pages where id = $1 for update")
        .bind(page)
        .execute(&mut holder)
        .await
        .unwrap();
    let unknown = w.wait_for_event("error").await;
    assert!(
        unknown["message"]
            .as_str()
            .is_some_and(|m| m.contains("outcome_unknown")),
        "{unknown}"
    );
    assert_eq!(unknown["during"], "write", "{unknown}");
    sqlx::query("commit").execute(&mut holder).await.unwrap();

    let (summary, status) = w.wait_summary().await;
    assert!(status.success(), "{}", w.log_tail(20));
    assert_summary_adds_up(&summary);
    assert_eq!(count(&summary, "acknowledged"), 2, "{summary}");
    assert_eq!(count(&summary, "errors"), 0, "{summary}");
    let lines = page_lines(&gateway.url(), page).await;
    assert_eq!(lines.len(), 2, "each edit's line once: {lines:?}");
}

// ---------------------------------------------------------------- trust

/// The history of `page`, newest first.
async fn history_of(gateway: &str, page: &str) -> Vec<Value> {
    get_json(&format!("{gateway}/pages/{page}/history?limit=1000")).await["history"]
        .as_array()
        .expect("history array")
        .clone()
}

/// A worker whose key the gateway refuses: it releases the lock, says what
/// to fix, exits 2 without retrying, and nothing reaches the page.
async fn refused_configuration(key: Option<&str>, status: u64, expect_in_log: &[&str]) {
    let locks = LockService::start("redis").await;
    let gateway = start_gateway(gateway::FenceCheck::Enforce, &locks).await;
    let url = gateway.url();
    let page = format!("refused-{status}-{}", key.map_or(0, str::len));
    let mut args = worker_args(&locks, &url, &page, "w1", &["--edits", "3"]);
    // w1's own key out, `key` (if any) in.
    let at = args.iter().position(|a| a == "--api-key").unwrap();
    args.drain(at..at + 2);
    if let Some(key) = key {
        args.extend(["--api-key".to_string(), key.to_string()]);
    }
    let mut w = spawn_worker(args);
    let (summary, exit) = w.wait_summary().await;
    assert_eq!(exit.code(), Some(2), "{}", w.log_tail(20));
    assert_summary_adds_up(&summary);
    assert_eq!(count(&summary, "attempted"), 1, "no second try: {summary}");
    assert_eq!(count(&summary, "errors"), 1, "{summary}");
    let errors = events_named(w.events(), "error");
    assert_eq!(errors.len(), 1, "one refusal, not retried: {errors:?}");
    assert_eq!(errors[0]["transient"], false, "{}", errors[0]);
    assert!(
        errors[0]["message"]
            .as_str()
            .unwrap()
            .starts_with(&status.to_string()),
        "{}",
        errors[0]
    );
    assert_eq!(
        events_named(w.events(), "released")
            .first()
            .map(|e| e["ok"].clone()),
        Some(Value::Bool(true)),
        "the lock is released before exiting"
    );
    let log = w.log_tail(20);
    for needle in expect_in_log {
        assert!(log.contains(needle), "{needle:?} not in the log:\n{log}");
    }
    assert!(
        !log.contains("e2e-w2-key-not-secret") && !log.contains("e2e-w1-key-not-secret"),
        "a key in the log:\n{log}"
    );
    // Refused before reaching the page: no history, no page.
    assert!(history_of(&url, &page).await.is_empty());
    let resp = reqwest::get(format!("{url}/pages/{page}")).await.unwrap();
    assert_eq!(resp.status(), 404);

    // Released, not left to expire: a correctly keyed worker gets it at once.
    let mut next = spawn_worker(worker_args(
        &locks,
        &url,
        &page,
        "next",
        &["--edits", "1", "--wait", "0s"],
    ));
    let (summary, _) = next.wait_summary().await;
    assert_eq!(count(&summary, "acknowledged"), 1, "{summary}");
    assert_eq!(count(&summary, "lock_failures"), 0, "{summary}");
}

#[tokio::test]
async fn a_worker_without_a_key_is_told_to_set_one_and_exits_2() {
    refused_configuration(None, 401, &["requires an API key", "WORKER_API_KEY"]).await;
}

#[tokio::test]
async fn a_worker_with_an_unknown_key_is_told_so_and_exits_2() {
    refused_configuration(
        Some("not-a-key-the-gateway-knows"),
        401,
        &["does not know our API key", "client `w1`"],
    )
    .await;
}

#[tokio::test]
async fn a_worker_with_another_clients_key_gets_403_and_exits_2() {
    // w2's key for client w1.
    refused_configuration(
        Some(&key_of("w2")),
        403,
        &["belongs to client `w2`, not `w1`", "WORKER_CLIENT_ID"],
    )
    .await;
}

#[tokio::test]
async fn a_lock_service_the_gateway_does_not_trust_is_a_configuration_error() {
    let locks = LockService::start("redis").await;
    // The gateway trusts a lease table only; the worker's tokens come from Redis.
    let lease_db = harness::fresh_database().await;
    let gateway = spawn_gateway(keyed(
        gateway::FenceCheck::Enforce,
        Some(("lease-postgres", lease_db)),
    ))
    .await;
    let mut w = spawn_worker(worker_args(
        &locks,
        &gateway.url(),
        "untrusted",
        "w1",
        &["--edits", "3"],
    ));
    let (summary, exit) = w.wait_summary().await;
    assert_eq!(exit.code(), Some(2), "{}", w.log_tail(20));
    assert_eq!(count(&summary, "attempted"), 1, "{summary}");
    let log = w.log_tail(20);
    assert!(
        log.contains("does not trust our lock service `redis`"),
        "{log}"
    );
    assert!(
        log.contains("lease-postgres"),
        "names what it trusts: {log}"
    );
    assert!(log.contains("GATEWAY_ISSUERS"), "{log}");
    assert!(history_of(&gateway.url(), "untrusted").await.is_empty());
}

/// The gateway asks a Redis that is not the one the worker locks on: every
/// token is `token_not_current` although the worker's lease is fresh. Counted
/// as rejected (not an error), explained as a likely misconfiguration, and
/// the worker goes on (backing off) instead of crashing or writing.
#[tokio::test]
async fn token_not_current_while_the_lease_is_fresh_is_rejected_and_explained() {
    let locks = LockService::start("redis").await;
    let elsewhere = Redis::start().await;
    let gateway = spawn_gateway(keyed(
        gateway::FenceCheck::Enforce,
        Some(("redis", elsewhere.url())),
    ))
    .await;
    let url = gateway.url();
    let mut w = spawn_worker(worker_args(
        &locks,
        &url,
        "elsewhere",
        "w1",
        &["--edits", "2", "--work-ms", "10"],
    ));
    let (summary, exit) = w.wait_summary().await;
    assert_eq!(exit.code(), Some(0), "{}", w.log_tail(20));
    assert_summary_adds_up(&summary);
    assert_eq!(count(&summary, "rejected"), 2, "{summary}");
    assert_eq!(count(&summary, "acknowledged"), 0, "{summary}");
    let rejected = events_named(w.events(), "rejected");
    assert_eq!(rejected[0]["error"], "token_not_current", "{}", rejected[0]);
    assert_eq!(rejected[0]["during"], "read", "{}", rejected[0]);
    let message = rejected[0]["message"].as_str().unwrap();
    assert!(
        message.contains("another lock service than the one we use"),
        "{message}"
    );
    // The refused fenced reads are in the history; nothing was written.
    let history = history_of(&url, "elsewhere").await;
    assert_eq!(history.len(), 2, "{history:?}");
    assert!(history
        .iter()
        .all(|e| e["outcome"] == "token_not_current" && e["client_id"] == "w1"));
    let page = reqwest::get(format!("{url}/pages/elsewhere"))
        .await
        .unwrap();
    assert_eq!(page.status(), 404, "never written");
}

/// A TCP forwarder to `upstream` on `port`, started when the test says: until
/// then nothing listens there (a lock service that is down, for the gateway).
async fn forward(port: u16, upstream: u16) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the forwarder's port");
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) =
                    tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    })
}

/// The gateway cannot reach the issuer (503 `issuer_unavailable`, fail
/// closed): the worker keeps its lease and retries, and its edit lands once
/// the gateway reaches the lock service.
#[tokio::test]
async fn issuer_unavailable_is_retried_until_the_gateway_reaches_the_issuer() {
    let redis = Redis::start().await;
    let redis_port = redis.port();
    let locks = LockService::Redis(redis);
    // The gateway's way to that Redis, down for now.
    let port = harness::free_port();
    let gateway = spawn_gateway(keyed(
        gateway::FenceCheck::Enforce,
        Some(("redis", format!("redis://127.0.0.1:{port}/"))),
    ))
    .await;
    let url = gateway.url();
    let mut w = spawn_worker(worker_args(
        &locks,
        &url,
        "issuer-down",
        "w1",
        &["--edits", "1", "--work-ms", "10", "--ttl", "2s"],
    ));
    for _ in 0..2 {
        let error = w.wait_for_event("error").await;
        assert_eq!(error["transient"], true, "{error}");
        assert_eq!(error["during"], "read", "{error}");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("issuer_unavailable"),
            "{error}"
        );
    }
    assert!(
        history_of(&url, "issuer-down").await.is_empty(),
        "fail closed"
    );

    let _forwarder = forward(port, redis_port).await;
    let (summary, exit) = w.wait_summary().await;
    assert_eq!(exit.code(), Some(0), "{}", w.log_tail(20));
    assert_summary_adds_up(&summary);
    assert_eq!(count(&summary, "acknowledged"), 1, "{summary}");
    assert_eq!(count(&summary, "errors"), 0, "{summary}");
    assert_eq!(page_lines(&url, "issuer-down").await.len(), 1);
}

/// `worker lock --detach` takes a real lock for a person with curl: the
/// printed token is the current holder's (a keyed PUT with it lands through
/// a gateway that checks with the issuer), another client cannot take the
/// lock meanwhile, and `worker unlock` releases it.
#[tokio::test]
async fn worker_lock_holds_a_real_lock_for_curl_until_unlock() {
    let locks = LockService::start("redis").await;
    let gateway = start_gateway(gateway::FenceCheck::Enforce, &locks).await;
    let url = gateway.url();
    let state = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let mut cmd = std::process::Command::new(harness::worker_proc::worker_binary());
        cmd.args(args)
            .args(locks.args())
            .env("TMPDIR", state.path())
            .env_remove("WORKER_CLIENT_ID")
            .env_remove("WORKER_PAGE")
            .stdin(std::process::Stdio::null());
        cmd.output().expect("run worker")
    };
    let out = run(&[
        "lock",
        "--client-id",
        "w1",
        "--page",
        "held",
        "--detach",
        "--print",
        "token",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a token alone");

    let put = |client: &str, token: u64| {
        reqwest::Client::new()
            .put(format!("{url}/pages/held"))
            .bearer_auth(key_of(client))
            .header("Fencing-Token", token)
            .header("Fencing-Issuer", "redis")
            .json(&serde_json::json!({"body": "by hand"}))
            .send()
    };
    assert_eq!(put("w1", token).await.unwrap().status(), 201);
    let copied = put("w2", token).await.unwrap();
    assert_eq!(copied.status(), 409, "another client with the copied token");

    // Held: another client waits in vain.
    let busy = run(&[
        "lock",
        "--client-id",
        "w2",
        "--page",
        "held",
        "--wait",
        "300ms",
    ]);
    assert_eq!(busy.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&busy.stderr).contains("still held"));

    let unlock = |client: &str| {
        let mut cmd = std::process::Command::new(harness::worker_proc::worker_binary());
        cmd.args(["unlock", "--client-id", client, "--page", "held"])
            .env("TMPDIR", state.path())
            .output()
            .expect("run worker unlock")
    };
    let out = unlock("w1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ended: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(ended["outcome"], "released", "{ended}");
    assert_eq!(ended["token"], token, "{ended}");
    // Released: the lock service names nobody, so the token is refused now.
    assert_eq!(put("w1", token).await.unwrap().status(), 409);
    let again = unlock("w1");
    assert_eq!(again.status.code(), Some(1), "nothing left to unlock");

    // And the next client is granted it at once, with a higher token.
    let out = run(&[
        "lock",
        "--client-id",
        "w2",
        "--page",
        "held",
        "--wait",
        "0s",
        "--detach",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let grant: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(grant["lock"], "page:held");
    assert_eq!(grant["issuer"], "redis");
    assert_eq!(grant["client_id"], "w2");
    assert!(grant["token"].as_u64().unwrap() > token, "{grant}");
    assert!(unlock("w2").status.success());
}
