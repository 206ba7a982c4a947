//! The HTTP contract checked from outside: schemathesis, a property-based
//! API fuzzer nobody here wrote, reads the gateway's own OpenAPI description
//! (`GET /openapi.json`) and sends valid and invalid requests (ids, headers,
//! tokens, bodies, content types, methods, and PUT-then-GET sequences
//! through the description's links) to gateways on a real PostgreSQL whose
//! tokens are checked with a real redis-server. Every response must be
//! declared with its status, content type, headers and JSON schema; no 5xx
//! but the one a run provokes on purpose.
//!
//! Four runs, one database, in this order:
//! 1. `unfenced`: fencing off, keys required: writes land, pages appear for
//!    the runs after.
//! 2. `enforce-unchecked`: fencing enforced, no issuer configured: the fence
//!    statement with any token (`stale_token`, `issuer_mismatch`,
//!    `version_mismatch`, 201/200).
//! 3. `fenced`: fencing enforced, tokens checked with redis (issuers `redis`
//!    and `default`, so that requests without `Fencing-Issuer` are checked
//!    too): `token_not_current`, `unknown_issuer`; Alice holds
//!    `page:tutorial` with token 1, as in the README, so the description's
//!    examples are current.
//! 4. `issuer-down`: the same gateway with redis killed, on `/pages/{id}`:
//!    503 `issuer_unavailable` is the expected answer (fail closed), and its
//!    body must be the declared one; any other 5xx fails.
//!
//! Everything is kept under `target/schemathesis/`: the description, each
//! run's configuration, output, JUnit and HAR reports. The summary (per
//! operation, the statuses and error codes seen) is written to stderr even
//! when the test passes. More examples, another seed:
//! `OPENAPI_FUZZ_EXAMPLES=1000 OPENAPI_FUZZ_SEED=7 cargo test -p harness --test it openapi_fuzz`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::redis::RedisLock;
use fencelock::{LockService, Token};
use gateway::{FenceCheck, GatewayOptions, RunningGateway};
use harness::{python, Redis};
use serde_json::Value;
use tokio::process::Command;

/// Examples per operation and phase, unless `OPENAPI_FUZZ_EXAMPLES` says otherwise.
const EXAMPLES: u32 = 60;
/// The seed, unless `OPENAPI_FUZZ_SEED` says otherwise.
const SEED: u64 = 20_261_124;
/// Requests normally take milliseconds; the dashboard's event stream never
/// ends, and schemathesis reads it for this long, then checks its events.
const REQUEST_TIMEOUT_SECS: &str = "3";

const WRITER: &str = "alice";
const WRITER_KEY: &str = "alice-fuzz-key-not-secret";
const ADMIN: &str = "admin";
const ADMIN_KEY: &str = "admin-fuzz-key-not-secret";

