//! Three workers editing one page, on every backend: every acknowledged
//! edit is in the page exactly once and nothing else is, and the accepted
//! tokens never go back.

use std::collections::HashMap;

use gateway::FenceCheck;
use harness::worker_proc::WorkerProcess;
use serde_json::Value;

use super::support::{lines_written, ran, Scene};

/// Edits per worker.
const K: u64 = 5;

/// The tokens of the page's accepted writes, in commit order (`None` when
/// the write carried none).
async fn accepted_write_tokens(scene: &Scene, page: &str) -> Vec<Option<u64>> {
    let mut entries: Vec<Value> = scene
        .history(page)
        .await
        .into_iter()
        .filter(|e| e["method"] == "PUT" && e["outcome"] == "accepted")
        .collect();
    entries.sort_by_key(|e| e["seq"].as_i64());
    entries.iter().map(|e| e["token"].as_u64()).collect()
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
    let check = if fencing {
        FenceCheck::Enforce
    } else {
        FenceCheck::Off
    };
    let scene = Scene::start(backend, check).await;
    let page = format!("e2e-{backend}");
    let edits = K.to_string();
    let flags = [
        "--edits",
        &edits,
        "--work-ms",
        "20",
        "--ttl",
        "2s",
        "--fencing",
        if fencing { "on" } else { "off" },
    ];
    let mut workers: Vec<WorkerProcess> = (1..=3)
        .map(|i| scene.worker(&page, &format!("w{i}"), &[&flags[..], extra].concat()))
        .collect();

    let mut acknowledged_lines = Vec::new();
    for w in &mut workers {
        let run = ran(w).await;
        run.exits(0).counts(&[("attempted", K), ("errors", 0)]);
        let wrote = lines_written(w);
        assert_eq!(wrote.len() as u64, run.count("acknowledged"));
        acknowledged_lines.extend(wrote);
    }
    let total_acknowledged = acknowledged_lines.len() as u64;
    assert!(total_acknowledged > 0, "no edit was acknowledged at all");

    let body = scene.page_lines(&page).await;
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
    let history = accepted_write_tokens(&scene, &page).await;
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

/// A gateway that limits each key's rate answers 429 with `Retry-After`; the
/// worker waits as long as it is told, so every edit lands with about one
/// 429 per throttled request, not a burst of quick retries (its own
/// backoff starts at 50 ms and would be refused three or four times).
#[tokio::test]
async fn a_rate_limited_worker_waits_as_told_and_every_edit_lands() {
    let locks = super::support::LockService::start("redis").await;
    let issuer = locks.issuer();
    // Two fenced requests a second, one at a time: an edit (a fenced read
    // and a write) a second at most.
    let options = super::support::keyed(FenceCheck::Enforce, issuer).write_rate(2, 1);
    let scene = Scene::with(locks, options).await;
    let flags = ["--edits", "5", "--work-ms", "0", "--ttl", "5s"];
    let mut w = scene.worker("rated", "w1", &flags);
    ran(&mut w)
        .await
        .exits(0)
        .counts(&[("acknowledged", 5), ("rejected", 0)]);
    let limited: Vec<&Value> = w
        .events()
        .iter()
        .filter(|e| e["event"] == "error")
        .filter(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("429 rate_limited"))
        })
        .collect();
    assert!(!limited.is_empty(), "the rate never bit: no 429 to honour");
    assert!(limited.iter().all(|e| e["transient"] == true));
    assert!(
        limited.len() <= 10,
        "{} answers 429 for 10 requests: the worker retried before Retry-After",
        limited.len()
    );
    assert_eq!(scene.page_lines("rated").await.len(), 5);
}
