//! The README's tutorial, run against the real stack so the README cannot rot.
//!
//! # The convention
//! Stated in the README and in `harness::transcript`, which holds the checker;
//! `tests/tests/compose_smoke.rs` runs the same transcripts against the
//! containers of compose.yaml. Here the `docker compose` commands run with
//! `scripts/stack`, which has the ones console blocks use.
//!
//! # The stack
//! `scripts/stack up` starts the same topology as compose.yaml from the Debian
//! packages, in a temp state dir, on free ports passed through its `STACK_*`
//! variables (so nothing collides with another test or a stack a person runs),
//! with the gateway and worker binaries `cargo build --workspace --bins` left in
//! the target dir (scripts/test builds them before the tests). The curls say
//! `localhost:8080` (the balancer) / `localhost:8081` (the unfenced gateway) /
//! `localhost:8082`, `localhost:8083` (the two fenced gateways); the test
//! rewrites those to its ports.
//! `scripts/stack down` runs on drop, also when an assertion fails.
//!
//! # The straggler (README steps 5 and 6)
//! Those steps use `docker compose`, so they cannot run here as written; the
//! same scenario runs on `scripts/stack` (`start straggler`, `unpause
//! straggler`), and the test checks what the README says the history and the
//! page show: refused through the fenced gateway (by its issuer check,
//! `token_not_current`, or by its fence, `stale_token`); through the unfenced
//! one, accepted (marked `stale`) with the edits acknowledged in the meantime
//! gone from the page.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use harness::transcript;
use tempfile::TempDir;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The target dir's profile dir (…/target/debug), where `cargo build --bins`
/// put the gateway and worker binaries: this test binary is in its `deps/`.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    for bin in ["gateway", "worker"] {
        assert!(
            dir.join(bin).is_file(),
            "{} is missing: build the binaries first (`cargo build --workspace --bins`, as scripts/test does)",
            dir.join(bin).display()
        );
    }
    dir.to_path_buf()
}

/// A running `scripts/stack`, stopped on drop.
struct Stack {
    _state: TempDir,
    env: Vec<(String, String)>,
    /// The balancer in front of the two fenced gateways (the README's :8080).
    gateway: u16,
    unfenced: u16,
    /// The fenced gateways themselves (the README's :8082 and :8083).
    gateways: [u16; 2],
}

impl Stack {
    fn up() -> Stack {
        let state = tempfile::Builder::new()
            .prefix("stack-tutorial-")
            .tempdir()
            .expect("temp dir");
        // Run as root, PostgreSQL runs as `postgres` and must get through this dir.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod state dir");
        let port = || harness::free_port().to_string();
        let gateway = harness::free_port();
        let unfenced = harness::free_port();
        let gateway_1 = harness::free_port();
        let gateway_2 = harness::free_port();
        let redlock: Vec<String> = (0..5).map(|_| port()).collect();
        let env = vec![
            (
                "STACK_DIR".into(),
                state.path().join("stack").display().to_string(),
            ),
            ("STACK_BIN_DIR".into(), bin_dir().display().to_string()),
            ("STACK_GATEWAY_PORT".into(), gateway.to_string()),
            ("STACK_UNFENCED_PORT".into(), unfenced.to_string()),
            ("STACK_POSTGRES_PORT".into(), port()),
            // Issue 15: the standby and the two fenced gateways behind the
            // balancer (STACK_GATEWAY_PORT is the balancer).
            ("STACK_POSTGRES_STANDBY_PORT".into(), port()),
            ("STACK_GATEWAY_1_PORT".into(), gateway_1.to_string()),
            ("STACK_GATEWAY_2_PORT".into(), gateway_2.to_string()),
            ("STACK_REDIS_PORT".into(), port()),
            ("STACK_MARIADB_PORT".into(), port()),
            ("STACK_REDLOCK_PORTS".into(), redlock.join(" ")),
            // The README's default backend; never inherit the caller's choice.
            ("BACKEND".into(), "zookeeper".into()),
        ];
        // The ZooKeeper ensemble and the Sentinel group (issue 14).
        let env = [env, harness::stack::replicated_ports()].concat();
        let stack = Stack {
            _state: state,
            env,
            gateway,
            unfenced,
            gateways: [gateway_1, gateway_2],
        };
        let out = stack.script(&["up"]);
        if !out.status.success() {
            panic!(
                "scripts/stack up failed:\n{}{}\n--- logs ---\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                stack.logs()
            );
        }
        stack
    }