/// The pinned schemathesis (and its whole tree).
const REQUIREMENTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/python/schemathesis-requirements.txt"
);
/// The venv is reused while this holds.
const VENV_CHECK: &str = "import importlib.metadata as m; \
    assert m.version('schemathesis') == '4.32.5'; \
    assert m.version('openapi-spec-validator') == '0.9.0'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_and_no_response_outside_the_description() {
    let started = Instant::now();
    let python = python::venv("schemathesis-venv", VENV_CHECK, &["-r", REQUIREMENTS])
        .await
        .expect("a venv with the pinned schemathesis (PyPI)");
    let out = python::target_dir().join("schemathesis");
    std::fs::create_dir_all(&out).unwrap();
    let examples = env_or("OPENAPI_FUZZ_EXAMPLES", EXAMPLES);
    let seed = env_or("OPENAPI_FUZZ_SEED", SEED);

    let mut redis = Redis::start().await;
    // Alice holds page:tutorial with token 1, as in the README's step 2.
    let alice = Arc::new(
        RedisLock::connect(&redis.url())
            .await
            .unwrap()
            .with_client_id(WRITER)
            .unwrap(),
    );
    let lease = alice
        .acquire(
            "page:tutorial",
            Duration::from_secs(60),
            Duration::from_secs(10),
        )
        .await
        .expect("alice takes page:tutorial");
    assert_eq!(lease.token(), Token::new(1), "a fresh redis grants token 1");

    let db = harness::fresh_database().await;
    let keyed = |fencing| {
        GatewayOptions::new(fencing)
            .api_key(WRITER, WRITER_KEY)
            .admin_key(ADMIN, ADMIN_KEY)
    };
    let unfenced = spawn(&db, keyed(FenceCheck::Off)).await;
    let unchecked = spawn(&db, keyed(FenceCheck::Enforce)).await;
    let fenced = spawn(
        &db,
        keyed(FenceCheck::Enforce)
            .issuer("redis", &redis.url())
            .issuer("default", &redis.url()),
    )
    .await;

    // The description is valid OpenAPI 3.1, as an independent validator reads it.
    let spec_file = out.join("openapi.json");
    let spec = reqwest::get(format!("{}/openapi.json", fenced.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    std::fs::write(&spec_file, &spec).unwrap();
    let validated = Command::new(&python)
        .args(["-m", "openapi_spec_validator"])
        .arg(&spec_file)
        .output()
        .await
        .unwrap();
    assert!(
        validated.status.success(),
        "openapi-spec-validator refuses the description: {}{}",
        String::from_utf8_lossy(&validated.stdout),
        String::from_utf8_lossy(&validated.stderr)
    );
    let spec: Value = serde_json::from_str(&spec).unwrap();
    let paths: Vec<String> = spec["paths"].as_object().unwrap().keys().cloned().collect();
    let declared: BTreeSet<String> = spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |method| format!("{} {path}", method.to_uppercase()))
        })
        .collect();

    let mut reports = Vec::new();
    for (name, gw) in [
        ("unfenced", &unfenced),
        ("enforce-unchecked", &unchecked),
        ("fenced", &fenced),
    ] {
        let run = Run::new(&out, name, examples, seed);
        reports.push(run.fuzz(&python, gw, &paths, &[]).await);
    }
    // What the fenced run must have reached: the issuer asked (and saying
    // no), and an issuer the gateway does not know.
    let fenced_seen = &reports[2].seen;
    assert!(
        seen(fenced_seen, "token_not_current") > 0 && seen(fenced_seen, "unknown_issuer") > 0,
        "the fenced run never reached the issuer check: {fenced_seen:?}"
    );
    assert!(
        seen(&reports[0].seen, "201") > 0,
        "the unfenced run never created a page: {:?}",
        reports[0].seen
    );

    redis.kill();
    let mut down = Run::new(&out, "issuer-down", examples.min(30), seed);
    down.expect_503 = true;
    let report = down
        .fuzz(&python, &fenced, &paths, &["--include-path", "/pages/{id}"])
        .await;
    assert!(
        seen(&report.seen, "issuer_unavailable") > 0,
        "with redis down, no request was answered issuer_unavailable: {:?}",
        report.seen
    );
    reports.push(report);

    let mut summary = format!(
        "\nschemathesis 4.32.5 against the gateway's /openapi.json ({} paths), seed {seed}, \
         {examples} examples per operation and phase, in {:.0?}; reports under {}\n",
        paths.len(),
        started.elapsed(),
        out.display()
    );
    for r in &reports {
        summary.push_str(&r.summary(&declared));
    }
    std::fs::write(out.join("summary.txt"), &summary).unwrap();
    // Straight to the test's stderr: cargo test shows it even when it passes.
    let _ = std::io::stderr().write_all(summary.as_bytes());
    for r in &reports {
        assert!(
            r.passed,
            "schemathesis run {} failed (exit {:?}); its output is in {}:\n{}",
            r.name,
            r.exit,
            r.output.display(),
            r.tail
        );
    }
    drop(lease);
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn spawn(db: &str, options: GatewayOptions) -> RunningGateway {
    gateway::spawn_with_options(db, options)
        .await
        .expect("spawn a gateway")
}

/// How often a status, or an error code, was seen in a run's responses.
fn seen(counts: &BTreeMap<String, BTreeMap<String, u32>>, what: &str) -> u32 {
    counts
        .values()
        .flat_map(|by| by.iter())
        .filter(|(k, _)| k.as_str() == what || k.split_whitespace().any(|w| w == what))
        .map(|(_, n)| n)
        .sum()
}

