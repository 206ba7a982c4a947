//! The `worker` binary end to end: real lock services, a real gateway on a real
//! PostgreSQL, and worker processes whose JSONL events the tests follow.
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

async fn start_gateway(fencing: gateway::FenceCheck) -> gateway::RunningGateway {
    let db = harness::fresh_database().await;
    gateway::spawn(&db, fencing)
        .await
        .expect("start the gateway in-process")
}

/// Worker flags: the lock service's, the gateway, the page, the client id, and `extra`.
fn worker_args(
    locks: &LockService,
    gateway: &str,
    page: &str,
    client: &str,
    extra: &[&str],
) -> Vec<String> {
    let mut args = locks.args();
    args.extend(["--gateway", gateway, "--page", page, "--client-id", client].map(String::from));
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
    let gateway = start_gateway(if fencing {
        gateway::FenceCheck::Enforce
    } else {
        gateway::FenceCheck::Off
    })
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
/// paused one wakes and writes with its old token, and the fence refuses it.
#[tokio::test]
async fn write_after_a_pause_at_writing_is_rejected_by_the_fence() {
    let locks = LockService::start("redis").await;
    let gateway = start_gateway(gateway::FenceCheck::Enforce).await;
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
    assert_eq!(rejected["error"], "stale_token", "{rejected}");
    assert_eq!(rejected["during"], "write", "{rejected}");
    assert_eq!(rejected["token"].as_u64(), Some(old_token), "{rejected}");
    assert!(
        rejected["current"].as_u64().expect("current fence") > old_token,
        "{rejected}"
    );
    assert!(
        rejected["message"]
            .as_str()
            .unwrap()
            .contains("lease was lost and the fence rejected the write"),
        "{rejected}"
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

/// The same pause without fencing: nothing stops the late write, and it
/// silently overwrites the edits the other worker had acknowledged. This is
/// the damage the fence exists to prevent.
#[tokio::test]
async fn without_fencing_a_write_after_a_pause_at_writing_loses_acknowledged_edits() {
    let locks = LockService::start("redis").await;
    let gateway = start_gateway(gateway::FenceCheck::Off).await;
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
    let gateway = start_gateway(gateway::FenceCheck::Enforce).await;
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
    let gateway = start_gateway(gateway::FenceCheck::Enforce).await;
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
    let gateway = start_gateway(gateway::FenceCheck::Enforce).await;
    let url = gateway.url();
    let page = "counter-reset";
    let redis_url = redis.url();
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
    let gateway = start_gateway(gateway::FenceCheck::Enforce).await;
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
    let gateway = start_gateway(gateway::FenceCheck::Enforce).await;
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
        gateway::GatewayOptions::new(gateway::FenceCheck::Enforce)
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
