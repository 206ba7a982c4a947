//! What every end-to-end test of the worker sets up: a lock service, a
//! gateway that knows the test clients' keys, workers pointed at both, and
//! what the gateway then says about a page.

use std::process::ExitStatus;

use gateway::{FenceCheck, GatewayOptions, RunningGateway};
use harness::worker_proc::{WorkerEvent, WorkerProcess};
use harness::{Redis, SentinelGroup, ZooKeeper};
use serde_json::Value;

/// A lock service running for one test, and the worker flags that reach it.
pub enum LockService {
    Redis(Redis),
    Sentinel(SentinelGroup),
    Redlock(Vec<Redis>),
    ZooKeeper(ZooKeeper),
    LeasePostgres(String),
    LeaseMysql(String),
}

impl LockService {
    pub async fn start(backend: &str) -> LockService {
        match backend {
            "redis" => LockService::Redis(Redis::start().await),
            "redis-sentinel" => LockService::Sentinel(SentinelGroup::start().await),
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
    pub fn issuer(&self) -> Option<(&'static str, String)> {
        match self {
            LockService::Redis(r) => Some(("redis", r.url())),
            LockService::Sentinel(group) => Some((
                "redis-sentinel",
                format!(
                    "redis-sentinel://{}/{}",
                    group.sentinel_addrs().join(","),
                    group.master_name()
                ),
            )),
            LockService::Redlock(_) => None,
            LockService::ZooKeeper(zk) => {
                Some(("zookeeper", format!("zookeeper://{}", zk.connect_string())))
            }
            LockService::LeasePostgres(url) => Some(("lease-postgres", url.clone())),
            LockService::LeaseMysql(url) => Some(("lease-mysql", url.clone())),
        }
    }

    pub fn args(&self) -> Vec<String> {
        let (backend, flag, value) = match self {
            LockService::Redis(r) => ("redis", "--redis-url", r.url()),
            LockService::Sentinel(group) => {
                return vec![
                    "--backend".into(),
                    "redis-sentinel".into(),
                    "--redis-sentinels".into(),
                    group.sentinel_addrs().join(","),
                    "--redis-sentinel-master".into(),
                    group.master_name().into(),
                ];
            }
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
pub fn key_of(client: &str) -> String {
    format!("e2e-{client}-key-not-secret")
}

/// The gateway's options with every test client's key and, `issuer` given,
/// that lock service asked about every token.
pub fn keyed(fencing: FenceCheck, issuer: Option<(&str, String)>) -> GatewayOptions {
    let mut options = GatewayOptions::new(fencing);
    for client in CLIENTS {
        options = options.api_key(client, &key_of(client));
    }
    if let Some((name, url)) = issuer {
        options = options.issuer(name, &url);
    }
    options
}

/// A gateway with `options` on a fresh database, in this process; and the
/// database's URL.
pub async fn spawn_gateway(options: GatewayOptions) -> (RunningGateway, String) {
    let db = harness::fresh_database().await;
    let gateway = gateway::spawn_with_options(&db, options)
        .await
        .expect("start the gateway in-process");
    (gateway, db)
}

/// One test's lock service, the gateway its workers write through, and the
/// gateway's database.
pub struct Scene {
    pub locks: LockService,
    /// Serves while the scene lives.
    _gateway: RunningGateway,
    pub url: String,
    pub db: String,
}

impl Scene {
    /// `backend`'s lock service and a gateway that requires the test
    /// clients' keys and, with `fencing` on, checks tokens with it.
    pub async fn start(backend: &str, fencing: FenceCheck) -> Scene {
        let locks = LockService::start(backend).await;
        let issuer = match fencing {
            FenceCheck::Enforce => locks.issuer(),
            FenceCheck::Off => None,
        };
        Scene::with(locks, keyed(fencing, issuer)).await
    }

    /// `locks` and a gateway with `options`.
    pub async fn with(locks: LockService, options: GatewayOptions) -> Scene {
        let (gateway, db) = spawn_gateway(options).await;
        Scene {
            locks,
            url: gateway.url(),
            _gateway: gateway,
            db,
        }
    }

    /// A worker editing `page` as `client` (with its key), with `extra` flags.
    pub fn worker(&self, page: &str, client: &str, extra: &[&str]) -> WorkerProcess {
        spawn_worker(worker_args(&self.locks, &self.url, page, client, extra))
    }

    /// The page's body lines.
    pub async fn page_lines(&self, page: &str) -> Vec<String> {
        page_lines(&self.url, page).await
    }

    /// The history of `page`, newest first.
    pub async fn history(&self, page: &str) -> Vec<Value> {
        let mut all: Vec<Value> = Vec::new();
        loop {
            let before = all.last().map_or(i64::MAX, |e| e["seq"].as_i64().unwrap());
            let url = format!(
                "{}/pages/{page}/history?limit=1000&before={before}",
                self.url
            );
            let got = get_json(&url).await["history"]
                .as_array()
                .expect("history array")
                .clone();
            let full = got.len() == 1000;
            all.extend(got);
            if !full {
                return all;
            }
        }
    }

    /// `GET /pages/{page}`'s status (404: never written).
    pub async fn page_status(&self, page: &str) -> u16 {
        let resp = reqwest::get(format!("{}/pages/{page}", self.url))
            .await
            .expect("GET the gateway");
        resp.status().as_u16()
    }
}

/// Worker flags: the lock service's, the gateway, the page, the client id
/// and its key, and `extra`.
pub fn worker_args(
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

pub fn spawn_worker(args: Vec<String>) -> WorkerProcess {
    WorkerProcess::spawn(args, std::iter::empty::<(&str, &str)>())
}

async fn get_json(url: &str) -> Value {
    let resp = reqwest::get(url).await.expect("GET the gateway");
    assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
    resp.json().await.expect("JSON from the gateway")
}

/// The page's body lines.
pub async fn page_lines(gateway: &str, page: &str) -> Vec<String> {
    let doc = get_json(&format!("{gateway}/pages/{page}")).await;
    doc["body"]
        .as_str()
        .expect("page body")
        .lines()
        .map(str::to_string)
        .collect()
}

pub fn events_named<'a>(events: &'a [WorkerEvent], name: &str) -> Vec<&'a WorkerEvent> {
    events.iter().filter(|e| e["event"] == name).collect()
}

/// The worker's next `error` event, which must be a transient one during
/// `during` (`connect`, `read`...): it will try again.
pub async fn retrying(w: &mut WorkerProcess, during: &str) -> WorkerEvent {
    let error = w.wait_for_event("error").await;
    assert_eq!(error["transient"], true, "{error}");
    assert_eq!(error["during"], during, "{error}");
    error
}

/// The `line` of each `wrote` event: the edits the gateway acknowledged.
pub fn lines_written(w: &WorkerProcess) -> Vec<String> {
    events_named(w.events(), "wrote")
        .iter()
        .map(|e| e["line"].as_str().expect("line").to_string())
        .collect()
}

/// A worker that has printed its summary and exited.
pub struct Ran {
    pub summary: Value,
    pub status: ExitStatus,
    log: String,
}

/// Wait for `w`'s summary and its exit. The summary must add up: each
/// attempted edit has exactly one outcome.
pub async fn ran(w: &mut WorkerProcess) -> Ran {
    let (summary, status) = w.wait_summary().await;
    let ran = Ran {
        summary,
        status,
        log: w.log_tail(30),
    };
    assert_eq!(
        ran.count("attempted"),
        ran.count("acknowledged")
            + ran.count("rejected")
            + ran.count("abandoned")
            + ran.count("errors"),
        "attempted != acknowledged + rejected + abandoned + errors: {}",
        ran.summary
    );
    ran
}

impl Ran {
    #[track_caller]
    pub fn count(&self, field: &str) -> u64 {
        self.summary[field]
            .as_u64()
            .unwrap_or_else(|| panic!("summary field {field} missing: {}", self.summary))
    }

    /// It exited with `code`.
    #[track_caller]
    pub fn exits(&self, code: i32) -> &Self {
        assert_eq!(
            self.status.code(),
            Some(code),
            "exit status {}; its summary {}\n{}",
            self.status,
            self.summary,
            self.log
        );
        self
    }

    /// Its summary counts these.
    #[track_caller]
    pub fn counts(&self, expected: &[(&str, u64)]) -> &Self {
        for &(field, n) in expected {
            assert_eq!(
                self.count(field),
                n,
                "{field} in its summary {}\n{}",
                self.summary,
                self.log
            );
        }
        self
    }
}