struct Run {
    name: &'static str,
    dir: PathBuf,
    examples: u32,
    seed: u64,
    /// The gateway's issuer is down: 503 `issuer_unavailable` is its answer.
    expect_503: bool,
}

struct Report {
    name: &'static str,
    passed: bool,
    exit: Option<i32>,
    output: PathBuf,
    /// The end of schemathesis's output (its summary, or its failures).
    tail: String,
    /// Per operation (`PUT /pages/{id}`), counts by `status [error code]`.
    seen: BTreeMap<String, BTreeMap<String, u32>>,
}

impl Run {
    fn new(out: &Path, name: &'static str, examples: u32, seed: u64) -> Self {
        let dir = out.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Run {
            name,
            dir,
            examples,
            seed,
            expect_503: false,
        }
    }

    /// schemathesis.toml: the keys for the description's two security
    /// schemes, and what the checks may expect of this gateway.
    fn config(&self) -> String {
        let mut config = format!(
            r#"# Written by tests/tests/it/openapi_fuzz.rs for the run "{name}".
[auth.openapi.writer_key]
bearer = "{WRITER_KEY}"
[auth.openapi.admin_key]
bearer = "{ADMIN_KEY}"

[generation]
# Unknown headers are ignored, as HTTP says they must be: schemathesis
# would count a request with an extra header as invalid data accepted.
allow-extra-parameters = false

[checks.positive_data_acceptance]
# Valid requests refused for the state they meet: 409 (the fence, the
# issuer), 412 (If-Match on another version), 428 (a write without a token
# while fencing is enforced; the description cannot make the header required
# for one deployment only).
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "412", "428", "429", "5xx"]

# The event stream never ends: its valid requests are the description's
# example (read for the request timeout, every event checked); the fuzzer
# sends invalid ones only.
[[operations]]
include-path = "/dashboard/events"
generation.mode = "negative"
"#,
            name = self.name
        );
        if self.expect_503 {
            config.push_str(
                r#"
[checks.not_a_server_error]
# The issuer is down: 503 issuer_unavailable is the gateway failing closed,
# as it must (the test checks that every 5xx seen is that one).
expected-statuses = ["2xx", "3xx", "4xx", "503"]
"#,
            );
        }
        config
    }

    async fn fuzz(
        &self,
        python: &Path,
        gw: &RunningGateway,
        paths: &[String],
        extra: &[&str],
    ) -> Report {
        let config = self.dir.join("schemathesis.toml");
        std::fs::write(&config, self.config()).unwrap();
        let output = self.dir.join("output.txt");
        let log = std::fs::File::create(&output).unwrap();
        let status = Command::new(python)
            .current_dir(&self.dir)
            .args(["-m", "schemathesis.cli", "--config-file"])
            .arg(&config)
            .arg("run")
            .arg(format!("{}/openapi.json", gw.url()))
            .args(["--checks", "all"])
            .args(["--seed", &self.seed.to_string()])
            .args(["--max-examples", &self.examples.to_string()])
            .args(["--request-timeout", REQUEST_TIMEOUT_SECS])
            .args(["--workers", "1", "--no-color", "--output-sanitize", "false"])
            .args(["--generation-database", "none"])
            .args(["--report", "junit,har", "--report-dir"])
            .arg(&self.dir)
            .args(extra)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .status()
            .await
            .expect("run schemathesis");
        let text = std::fs::read_to_string(&output).unwrap_or_default();
        let tail = match text
            .find("=== FAILURES ===")
            .or_else(|| text.find("=== SUMMARY ==="))
        {
            Some(at) => text[text[..at].rfind('\n').unwrap_or(at)..].to_owned(),
            None => text.clone(),
        };
        let mut seen = har_counts(&self.dir, paths);
        let mut passed = status.success();
        if self.expect_503 {
            // Every 5xx must be the one this run provokes.
            for (op, by) in &seen {
                for (what, n) in by {
                    if what.starts_with('5') && what != "503 issuer_unavailable" {
                        passed = false;
                        eprintln!("{}: {op} answered {what} ({n}x)", self.name);
                    }
                }
            }
        }
        seen.retain(|_, by| !by.is_empty());
        Report {
            name: self.name,
            passed,
            exit: status.code(),
            output,
            tail,
            seen,
        }
    }
}

