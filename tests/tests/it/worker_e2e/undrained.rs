//! Workers whose output nobody reads while they run, as a script that
//! collects their logs at the end would start them: they must not stall.
//!
//! A pipe holds 64 KiB. A worker that writes its logs and events to a full
//! pipe from the edit loop blocks there, lock in hand; its lease then
//! lapses, the other worker waits out a TTL for every grant, and once both
//! pipes are full nobody edits at all. The workers must finish every edit
//! with their pipes unread.

use std::process::Stdio;
use std::time::Duration;

use gateway::FenceCheck;
use harness::procs::WorkerSpec;

use super::support::{worker_args, Scene};

/// Edits per worker: about 500 bytes of log each, so several pipes' worth.
const EDITS: usize = 500;

/// Two workers run `EDITS` edits each with their stdout and stderr piped
/// and unread until both have exited; every edit must be in the page.
async fn two_workers_finish_with_unread_pipes(backend: &str) {
    let scene = Scene::start(backend, FenceCheck::Enforce).await;
    let page = format!("undrained-{backend}");
    let edits = EDITS.to_string();
    let flags = ["--edits", &edits, "--work-ms", "0", "--ttl", "5s"];
    let mut children = Vec::new();
    for client in ["w1", "w2"] {
        let spec = WorkerSpec::new(client).args(worker_args(
            &scene.locks,
            &scene.url,
            &page,
            client,
            &flags,
        ));
        let mut cmd = tokio::process::Command::from(spec.command().expect("worker command"));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        children.push((client, cmd.spawn().expect("spawn the worker")));
    }
    for (client, child) in &mut children {
        let status = tokio::time::timeout(Duration::from_secs(180), child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!("{client} on {backend} did not finish {EDITS} edits with its output unread")
            })
            .expect("wait for the worker");
        assert!(
            status.success(),
            "{client} on {backend} exited with {status}"
        );
    }
    let body = scene.page_lines(&page).await;
    for client in ["w1", "w2"] {
        let prefix = format!("{client} #");
        let mine = body.iter().filter(|l| l.starts_with(&prefix)).count();
        assert_eq!(
            mine, EDITS,
            "{client}'s edits in the page on {backend} (every one should be acknowledged)"
        );
    }
}

#[tokio::test]
async fn redis_workers_with_unread_output_finish() {
    two_workers_finish_with_unread_pipes("redis").await;
}

#[tokio::test]
async fn sentinel_workers_with_unread_output_finish() {
    two_workers_finish_with_unread_pipes("redis-sentinel").await;
}

#[tokio::test]
async fn zookeeper_workers_with_unread_output_finish() {
    two_workers_finish_with_unread_pipes("zookeeper").await;
}

#[tokio::test]
async fn lease_postgres_workers_with_unread_output_finish() {
    two_workers_finish_with_unread_pipes("lease-postgres").await;
}

#[tokio::test]
async fn lease_mysql_workers_with_unread_output_finish() {
    two_workers_finish_with_unread_pipes("lease-mysql").await;
}
