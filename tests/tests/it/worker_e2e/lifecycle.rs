//! The worker's run from start to end: SIGTERM and `--duration` end it with
//! a summary, a configuration it cannot honour is refused at start, a gateway
//! or lock service that is not there yet is retried, and a write whose
//! outcome is unknown is checked before it is counted.

use std::time::Duration;

use gateway::FenceCheck;
use sqlx::Connection;

use super::support::{
    keyed, ran, retrying, spawn_gateway, spawn_worker, worker_args, LockService, Scene,
};

#[tokio::test]
async fn sigterm_mid_run_releases_prints_the_summary_and_exits_zero() {
    let scene = Scene::start("redis", FenceCheck::Enforce).await;

    // Unbounded: only SIGTERM ends it.
    let mut w = scene.worker("sigterm", "w", &["--work-ms", "30", "--ttl", "2s"]);
    for _ in 0..3 {
        w.wait_for_event("wrote").await;
    }
    w.terminate();
    let run = ran(&mut w).await;
    run.exits(0);
    assert!(run.count("acknowledged") >= 3, "{}", run.summary);
    let events = w.events();
    let last_edit_event = &events[events.len() - 2];
    assert_eq!(
        last_edit_event["event"], "released",
        "the lock is released before the summary: {events:?}"
    );

    // Released, not left to expire: another worker gets it at once.
    let mut next = scene.worker(
        "sigterm",
        "next",
        &["--edits", "1", "--wait", "0s", "--ttl", "2s"],
    );
    ran(&mut next)
        .await
        .counts(&[("acknowledged", 1), ("lock_failures", 0)]);
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
        retrying(&mut w, "read").await;
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
        gateway::AppState::new(db, FenceCheck::Enforce),
        std::future::pending(),
    ));

    ran(&mut w).await.exits(0).counts(&[("acknowledged", 1)]);
}

/// The lock service is down at startup: the worker keeps trying to connect,
/// says so, and still shuts down cleanly on SIGTERM.
#[tokio::test]
async fn unreachable_lock_service_is_retried_and_sigterm_still_exits_zero() {
    let (gateway, _) = spawn_gateway(keyed(FenceCheck::Enforce, None)).await;
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
    retrying(&mut w, "connect").await;
    w.wait_for_event("error").await;
    w.terminate();
    ran(&mut w).await.exits(0).counts(&[("attempted", 0)]);
}

#[tokio::test]
async fn duration_ends_an_unbounded_run_with_a_summary() {
    let scene = Scene::start("redis", FenceCheck::Enforce).await;
    let mut w = scene.worker("duration", "w", &["--duration", "700ms", "--work-ms", "20"]);
    let run = ran(&mut w).await;
    run.exits(0);
    assert!(run.count("acknowledged") >= 1, "{}", run.summary);
    assert_eq!(
        scene.page_lines("duration").await.len() as u64,
        run.count("acknowledged")
    );
}

/// A write held up by a row lock until the gateway's deadline passed: the
/// gateway answers 504 `outcome_unknown` (its statement was sent and may
/// still land). The worker neither counts an error nor retries blindly: it
/// reads the page, and once the write has landed it finds its line and counts
/// the edit acknowledged, even with If-Match, where the blind retry of an
/// edit that was written gets 412.
#[tokio::test]
async fn a_write_answered_outcome_unknown_is_checked_and_counted_once_it_landed() {
    let locks = LockService::start("redis").await;
    let options = keyed(FenceCheck::Enforce, locks.issuer())
        .request_timeout(Duration::from_millis(500))
        .outcome_wait(Duration::from_millis(500));
    let scene = Scene::with(locks, options).await;
    let page = "unknown";
    let mut w = scene.worker(
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
    );
    let first = w.wait_for_event("wrote").await;
    assert_eq!(first["status"], 201, "{first}");

    // During the second edit's work, hold the page's row lock: its write
    // waits for it past the gateway's deadline.
    let read = w.wait_for_event("read").await;
    assert_eq!(read["version"], 1, "{read}");
    let mut holder = sqlx::PgConnection::connect(&scene.db)
        .await
        .expect("connect");
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

    ran(&mut w)
        .await
        .exits(0)
        .counts(&[("acknowledged", 2), ("errors", 0)]);
    let lines = scene.page_lines(page).await;
    assert_eq!(lines.len(), 2, "each edit's line once: {lines:?}");
}