impl Report {
    fn summary(&self, declared: &BTreeSet<String>) -> String {
        let mut s = format!(
            "\n== {}: {} ==\n",
            self.name,
            if self.passed { "passed" } else { "FAILED" }
        );
        let summary = self
            .tail
            .find("=== SUMMARY ===")
            .map_or(self.tail.as_str(), |at| &self.tail[at..]);
        for line in summary.lines() {
            let line = line.trim();
            if line.starts_with("Test cases:")
                || line.contains(" generated")
                || line.starts_with('✅')
                || line.starts_with('❌')
                || line.starts_with('⚠')
            {
                s.push_str(&format!("  {line}\n"));
            }
        }
        // Methods a path does not have (the unsupported_method check's
        // probes), in one line.
        let mut undeclared: BTreeMap<&str, u32> = BTreeMap::new();
        for (op, by) in &self.seen {
            if !declared.contains(op) {
                for (k, n) in by {
                    *undeclared.entry(k).or_default() += n;
                }
                continue;
            }
            let counts: Vec<String> = by.iter().map(|(k, n)| format!("{k} x{n}")).collect();
            s.push_str(&format!("  {op}: {}\n", counts.join(", ")));
        }
        if !undeclared.is_empty() {
            let counts: Vec<String> = undeclared
                .iter()
                .map(|(k, n)| format!("{k} x{n}"))
                .collect();
            s.push_str(&format!(
                "  methods a path does not have: {}\n",
                counts.join(", ")
            ));
        }
        s
    }
}

/// From the run's HAR report: per `METHOD /path/template` (the
/// description's `paths`), how often each `status [error code]` was answered.
fn har_counts(dir: &Path, paths: &[String]) -> BTreeMap<String, BTreeMap<String, u32>> {
    let mut counts: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
    let Some(har) = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|e| e == "json") && p.to_string_lossy().contains("har")
        })
    else {
        return counts;
    };
    let har: Value = match std::fs::read_to_string(&har).map(|t| serde_json::from_str(&t)) {
        Ok(Ok(v)) => v,
        _ => return counts,
    };
    for entry in har["log"]["entries"].as_array().into_iter().flatten() {
        let method = entry["request"]["method"].as_str().unwrap_or("?");
        let url = entry["request"]["url"].as_str().unwrap_or("");
        let path = url
            .splitn(4, '/')
            .nth(3)
            .map(|p| format!("/{}", p.split('?').next().unwrap_or("")))
            .unwrap_or_default();
        let status = entry["response"]["status"].as_u64().unwrap_or(0);
        let code = entry["response"]["content"]["text"]
            .as_str()
            .and_then(|t| serde_json::from_str::<Value>(t).ok())
            .and_then(|v| v["error"].as_str().map(str::to_owned));
        let key = match code {
            Some(code) => format!("{status} {code}"),
            None => status.to_string(),
        };
        *counts
            .entry(format!("{method} {}", route_of(&path, paths)))
            .or_default()
            .entry(key)
            .or_default() += 1;
    }
    counts
}

/// The description's path a request's path falls under (`/pages/abc` ->
/// `/pages/{id}`), or the path itself when none does (e.g. `/pages/`).
fn route_of(path: &str, paths: &[String]) -> String {
    let segments: Vec<&str> = path.split('/').collect();
    let matches = |t: &str| {
        let ts: Vec<&str> = t.split('/').collect();
        ts.len() == segments.len()
            && ts
                .iter()
                .zip(&segments)
                .all(|(t, s)| t == s || (t.starts_with('{') && !s.is_empty()))
    };
    // A literal path wins over a template (`/docs/` over `/docs/{file}`).
    paths
        .iter()
        .find(|t| *t == path)
        .or_else(|| paths.iter().find(|t| matches(t)))
        .cloned()
        .unwrap_or_else(|| path.to_owned())
}
