//! A `worker` binary run as a real process, its JSONL stdout read as a stream
//! of events.
//!
//! The binary is the one cargo built next to the test binary (`scripts/test`
//! runs `cargo build --workspace --bins` first). Like every harness process it
//! dies with the test binary (PDEATHSIG) and is killed and reaped on drop. Its
//! stderr (the human logs) goes to a temp file whose tail ends up in panic
//! messages.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::sync::mpsc;

/// One event line of the worker: `{"event": ..., "client", "page", "edit", ...}`.
pub type WorkerEvent = Value;

/// How long an awaited event may take before the test fails.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`WorkerProcess::wait_summary`] waits for a worker to finish.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// The `worker` binary next to the running test binary (`target/<profile>/worker`).
pub fn worker_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test-binary>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps");
    let bin = profile_dir.join("worker");
    assert!(
        bin.is_file(),
        "the worker binary is missing at {}: build it first with `cargo build --workspace --bins` \
         (scripts/test does)",
        bin.display()
    );
    bin
}

/// A running worker process and the events it printed so far.
pub struct WorkerProcess {
    child: Child,
    pid: u32,
    events: mpsc::UnboundedReceiver<WorkerEvent>,
    /// Every event received, in order.
    seen: Vec<WorkerEvent>,
    stderr_log: tempfile::NamedTempFile,
}

impl WorkerProcess {
    /// Spawn the worker with `args` (`--events jsonl` is added) and extra env.
    /// The env of the test binary is cleared of the worker's variables so that
    /// only what the test passes counts.
    pub fn spawn<A, S, E, K, V>(args: A, envs: E) -> WorkerProcess
    where
        A: IntoIterator<Item = S>,
        S: AsRef<str>,
        E: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let stderr_log = tempfile::NamedTempFile::new().expect("temp file for worker stderr");
        let mut cmd = Command::new(worker_binary());
        for var in [
            "WORKER_BACKEND",
            "REDIS_URL",
            "REDIS_SENTINELS",
            "REDIS_SENTINEL_MASTER",
            "REDIS_WAIT_REPLICAS",
            "REDIS_WAIT_TIMEOUT",
            "REDLOCK_URLS",
            "ZOOKEEPER_CONNECT",
            "DATABASE_URL",
            "MYSQL_URL",
            "WORKER_GATEWAY",
            "WORKER_PAGE",
            "WORKER_CLIENT_ID",
            "WORKER_API_KEY",
            "WORKER_EDITS",
            "WORKER_DURATION",
            "WORKER_TTL",
            "WORKER_WAIT",
            "WORKER_WORK_MS",
            "WORKER_FENCING",
            "WORKER_IF_MATCH",
            "WORKER_EVENTS",
            "WORKER_STOP_SELF_AT",
        ] {
            cmd.env_remove(var);
        }
        cmd.args(args.into_iter().map(|a| a.as_ref().to_string()))
            .args(["--events", "jsonl"])
            .envs(
                envs.into_iter()
                    .map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string())),
            )
            .env(
                "RUST_LOG",
                std::env::var("WORKER_TEST_LOG").unwrap_or_else(|_| "worker=debug".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr_log.reopen().expect("reopen worker stderr log"));
        let mut child = crate::process::spawn_tied_to_test(cmd).expect("spawn the worker binary");
        let pid = child.id();
        let stdout = child.stdout.take().expect("piped stdout");
        let (events_tx, events) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name(format!("worker-{pid}-stdout"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let event = serde_json::from_str(&line).unwrap_or_else(|e| {
                        serde_json::json!({"event": "unparsable", "line": line, "error": e.to_string()})
                    });
                    if events_tx.send(event).is_err() {
                        break;
                    }
                }
            })
            .expect("spawn stdout reader thread");
        WorkerProcess {
            child,
            pid,
            events,
            seen: Vec::new(),
            stderr_log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Every event received so far, in order.
    pub fn events(&self) -> &[WorkerEvent] {
        &self.seen
    }

    /// The next event, or `None` once stdout is closed (the worker exited).
    /// Panics (with the worker's log) if none comes within [`EVENT_TIMEOUT`].
    pub async fn next_event(&mut self) -> Option<WorkerEvent> {
        match tokio::time::timeout(EVENT_TIMEOUT, self.events.recv()).await {
            Ok(Some(e)) => {
                self.seen.push(e.clone());
                Some(e)
            }
            Ok(None) => None,
            Err(_) => panic!(
                "worker {} printed no event for {EVENT_TIMEOUT:?}; last events: {:?}\n--- its log:\n{}",
                self.pid,
                self.seen.iter().rev().take(5).collect::<Vec<_>>(),
                self.log_tail(40)
            ),
        }
    }

    /// Read events until one named `name` arrives, and return it. Panics if the
    /// worker exits first.
    pub async fn wait_for_event(&mut self, name: &str) -> WorkerEvent {
        loop {
            match self.next_event().await {
                Some(e) if e["event"] == name => return e,
                Some(_) => {}
                None => panic!(
                    "worker {} exited before emitting `{name}`; events: {:?}\n--- its log:\n{}",
                    self.pid,
                    self.seen,
                    self.log_tail(40)
                ),
            }
        }
    }

    /// Read all events until the worker's stdout closes, wait for it to exit,
    /// and return the final `summary` event with the exit status.
    /// Panics if that takes longer than [`RUN_TIMEOUT`].
    pub async fn wait_summary(&mut self) -> (WorkerEvent, ExitStatus) {
        self.wait_summary_within(RUN_TIMEOUT).await
    }

    /// [`WorkerProcess::wait_summary`] for runs longer than [`RUN_TIMEOUT`].
    pub async fn wait_summary_within(&mut self, limit: Duration) -> (WorkerEvent, ExitStatus) {
        let deadline = tokio::time::Instant::now() + limit;
        while self.next_event().await.is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "worker {} still running after {limit:?}; last events: {:?}\n--- its log:\n{}",
                self.pid,
                self.seen.iter().rev().take(5).collect::<Vec<_>>(),
                self.log_tail(40)
            );
        }
        let status = self.wait_exit(EVENT_TIMEOUT).await;
        let summary = self
            .seen
            .iter()
            .rev()
            .find(|e| e["event"] == "summary")
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "worker {} exited ({status}) without a summary; events: {:?}\n--- its log:\n{}",
                    self.pid,
                    self.seen,
                    self.log_tail(40)
                )
            });
        (summary, status)
    }

    /// Wait up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait on worker") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "worker {} still running after {timeout:?}\n--- its log:\n{}",
                self.pid,
                self.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn signal(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.pid as i32), signal);
    }

    /// SIGSTOP: the whole process freezes, watchdog and heartbeats included.
    pub fn sigstop(&self) {
        self.signal(Signal::SIGSTOP);
    }

    pub fn sigcont(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// SIGTERM: the worker finishes or abandons its edit, releases, and exits 0.
    pub fn terminate(&self) {
        self.signal(Signal::SIGTERM);
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        self.signal(Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the kernel reports the process as stopped (state `T` in /proc).
    pub fn is_stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.trim_start().chars().next())
            })
            .is_some_and(|state| state == 'T')
    }

    /// The last `n` lines of the worker's stderr log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.stderr_log.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}
