//! `scripts/stack` (the compose.yaml topology from Debian's packages) for a
//! test: in a temp state dir, on free ports passed through its `STACK_*`
//! variables, with the gateway and worker binaries that `cargo build
//! --workspace --bins` left in the target dir. `scripts/stack down` runs on
//! drop, also when an assertion fails.
//!
//! (tests/tests/tutorial.rs has its own copy of this, with the README's
//! transcript checks around it.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use tempfile::TempDir;

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

/// A running `scripts/stack`, stopped on drop.
pub struct Stack {
    _state: TempDir,
    env: Vec<(String, String)>,
    gateway: u16,
    unfenced: u16,
}

/// Free ports for the replicated services of `scripts/stack` (issue 14):
/// the ZooKeeper ensemble's client, quorum and election ports, the Sentinel
/// group's two Redis servers and three sentinels, as `STACK_*` variables.
pub fn replicated_ports() -> Vec<(String, String)> {
    let ports = |n: usize| {
        (0..n)
            .map(|_| crate::free_port().to_string())
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
    /// `scripts/stack up` with the default backend (ZooKeeper); panics with
    /// the stack's logs when it does not come up.
    pub fn up(prefix: &str) -> Stack {
        Self::up_with(prefix, "zookeeper")
    }

    /// `BACKEND=<backend> scripts/stack up`.
    pub fn up_with(prefix: &str, backend: &str) -> Stack {
        let state = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("temp dir");
        // Run as root, PostgreSQL runs as `postgres` and must get through this dir.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod state dir");
        let port = || crate::free_port().to_string();
        let gateway = crate::free_port();
        let unfenced = crate::free_port();
        let gateway_1 = crate::free_port();
        let gateway_2 = crate::free_port();
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
            // Never inherit the caller's choice.
            ("BACKEND".into(), backend.into()),
        ];
        let env = [env, replicated_ports()].concat();
        let stack = Stack {
            _state: state,
            env,
            gateway,
            unfenced,
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

    /// `http://127.0.0.1:PORT` of the fenced gateway (the README's :8080).
    pub fn gateway_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.gateway)
    }

    /// The unfenced gateway (the README's :8081).
    pub fn unfenced_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.unfenced)
    }

    /// Run `scripts/stack ARGS` with this stack's variables.
    pub fn script(&self, args: &[&str]) -> Output {
        Command::new(repo().join("scripts/stack"))
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env_remove("WORKER_GATEWAY")
            .env_remove("WORKER_FENCING")
            .env_remove("WORKER_FAIR")
            .output()
            .expect("run scripts/stack")
    }

    /// `scripts/stack ARGS`, which must succeed.
    #[track_caller]
    pub fn run(&self, args: &[&str]) {
        let out = self.script(args);
        assert!(
            out.status.success(),
            "scripts/stack {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every service's log, prefixed like `docker compose logs`.
    pub fn logs(&self) -> String {
        String::from_utf8_lossy(&self.script(&["logs"]).stdout).into_owned()
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

    /// `curl -sf URL` through the fenced gateway: the body, or `None` on an
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
        let deadline = Instant::now() + timeout;
        while self.curl(&format!("/pages/{id}")).is_none() {
            if Instant::now() > deadline {
                panic!(
                    "page {id} was not written within {timeout:?}\n--- logs ---\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Page `id`'s history, oldest first.
    #[track_caller]
    pub fn history(&self, id: &str) -> Vec<serde_json::Value> {
        let got = self
            .curl(&format!("/pages/{id}/history?limit=10000"))
            .expect("history answers");
        let v: serde_json::Value = serde_json::from_str(&got).expect("history JSON");
        let mut entries = v["history"].as_array().expect("history array").clone();
        entries.reverse();
        entries
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
