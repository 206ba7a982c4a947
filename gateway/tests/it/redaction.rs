//! Secrets never logged: URLs with passwords (the database's, the issuers',
//! the setup's) fed through every path that can fail; no error text, no
//! JSON body and no log line shows the password.

use std::sync::Mutex;
use std::time::Duration;

use clap::Parser;
use gateway::{FenceCheck, GatewayOptions};
use serde_json::json;

use crate::common::{gateway_with, keyed, ADMIN};

const PASSWORD: &str = "s3cret-pw-not-for-logs";

/// Everything logged while it is the thread's default subscriber (the
/// tests' runtime runs every task on the test's thread), in a file.
struct Logs(tempfile::NamedTempFile);

impl Logs {
    fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let file = tempfile::NamedTempFile::new().unwrap();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(Mutex::new(file.reopen().unwrap()))
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .finish();
        (Logs(file), tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        std::fs::read_to_string(self.0.path()).unwrap()
    }
}

#[track_caller]
fn assert_hidden(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "{what} shows the password: {text}"
    );
}

/// A port nothing listens on.
fn dead() -> u16 {
    harness::free_port()
}

#[tokio::test]
async fn database_urls_with_passwords_are_redacted_in_every_start_error() {
    let (logs, _guard) = Logs::capture();
    let port = dead();
    let urls = [
        format!("postgres://u:{PASSWORD}@127.0.0.1:{port}/pages"),
        format!("postgres://u:{PASSWORD}@127.0.0.1:{port},127.0.0.1:{port}/pages?target_session_attrs=read-write"),
        format!("postgres://u@127.0.0.1:{port}/pages?sslmode=disable&password={PASSWORD}"),
        format!("postgres://u:{PASSWORD}@127.0.0.1:notaport/pages"),
        format!("host=127.0.0.1 port={port} user=u password={PASSWORD} dbname=pages"),
    ];
    for url in &urls {
        let errors = [
            gateway::connect(url, 1)
                .await
                .err()
                .map(|e| format!("{e:#}")),
            gateway::connect_db(url, 1).err().map(|e| format!("{e:#}")),
            gateway::check_schema(url, Duration::from_millis(300))
                .await
                .err()
                .map(|e| format!("{e:#}")),
            gateway::setup::run(url, &Default::default())
                .await
                .err()
                .map(|e| format!("{e:#}")),
            gateway::spawn_with_options(url, GatewayOptions::new(FenceCheck::Enforce))
                .await
                .err()
                .map(|e| format!("{e:#}")),
        ];
        let mut failed = 0;
        for e in errors.into_iter().flatten() {
            failed += 1;
            assert_hidden(&format!("the error for {}", fencelock::redact_url(url)), &e);
        }
        assert!(
            failed >= 4,
            "{}: only {failed} paths failed",
            fencelock::redact_url(url)
        );
    }
    let logged = logs.text();
    assert!(logged.contains("database not reachable yet"), "{logged}");
    assert_hidden("the log", &logged);
}

#[tokio::test]
async fn issuer_urls_with_passwords_are_redacted_in_answers_and_logs() {
    let (logs, _guard) = Logs::capture();
    let port = dead();
    let issuers = [
        ("redis", format!("redis://:{PASSWORD}@127.0.0.1:{port}/")),
        (
            "redis-bad",
            format!("redis://:{PASSWORD}@127.0.0.1:notaport/"),
        ),
        (
            "lease-postgres",
            format!("postgres://u:{PASSWORD}@127.0.0.1:{port}/locks"),
        ),
        (
            "lease-pg-bad",
            format!("postgres://u:{PASSWORD}@127.0.0.1:notaport/locks"),
        ),
        (
            "lease-mysql",
            format!("mysql://u:{PASSWORD}@127.0.0.1:{port}/locks"),
        ),
        (
            "zookeeper",
            format!("zookeeper://u:{PASSWORD}@127.0.0.1:{port}"),
        ),
        (
            "redis-sentinel",
            format!("redis-sentinel://:{PASSWORD}@127.0.0.1:{port}/mymaster"),
        ),
    ];
    let options = issuers
        .iter()
        .fold(keyed(FenceCheck::Enforce), |o, (name, url)| {
            o.issuer(name, url)
        })
        .issuer_timeout(Duration::from_millis(700))
        .default_issuer("redis");
    let (_gw, api, _) = gateway_with(options).await;
    for (name, _) in &issuers {
        let reply = api
            .put_issued("p", "x", 1, name)
            .await
            .expect_error(503, "issuer_unavailable");
        assert_hidden(&format!("{name}'s 503"), &reply.json.to_string());
        let body = json!({"issuer": name, "token": 1, "reason": "check"});
        let reply = api.as_client(ADMIN).set_fence("p", &body).await;
        assert_hidden(&format!("{name}'s admin answer"), &reply.json.to_string());
    }
    // Every issuer has logged its first failure by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let logged = logs.text();
    for needle in ["issuer not reachable yet", "issuer unavailable"] {
        assert!(logged.contains(needle), "no {needle:?} in {logged}");
    }
    assert_hidden("the log", &logged);
}

#[test]
fn the_flags_debug_form_never_shows_a_password() {
    let cli = gateway::Cli::try_parse_from([
        "gateway",
        "--database-url",
        &format!("postgres://u:{PASSWORD}@db/pages"),
        "--issuer",
        &format!("redis=redis://:{PASSWORD}@r:6379"),
    ])
    .unwrap();
    assert_hidden("Cli's Debug", &format!("{cli:?}"));
    let setup = gateway::Cli::try_parse_from([
        "gateway",
        "setup",
        "--database-url",
        &format!("postgres://owner:{PASSWORD}@db/pages"),
        "--mysql-url",
        &format!("mysql://owner:{PASSWORD}@m/locks"),
    ])
    .unwrap();
    let shown = format!("{setup:?}");
    assert_hidden("setup's Debug", &shown);
    assert!(shown.contains("postgres://owner:***@db/pages"), "{shown}");
}