    fn script(&self, args: &[&str]) -> Output {
        Command::new(repo().join("scripts/stack"))
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env_remove("WORKER_GATEWAY")
            .env_remove("WORKER_FENCING")
            .env_remove("WORKER_FAIR")
            .output()
            .expect("run scripts/stack")
    }

    fn logs(&self) -> String {
        String::from_utf8_lossy(&self.script(&["logs"]).stdout).into_owned()
    }

    /// Run a README command, with the documented ports replaced by ours.
    fn sh(&self, command: &str) -> String {
        self.sh_with(command, &[])
    }

    /// Run a README command with the variables captured so far, the
    /// documented ports replaced by ours and `docker compose` by our stack.
    fn sh_with(&self, command: &str, vars: &[(String, String)]) -> String {
        let stack = repo().join("scripts/stack");
        let command = command
            .replace("localhost:8080", &format!("127.0.0.1:{}", self.gateway))
            .replace("localhost:8081", &format!("127.0.0.1:{}", self.unfenced))
            .replace("localhost:8082", &format!("127.0.0.1:{}", self.gateways[0]))
            .replace("localhost:8083", &format!("127.0.0.1:{}", self.gateways[1]))
            .replace("docker compose ", &format!("{} ", stack.display()));
        let out = Command::new("sh")
            .args(["-c", &command])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env_remove("WORKER_GATEWAY")
            .env_remove("WORKER_FENCING")
            .env_remove("WORKER_FAIR")
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run sh");
        assert!(
            out.status.success(),
            "`{command}` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).replace('\r', "")
    }

    /// Wait (bounded) until `command` prints something matching `expected`.
    fn wait_for(&self, command: &str, expected: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.sh(command);
            if transcript::line_matches(expected, got.trim_end()) {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "`{command}` never printed {expected:?} (last: {got:?})\n--- logs ---\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Stack {
    /// The state `scripts/stack status` reports for `name` (running, paused, exited).
    fn state(&self, name: &str) -> String {
        let out = self.script(&["status"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| {
                let mut words = l.split_whitespace();
                (words.next() == Some(name)).then(|| words.next().unwrap_or("").to_owned())
            })
            .unwrap_or_else(|| "absent".into())
    }

    #[track_caller]
    fn wait_state(&self, name: &str, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.state(name) != want {
            if Instant::now() > deadline {
                panic!(
                    "{name} is {} after {timeout:?}, not {want}\n--- logs ---\n{}",
                    self.state(name),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Page `demo`'s history, oldest first.
    fn history(&self) -> Vec<serde_json::Value> {
        let got = self.sh("curl -sf 'localhost:8080/pages/demo/history?limit=10000'");
        let v: serde_json::Value = serde_json::from_str(&got).expect("history JSON");
        let mut entries = v["history"].as_array().expect("history array").clone();
        entries.reverse();
        entries
    }

    /// Run one straggler (README steps 5 and 6): start it, wait until it has
    /// frozen itself at `writing`, keep it frozen past its TTL until another
    /// worker has accessed the page with a higher token, resume it, and wait
    /// for it to finish. Returns (its GET, its PUT, the history in between).
    fn straggle(
        &self,
        name: &str,
    ) -> (serde_json::Value, serde_json::Value, Vec<serde_json::Value>) {
        let out = self.script(&["start", name]);
        assert!(
            out.status.success(),
            "start {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait_state(name, "paused", Duration::from_secs(60));
        let mine = |e: &serde_json::Value| e["client_id"] == name;
        let get = self
            .history()
            .into_iter()
            .find(|e| mine(e) && e["method"] == "GET")
            .expect("the straggler's fenced GET is in the history");
        let token = get["token"].as_i64().expect("its token");
        // The scenario: stay frozen past the 2 s TTL...
        std::thread::sleep(Duration::from_secs(3));
        // ...until the lock has moved on: another worker took it (a higher
        // token) and got an edit acknowledged.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.history().iter().any(|e| {
            !mine(e)
                && e["method"] == "PUT"
                && e["outcome"] == "accepted"
                && e["token"].as_i64().is_some_and(|t| t > token)
        }) {
            assert!(
                Instant::now() < deadline,
                "no other worker took the lock and edited\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = self.script(&["unpause", name]);
        assert!(out.status.success(), "unpause {name}");
        self.wait_state(name, "exited", Duration::from_secs(30));
        let history = self.history();
        let at = |e: &serde_json::Value| history.iter().position(|h| h["seq"] == e["seq"]).unwrap();
        let put = history
            .iter()
            .find(|e| mine(e) && e["method"] == "PUT")
            .unwrap_or_else(|| panic!("{name} sent no PUT\n{}", self.logs()))
            .clone();
        let between = history[at(&get) + 1..at(&put)].to_vec();
        (get, put, between)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let out = self.script(&["down"]);
        if !out.status.success() {
            eprintln!(
                "scripts/stack down failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn readme_curl_transcripts_print_what_the_readme_says() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("read README.md");
    let steps = transcript::checked_steps(&readme);

    let stack = Stack::up();
    // Step 1 reads the workers' page: wait until they have written it once.
    stack.wait_for(
        "curl -s -o /dev/null -w '%{http_code}' localhost:8080/pages/demo",
        "200",
        Duration::from_secs(60),
    );

    let mut failures = Vec::new();
    let mut vars = transcript::Vars::default();
    for (step, run) in &steps {
        let result = transcript::run_step(step, run, &mut vars, |command, vars| {
            stack.sh_with(command, vars)
        });
        if let Err(failure) = result {
            failures.push(failure);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The acknowledged PUTs of page `demo` whose line is not in the page now
/// (history first, then the page: see `transcript::lost_edits`).
fn lost_edits(stack: &Stack) -> Vec<serde_json::Value> {
    let history = stack.history();
    let page: serde_json::Value =
        serde_json::from_str(&stack.sh("curl -sf localhost:8080/pages/demo")).expect("page JSON");
    transcript::lost_edits(&history, page["body"].as_str().expect("body"))
}

#[test]
fn straggler_is_refused_by_the_fence_and_loses_an_update_without_it() {
    let stack = Stack::up();
    stack.wait_for(
        "curl -s -o /dev/null -w '%{http_code}' localhost:8080/pages/demo",
        "200",
        Duration::from_secs(60),
    );

    // Step 5: through the fenced gateway the late PUT is refused, nothing
    // written, and every acknowledged edit is still in the page.
    let (get, put, between) = stack.straggle("straggler");
    // Refused by the issuer check (its lease is gone: the lock service names
    // another holder, or none) or, had the check raced with the lease's end,
    // by the fence.
    assert!(
        put["outcome"] == "token_not_current" || put["outcome"] == "stale_token",
        "the straggler's PUT: {put}"
    );
    assert_eq!(put["token"], get["token"]);
    assert!(put["fence_token"].as_i64() > put["token"].as_i64(), "{put}");
    assert!(
        between
            .iter()
            .any(|e| e["method"] == "PUT" && e["outcome"] == "accepted"),
        "other workers edited while it was frozen"
    );
    assert_eq!(
        lost_edits(&stack),
        Vec::<serde_json::Value>::new(),
        "lost updates with fencing on"
    );

    // Step 6: through the unfenced gateway it lands (marked `stale`), and an
    // acknowledged edit is gone: the others' lines written while it was
    // frozen (its stale body replaced them), or its own line, when a worker
    // that had read before its PUT wrote after it.
    let (_, put, _) = stack.straggle("straggler-unfenced");
    assert_eq!(
        put["outcome"], "stale",
        "the unfenced straggler's PUT: {put}"
    );
    // No wait needed: from its PUT on, one of the two losses has happened.
    let lost = lost_edits(&stack);
    assert!(
        !lost.is_empty(),
        "no acknowledged edit was lost without fencing"
    );
}

/// The highest token among accepted PUTs of page `demo` (ZooKeeper's tokens
/// only grow, whatever happens to PostgreSQL).
fn highest_accepted_token(history: &[serde_json::Value]) -> i64 {
    history
        .iter()
        .filter(|e| e["method"] == "PUT" && e["outcome"] == "accepted")
        .filter_map(|e| e["token"].as_i64())
        .max()
        .unwrap_or(0)
}

impl Stack {
    /// Page `demo`'s history, or `None` while the balancer has no gateway
    /// with a primary (a failover in progress).
    fn try_history(&self) -> Option<Vec<serde_json::Value>> {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "10"])
            .arg(format!(
                "http://127.0.0.1:{}/pages/demo/history?limit=10000",
                self.gateway
            ))
            .output()
            .expect("run curl");
        if !out.status.success() {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let mut entries = v["history"].as_array()?.clone();
        entries.reverse();
        Some(entries)
    }

    /// Wait (bounded) until each of `workers` has a PUT accepted with a token
    /// above `above`: it edited after whatever happened at that token.
    #[track_caller]
    fn wait_workers_edit_after(&self, workers: &[&str], above: i64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let history = self.try_history().unwrap_or_default();
            let missing: Vec<&&str> = workers
                .iter()
                .filter(|w| {
                    !history.iter().any(|e| {
                        e["client_id"] == **w
                            && e["method"] == "PUT"
                            && e["outcome"] == "accepted"
                            && e["token"].as_i64().is_some_and(|t| t > above)
                    })
                })
                .collect();
            if missing.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "{missing:?} got no edit acknowledged after token {above} within {timeout:?}\n--- logs ---\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    #[track_caller]
    fn run_ok(&self, args: &[&str]) -> String {
        let out = self.script(args);
        assert!(
            out.status.success(),
            "scripts/stack {}: {}\n--- logs ---\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// README steps 12 and 13 (issue 15) with the workers in view: `gateway-2`
/// (which worker-2's key is balanced to) is SIGKILLed and every worker, worker-2
/// included, gets edits acknowledged through the other gateway, none lost;
/// then the PostgreSQL primary is killed and the standby promoted, and every
/// worker gets edits acknowledged on the new primary. The standby is
/// asynchronous, so what the failover lost is printed, not asserted.
#[test]
fn workers_go_on_through_the_balancer_when_a_gateway_dies_and_after_a_failover() {
    let stack = Stack::up();
    let workers = ["worker-1", "worker-2", "worker-3"];
    stack.wait_for(
        "curl -s -o /dev/null -w '%{http_code}' localhost:8080/pages/demo",
        "200",
        Duration::from_secs(60),
    );
    stack.wait_workers_edit_after(&workers, 0, Duration::from_secs(60));

    let before_kill = highest_accepted_token(&stack.history());
    stack.run_ok(&["kill", "gateway-2"]);
    assert_eq!(stack.state("gateway-2"), "exited");
    stack.wait_workers_edit_after(&workers, before_kill, Duration::from_secs(60));
    assert_eq!(
        lost_edits(&stack),
        Vec::<serde_json::Value>::new(),
        "a killed gateway cost an acknowledged edit"
    );

    let before_failover = highest_accepted_token(&stack.history());
    stack.run_ok(&["kill", "postgres"]);
    // No primary: refused, never served from the standby.
    let status = stack.sh("curl -s -o /dev/null -w '%{http_code}' localhost:8080/pages/demo");
    assert_eq!(status, "503");
    let promoted = stack.run_ok(&[
        "exec",
        "-T",
        "postgres-standby",
        "psql",
        "-U",
        "postgres",
        "-tAc",
        "select pg_promote()",
    ]);
    assert_eq!(promoted.trim(), "t");
    stack.wait_workers_edit_after(&workers, before_failover, Duration::from_secs(90));
    let lost = lost_edits(&stack);
    eprintln!(
        "asynchronous standby, as measured: {} acknowledged edit(s) lost in the failover: {lost:?}",
        lost.len()
    );
    // The old primary must not come back beside the promoted standby.
    let out = stack.script(&["restart", "postgres"]);
    assert!(
        !out.status.success(),
        "restarting the old primary was allowed"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("split brain"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
