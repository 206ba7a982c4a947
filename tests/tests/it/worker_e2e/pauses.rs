//! A worker that stops (SIGSTOP, raised by itself at a chosen step) past its
//! TTL while another takes the lock: the fence refuses its late write, the
//! worker's own lost-lock check catches a pause before it, and without
//! fencing the late write destroys acknowledged edits. And a token counter
//! that went back, named as such.

use std::time::Duration;

use gateway::FenceCheck;
use harness::worker_proc::WorkerProcess;

use super::support::{keyed, lines_written, ran, LockService, Scene};

/// A short lease and quick edits: a pause outlives the lease at once.
const QUICK: [&str; 4] = ["--ttl", "500ms", "--work-ms", "10"];

/// One edit, the worker stopping itself at `step` (`read`, `writing`).
fn stopping_at<'a>(step: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    [&QUICK[..], &["--edits", "1", "--stop-self-at", step], more].concat()
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
    let issuer = if issuer_check { locks.issuer() } else { None };
    let scene = Scene::with(locks, keyed(FenceCheck::Enforce, issuer)).await;
    let page = "pause-at-writing";

    let mut paused = scene.worker(page, "paused", &stopping_at("writing", &[]));
    let writing = paused.wait_for_event("writing").await;
    let old_token = writing["token"].as_u64().expect("token in writing");
    wait_stopped(&paused).await;

    // Takes the lock once the paused worker's grant expires, and edits twice.
    let mut live = scene.worker(page, "live", &[&QUICK[..], &["--edits", "2"]].concat());
    ran(&mut live).await.exits(0).counts(&[("acknowledged", 2)]);

    paused.sigcont();
    let rejected = paused.wait_for_event("rejected").await;
    assert_eq!(rejected["status"], 409, "{rejected}");
    assert_eq!(rejected["during"], "write", "{rejected}");
    assert_eq!(rejected["token"].as_u64(), Some(old_token), "{rejected}");
    let message = rejected["message"].as_str().unwrap();
    let outcome = if issuer_check {
        assert!(
            message.contains("lease was lost and the issuer check rejected the write"),
            "{rejected}"
        );
        "token_not_current"
    } else {
        assert!(
            rejected["current"].as_u64().expect("current fence") > old_token,
            "{rejected}"
        );
        assert!(
            message.contains("lease was lost and the fence rejected the write"),
            "{rejected}"
        );
        "stale_token"
    };
    assert_eq!(rejected["error"], outcome, "{rejected}");
    let history = scene.history(page).await;
    assert!(
        history
            .iter()
            .any(|e| e["client_id"] == "paused" && e["method"] == "PUT" && e["outcome"] == outcome),
        "the refusal is in the history as {outcome}: {history:?}"
    );
    ran(&mut paused)
        .await
        .exits(0)
        .counts(&[("rejected", 1), ("acknowledged", 0)]);

    assert_eq!(
        scene.page_lines(page).await,
        lines_written(&live),
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
    let scene = Scene::start("redis", FenceCheck::Off).await;
    let page = "pause-at-writing-unfenced";
    let unfenced = ["--fencing", "off"];

    let mut paused = scene.worker(page, "paused", &stopping_at("writing", &unfenced));
    let writing = paused.wait_for_event("writing").await;
    assert_eq!(writing["fenced"], false, "{writing}");
    wait_stopped(&paused).await;

    let live_flags = [&QUICK[..], &unfenced, &["--edits", "2"]].concat();
    let mut live = scene.worker(page, "live", &live_flags);
    ran(&mut live).await.counts(&[("acknowledged", 2)]);
    assert_eq!(scene.page_lines(page).await.len(), 2);

    paused.sigcont();
    let wrote = paused.wait_for_event("wrote").await;
    ran(&mut paused)
        .await
        .exits(0)
        .counts(&[("acknowledged", 1)]);

    // The late write was based on the empty page it read before the pause.
    let body = scene.page_lines(page).await;
    assert_eq!(body, vec![wrote["line"].as_str().unwrap().to_string()]);
    for line in lines_written(&live) {
        assert!(!body.contains(&line), "{line:?} survived?");
    }
}

/// A pause before the lost-lock check is caught by the worker itself.
#[tokio::test]
async fn pause_at_read_is_caught_by_the_lost_lock_check() {
    let scene = Scene::start("redis", FenceCheck::Enforce).await;
    let page = "pause-at-read";

    let mut paused = scene.worker(page, "paused", &stopping_at("read", &[]));
    paused.wait_for_event("read").await;
    wait_stopped(&paused).await;

    let mut live = scene.worker(page, "live", &[&QUICK[..], &["--edits", "1"]].concat());
    ran(&mut live).await.exits(0).counts(&[("acknowledged", 1)]);

    paused.sigcont();
    let lost = paused.wait_for_event("lost").await;
    assert!(
        lost["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{lost}"
    );
    ran(&mut paused).await.exits(0).counts(&[("abandoned", 1)]);
    assert!(
        paused.events().iter().all(|e| e["event"] != "writing"),
        "an abandoned edit must not write"
    );
    assert_eq!(scene.page_lines(page).await.len(), 1);
}

/// Redis restarted without persistence forgets its counter: the new holder's
/// token is below the page's fence although it just got the lock. The worker
/// says exactly that instead of "lease lost".
#[tokio::test]
async fn token_counter_reset_by_a_redis_restart_is_named_as_such() {
    // The issuer check passes after the restart (the new holder does hold
    // its token 1); only the fence catches the counter that went back.
    let mut scene = Scene::start("redis", FenceCheck::Enforce).await;
    let page = "counter-reset";
    let edits = |n| ["--edits", n, "--work-ms", "10"];
    let mut before = scene.worker(page, "before", &edits("3"));
    ran(&mut before).await.counts(&[("acknowledged", 3)]);

    let LockService::Redis(redis) = &mut scene.locks else {
        unreachable!("a redis scene")
    };
    redis.restart().await;
    let mut after = scene.worker(page, "after", &edits("1"));
    let rejected = after.wait_for_event("rejected").await;
    assert_eq!(rejected["error"], "stale_token", "{rejected}");
    let message = rejected["message"].as_str().unwrap();
    assert!(message.contains("counter went backwards"), "{message}");
    assert!(message.contains("docs/OPERATIONS.md"), "{message}");
    ran(&mut after).await.exits(0).counts(&[("rejected", 1)]);
}

/// A worker paused longer than the gateway keeps an idle connection (the
/// straggler) must not send its PUT down the connection the gateway closed
/// meanwhile: it stops reusing one well before the gateway's default.
#[test]
fn the_worker_drops_idle_connections_before_the_gateway_closes_them() {
    assert!(
        worker::client::IDLE_CONNECTION_REUSE < gateway::server::DEFAULT_HEADER_READ_TIMEOUT,
        "the worker reuses connections the gateway may have closed"
    );
}
