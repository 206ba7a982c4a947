//! Trust between the worker and the gateway: a missing, unknown or borrowed
//! key, a lock service the gateway does not trust, an issuer that is the
//! wrong one or unreachable; and `worker lock`, a real lock held for a person
//! with curl.

use std::process::{Command, Output, Stdio};

use gateway::FenceCheck;
use harness::worker_proc::worker_binary;
use harness::Redis;
use serde_json::Value;

use super::support::{
    events_named, key_of, keyed, ran, retrying, spawn_worker, LockService, Scene,
};

/// A worker whose key the gateway refuses: it releases the lock, says what
/// to fix, exits 2 without retrying, and nothing reaches the page.
async fn refused_configuration(key: Option<&str>, status: u64, expect_in_log: &[&str]) {
    let scene = Scene::start("redis", FenceCheck::Enforce).await;
    let page = format!("refused-{status}-{}", key.map_or(0, str::len));
    let mut args =
        super::support::worker_args(&scene.locks, &scene.url, &page, "w1", &["--edits", "3"]);
    // w1's own key out, `key` (if any) in.
    let at = args.iter().position(|a| a == "--api-key").unwrap();
    args.drain(at..at + 2);
    if let Some(key) = key {
        args.extend(["--api-key".to_string(), key.to_string()]);
    }
    let mut w = spawn_worker(args);
    ran(&mut w)
        .await
        .exits(2)
        .counts(&[("attempted", 1), ("errors", 1)]);
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
    assert!(scene.history(&page).await.is_empty());
    assert_eq!(scene.page_status(&page).await, 404);

    // Released, not left to expire: a correctly keyed worker gets it at once.
    let mut next = scene.worker(&page, "next", &["--edits", "1", "--wait", "0s"]);
    ran(&mut next)
        .await
        .counts(&[("acknowledged", 1), ("lock_failures", 0)]);
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
    let trusted = Some(("lease-postgres", lease_db));
    let scene = Scene::with(locks, keyed(FenceCheck::Enforce, trusted)).await;
    let mut w = scene.worker("untrusted", "w1", &["--edits", "3"]);
    ran(&mut w).await.exits(2).counts(&[("attempted", 1)]);
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
    assert!(scene.history("untrusted").await.is_empty());
}

/// The gateway asks a Redis that is not the one the worker locks on: every
/// token is `token_not_current` although the worker's lease is fresh. Counted
/// as rejected (not an error), explained as a likely misconfiguration, and
/// the worker goes on (backing off) instead of crashing or writing.
#[tokio::test]
async fn token_not_current_while_the_lease_is_fresh_is_rejected_and_explained() {
    let locks = LockService::start("redis").await;
    let elsewhere = Redis::start().await;
    let issuer = Some(("redis", elsewhere.url()));
    let scene = Scene::with(locks, keyed(FenceCheck::Enforce, issuer)).await;
    let mut w = scene.worker("elsewhere", "w1", &["--edits", "2", "--work-ms", "10"]);
    ran(&mut w)
        .await
        .exits(0)
        .counts(&[("rejected", 2), ("acknowledged", 0)]);
    let rejected = events_named(w.events(), "rejected");
    assert_eq!(rejected[0]["error"], "token_not_current", "{}", rejected[0]);
    assert_eq!(rejected[0]["during"], "read", "{}", rejected[0]);
    let message = rejected[0]["message"].as_str().unwrap();
    assert!(
        message.contains("another lock service than the one we use"),
        "{message}"
    );
    // The refused fenced reads are in the history; nothing was written.
    let history = scene.history("elsewhere").await;
    assert_eq!(history.len(), 2, "{history:?}");
    assert!(history
        .iter()
        .all(|e| e["outcome"] == "token_not_current" && e["client_id"] == "w1"));
    assert_eq!(scene.page_status("elsewhere").await, 404, "never written");
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
    // The gateway's way to that Redis, down for now.
    let port = harness::free_port();
    let issuer = Some(("redis", format!("redis://127.0.0.1:{port}/")));
    let scene = Scene::with(
        LockService::Redis(redis),
        keyed(FenceCheck::Enforce, issuer),
    )
    .await;
    let mut w = scene.worker(
        "issuer-down",
        "w1",
        &["--edits", "1", "--work-ms", "10", "--ttl", "2s"],
    );
    for _ in 0..2 {
        let error = retrying(&mut w, "read").await;
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("issuer_unavailable"),
            "{error}"
        );
    }
    assert!(scene.history("issuer-down").await.is_empty(), "fail closed");

    let _forwarder = forward(port, redis_port).await;
    ran(&mut w)
        .await
        .exits(0)
        .counts(&[("acknowledged", 1), ("errors", 0)]);
    assert_eq!(scene.page_lines("issuer-down").await.len(), 1);
}

/// `worker ARGS` as a person runs it, its state (the detached holders) in
/// `state`.
fn worker_cli(state: &std::path::Path, args: &[&str]) -> Output {
    Command::new(worker_binary())
        .args(args)
        .env("TMPDIR", state)
        .env_remove("WORKER_CLIENT_ID")
        .env_remove("WORKER_PAGE")
        .stdin(Stdio::null())
        .output()
        .expect("run worker")
}

#[track_caller]
fn succeeded(out: Output) -> Output {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `worker lock --detach` takes a real lock for a person with curl: the
/// printed token is the current holder's (a keyed PUT with it lands through
/// a gateway that checks with the issuer), another client cannot take the
/// lock meanwhile, and `worker unlock` releases it.
#[tokio::test]
async fn worker_lock_holds_a_real_lock_for_curl_until_unlock() {
    let scene = Scene::start("redis", FenceCheck::Enforce).await;
    let state = tempfile::tempdir().unwrap();
    let lock_args = scene.locks.args();
    let lock = |client: &str, more: &[&str]| {
        let mut args = vec!["lock", "--client-id", client, "--page", "held"];
        args.extend(more);
        args.extend(lock_args.iter().map(String::as_str));
        worker_cli(state.path(), &args)
    };
    let unlock = |client: &str| {
        worker_cli(
            state.path(),
            &["unlock", "--client-id", client, "--page", "held"],
        )
    };
    let out = succeeded(lock("w1", &["--detach", "--print", "token"]));
    let token: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a token alone");

    let put = |client: &str, token: u64| {
        reqwest::Client::new()
            .put(format!("{}/pages/held", scene.url))
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
    let busy = lock("w2", &["--wait", "300ms"]);
    assert_eq!(busy.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&busy.stderr).contains("still held"));

    let out = succeeded(unlock("w1"));
    let ended: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(ended["outcome"], "released", "{ended}");
    assert_eq!(ended["token"], token, "{ended}");
    // Released: the lock service names nobody, so the token is refused now.
    assert_eq!(put("w1", token).await.unwrap().status(), 409);
    let again = unlock("w1");
    assert_eq!(again.status.code(), Some(1), "nothing left to unlock");

    // And the next client is granted it at once, with a higher token.
    let out = succeeded(lock("w2", &["--wait", "0s", "--detach"]));
    let grant: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(grant["lock"], "page:held");
    assert_eq!(grant["issuer"], "redis");
    assert_eq!(grant["client_id"], "w2");
    assert!(grant["token"].as_u64().unwrap() > token, "{grant}");
    assert!(unlock("w2").status.success());
}
