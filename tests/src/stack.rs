//! `scripts/stack` (the compose.yaml topology from Debian's packages) for a
//! test: in a temp state dir, on free ports passed through its `STACK_*`
//! variables (so nothing collides with another test or a stack a person
//! runs), with the gateway and worker binaries that `cargo build --workspace
//! --bins` left in the target dir. `scripts/stack down` runs on drop, also
//! when an assertion fails.
//!
//! The README's commands run against it with [`Stack::sh`]: its ports
//! (`localhost:8080` the balancer, `:8081` the unfenced gateway, `:8082` and
//! `:8083` the two fenced gateways) are rewritten to the stack's, and
//! `docker compose` becomes `scripts/stack`, which has the subcommands the
//! README uses.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::process::{free_port, run_ok};
use crate::transcript;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// The target dir's profile dir (…/target/debug), where `cargo build --bins`
/// put the gateway and worker binaries: the test binary is in its `deps/`.
pub fn bin_dir() -> PathBuf {
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

/// The worker settings a caller's environment may hold: never inherited.
const CALLERS_WORKER_VARS: [&str; 3] = ["WORKER_GATEWAY", "WORKER_FENCING", "WORKER_FAIR"];

/// How many stacks one test process runs at once: each is some twenty
/// processes, three JVMs among them. The README tutorial's three tests ran
/// three at once when they had a test binary of their own; now that every
/// stack test shares one, this keeps that bound.
pub const MAX_AT_ONCE: usize = 3;

/// A place among [`MAX_AT_ONCE`], held by a running stack.
struct Slot;

static TAKEN: Mutex<usize> = Mutex::new(0);
static FREED: Condvar = Condvar::new();

impl Slot {
    /// Wait for a free place.
    fn take() -> Slot {
        let mut taken = TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
        while *taken >= MAX_AT_ONCE {
            taken = FREED.wait(taken).unwrap_or_else(PoisonError::into_inner);
        }
        *taken += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *TAKEN.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        FREED.notify_one();
    }
}

/// A running `scripts/stack`, stopped on drop.
pub struct Stack {
    _state: TempDir,
    env: Vec<(String, String)>,
    /// The balancer in front of the two fenced gateways (the README's :8080).
    gateway: u16,
    /// The unfenced gateway (the README's :8081).
    unfenced: u16,
    /// The fenced gateways themselves (the README's :8082 and :8083).
    gateways: [u16; 2],
    // Dropped after `Drop::drop` has taken the stack down.
    _slot: Slot,
}

/// One straggler of the README (steps 5 and 6), as the history tells it.
pub struct Straggle {
    /// Its fenced GET, with the token it then kept while frozen.
    pub get: Value,
    /// Its late PUT with that token.
    pub put: Value,
    /// What the history holds between the two.
    pub between: Vec<Value>,
}

/// Free ports for the replicated services of `scripts/stack`: the ZooKeeper
/// ensemble's client, quorum and election ports, the Sentinel group's two
/// Redis servers and three sentinels, as `STACK_*` variables.
pub fn replicated_ports() -> Vec<(String, String)> {
    let ports = |n: usize| {
        (0..n)
            .map(|_| free_port().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    vec![
        ("STACK_ZOOKEEPER_PORTS".into(), ports(3)),
        ("STACK_ZOOKEEPER_PEER_PORTS".into(), ports(6)),
        ("STACK_SENTINEL_REDIS_PORTS".into(), ports(2)),
        ("STACK_SENTINEL_PORTS".into(), ports(3)),
    ]
}

impl Stack {
    /// `scripts/stack up` with the README's default backend (ZooKeeper);
    /// panics with the stack's logs when it does not come up.
    pub fn up(prefix: &str) -> Stack {
        Self::up_with(prefix, "zookeeper")
    }

    /// `BACKEND=<backend> scripts/stack up`.
    pub fn up_with(prefix: &str, backend: &str) -> Stack {
        let slot = Slot::take();
        let state = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("temp dir");
        // Run as root, PostgreSQL runs as `postgres` and must get through this dir.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod state dir");
        let port = || free_port().to_string();
        let gateway = free_port();
        let unfenced = free_port();
        let gateways = [free_port(), free_port()];
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
            // The standby and the two fenced gateways behind the balancer
            // (STACK_GATEWAY_PORT is the balancer).
            ("STACK_POSTGRES_STANDBY_PORT".into(), port()),
            ("STACK_GATEWAY_1_PORT".into(), gateways[0].to_string()),
            ("STACK_GATEWAY_2_PORT".into(), gateways[1].to_string()),
            ("STACK_GATEWAY_1_PROBE_PORT".into(), port()),
            ("STACK_GATEWAY_2_PROBE_PORT".into(), port()),
            ("STACK_REDIS_PORT".into(), port()),
            ("STACK_MARIADB_PORT".into(), port()),
            ("STACK_REDLOCK_PORTS".into(), redlock.join(" ")),
            // Never inherit the caller's choice.
            ("BACKEND".into(), backend.into()),
        ];
        let env = [env, replicated_ports()].concat();
        let stack = Stack {
            _state: state,
            env,
            gateway,
            unfenced,
            gateways,
            _slot: slot,
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

    /// `http://127.0.0.1:PORT` of the balancer in front of the fenced
    /// gateways (the README's :8080).
    pub fn gateway_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.gateway)
    }

    /// The unfenced gateway (the README's :8081).
    pub fn unfenced_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.unfenced)
    }

    /// `program` with this stack's variables and none of the caller's
    /// worker settings.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        for var in CALLERS_WORKER_VARS {
            command.env_remove(var);
        }
        command
    }

    /// Run `scripts/stack ARGS` with this stack's variables.
    pub fn script(&self, args: &[&str]) -> Output {
        self.command(repo().join("scripts/stack"))
            .args(args)
            .output()
            .expect("run scripts/stack")
    }

    /// `scripts/stack ARGS`, which must succeed; what it printed.
    #[track_caller]
    pub fn run(&self, args: &[&str]) -> String {
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

    /// Every service's log, prefixed like `docker compose logs`.
    pub fn logs(&self) -> String {
        String::from_utf8_lossy(&self.script(&["logs"]).stdout).into_owned()
    }

    /// Run a README command, with the documented ports replaced by ours.
    #[track_caller]
    pub fn sh(&self, command: &str) -> String {
        self.sh_with(command, &[])
    }

    /// Run a README command with the variables captured so far, the
    /// documented ports replaced by ours and `docker compose` by our stack.
    #[track_caller]
    pub fn sh_with(&self, command: &str, vars: &[(String, String)]) -> String {
        let stack = repo().join("scripts/stack");
        let command = command
            .replace("localhost:8080", &format!("127.0.0.1:{}", self.gateway))
            .replace("localhost:8081", &format!("127.0.0.1:{}", self.unfenced))
            .replace("localhost:8082", &format!("127.0.0.1:{}", self.gateways[0]))
            .replace("localhost:8083", &format!("127.0.0.1:{}", self.gateways[1]))
            .replace("docker compose ", &format!("{} ", stack.display()));
        let out = run_ok(
            self.command("sh")
                .args(["-c", &command])
                .envs(vars.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null()),
        );
        String::from_utf8_lossy(&out.stdout).replace('\r', "")
    }

    /// Check `done` every `every` until it holds; after `timeout`, panic
    /// with what it said last and the stack's logs.
    #[track_caller]
    pub fn poll(
        &self,
        timeout: Duration,
        every: Duration,
        mut done: impl FnMut() -> Result<(), String>,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match done() {
                Ok(()) => return,
                Err(last) => last,
            };
            if Instant::now() > deadline {
                panic!("after {timeout:?}: {last}\n--- logs ---\n{}", self.logs());
            }
            std::thread::sleep(every);
        }
    }

    /// Wait (bounded) until `command` prints something matching `expected`.
    #[track_caller]
    pub fn wait_for(&self, command: &str, expected: &str, timeout: Duration) {
        self.poll(timeout, Duration::from_millis(200), || {
            let got = self.sh(command);
            if transcript::line_matches(expected, got.trim_end()) {
                Ok(())
            } else {
                Err(format!(
                    "`{command}` never printed {expected:?} (last: {got:?})"
                ))
            }
        });
    }

    /// The state `scripts/stack status` reports for `name` (running, paused,
    /// exited, absent).
    pub fn state(&self, name: &str) -> String {
        let out = self.script(&["status"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| {
                let mut words = l.split_whitespace();
                (words.next() == Some(name)).then(|| words.next().unwrap_or("").to_owned())
            })
            .unwrap_or_else(|| "absent".into())
    }

    /// Wait (bounded) until `name` is in state `want`.
    #[track_caller]
    pub fn wait_state(&self, name: &str, want: &str, timeout: Duration) {
        self.poll(timeout, Duration::from_millis(100), || {
            match self.state(name) {
                state if state == want => Ok(()),
                state => Err(format!("{name} is {state}, not {want}")),
            }
        });
    }

    /// `curl -sf` of `path` through the balancer: the body, or `None` on an
    /// HTTP error or no answer.
    pub fn curl(&self, path: &str) -> Option<String> {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "10"])
            .arg(format!("{}{path}", self.gateway_url()))
            .output()
            .expect("run curl");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Wait (bounded) until page `id` has been written once.
    #[track_caller]
    pub fn wait_for_page(&self, id: &str, timeout: Duration) {
        self.poll(timeout, Duration::from_millis(200), || {
            match self.curl(&format!("/pages/{id}")) {
                Some(_) => Ok(()),
                None => Err(format!("page {id} was not written")),
            }
        });
    }

    /// Page `id`'s history, oldest first, or `None` while no gateway with a
    /// primary answers (a failover in progress).
    pub fn try_history(&self, id: &str) -> Option<Vec<Value>> {
        let mut entries: Vec<Value> = Vec::new();
        loop {
            let before = entries
                .last()
                .map_or(i64::MAX, |e| e["seq"].as_i64().unwrap_or(0));
            let got = self.curl(&format!("/pages/{id}/history?limit=1000&before={before}"))?;
            let v: Value = serde_json::from_str(&got).ok()?;
            let page = v["history"].as_array()?.clone();
            let full = page.len() == 1000;
            entries.extend(page);
            if !full {
                break;
            }
        }
        entries.reverse();
        Some(entries)
    }

    /// Page `id`'s history, oldest first.
    #[track_caller]
    pub fn history(&self, id: &str) -> Vec<Value> {
        self.try_history(id).expect("the history answers, as JSON")
    }

    /// The acknowledged PUTs of page `id` whose line is not in the page now
    /// (history first, then the page: see [`transcript::lost_edits`]).
    #[track_caller]
    pub fn lost_edits(&self, id: &str) -> Vec<Value> {
        let history = self.history(id);
        let page: Value = serde_json::from_str(
            &self
                .curl(&format!("/pages/{id}"))
                .expect("the page answers"),
        )
        .expect("page JSON");
        transcript::lost_edits(&history, page["body"].as_str().expect("body"))
    }

    /// Run one straggler of page `demo` (README steps 5 and 6): start it,
    /// wait until it has frozen itself at `writing`, keep it frozen past its
    /// TTL until another worker has written with a higher token (the lock
    /// moved on), resume it, and wait for it to finish.
    #[track_caller]
    pub fn straggle(&self, name: &str) -> Straggle {
        self.run(&["start", name]);
        self.wait_state(name, "paused", Duration::from_secs(60));
        let mine = |e: &Value| e["client_id"] == name;
        let get = self
            .history("demo")
            .into_iter()
            .find(|e| mine(e) && e["method"] == "GET")
            .expect("the straggler's fenced GET is in the history");
        let token = get["token"].as_i64().expect("its token");
        // The scenario: stay frozen past the 2 s TTL...
        std::thread::sleep(Duration::from_secs(3));
        // ...until the lock has moved on: another worker took it (a higher
        // token) and got an edit acknowledged.
        self.poll(Duration::from_secs(60), Duration::from_millis(100), || {
            let moved_on = self
                .history("demo")
                .iter()
                .any(|e| !mine(e) && accepted(e) && e["token"].as_i64().is_some_and(|t| t > token));
            match moved_on {
                true => Ok(()),
                false => Err(format!(
                    "no other worker took the lock and wrote while {name} was frozen"
                )),
            }
        });
        self.run(&["unpause", name]);
        self.wait_state(name, "exited", Duration::from_secs(30));
        let history = self.history("demo");
        let at = |e: &Value| history.iter().position(|h| h["seq"] == e["seq"]);
        let put = history
            .iter()
            .find(|e| mine(e) && e["method"] == "PUT")
            .unwrap_or_else(|| panic!("{name} sent no PUT\n{}", self.logs()))
            .clone();
        let between = match (at(&get), at(&put)) {
            (Some(g), Some(p)) if g < p => history[g + 1..p].to_vec(),
            _ => vec![],
        };
        Straggle { get, put, between }
    }
}

/// Whether a history entry is a PUT the gateway accepted.
pub fn accepted(entry: &Value) -> bool {
    entry["method"] == "PUT" && entry["outcome"] == "accepted"
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
