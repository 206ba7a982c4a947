//! A `worker` binary run as a real process with `--events jsonl`: its events
//! go into an [`EventLog`], its stderr (the human logs) into a temp file whose
//! tail ends up in error messages.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use super::binary::binary;
use super::events::{now_ms, Event, EventLog};
use super::gateway::api_key;

/// The worker's variables in the runner's own environment: cleared, so that
/// only what the spec passes counts.
const WORKER_ENV: &[&str] = &[
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
];

/// How to start one worker.
#[derive(Debug, Clone, Default)]
pub struct WorkerSpec {
    /// The name its events carry in the log.
    pub client: String,
    pub args: Vec<String>,
    /// Extra environment (LD_PRELOAD for libfaketime...).
    pub env: Vec<(String, String)>,
}

impl WorkerSpec {
    /// A worker whose events are labelled `client`; its flags are the caller's.
    pub fn new(client: impl Into<String>) -> Self {
        Self {
            client: client.into(),
            ..Self::default()
        }
    }

    /// The worker of `client` (`--client-id`) with its API key (see
    /// [`api_key`]) in the environment rather than argv, as a real
    /// deployment would.
    pub fn keyed(client: &str) -> Self {
        Self::new(client)
            .arg("--client-id", client)
            .env("WORKER_API_KEY", api_key(client))
    }

    pub fn arg(mut self, name: &str, value: impl ToString) -> Self {
        self.args.push(name.to_string());
        self.args.push(value.to_string());
        self
    }

    pub fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Replace the value of flag `name` (add it if absent).
    pub fn set(mut self, name: &str, value: impl ToString) -> Self {
        match self.args.iter().position(|a| a == name) {
            Some(i) if i + 1 < self.args.len() => {
                self.args[i + 1] = value.to_string();
                self
            }
            _ => self.arg(name, value),
        }
    }

    pub fn env(mut self, name: &str, value: impl ToString) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// The `worker` command of this spec with `--events jsonl`, its log
    /// level and its environment; where its output goes is the caller's.
    pub fn command(&self) -> anyhow::Result<Command> {
        let mut cmd = Command::new(binary("worker")?);
        for var in WORKER_ENV {
            cmd.env_remove(var);
        }
        cmd.args(&self.args)
            .args(["--events", "jsonl"])
            .env(
                "RUST_LOG",
                std::env::var("WORKER_TEST_LOG").unwrap_or_else(|_| "worker=debug,info".into()),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        Ok(cmd)
    }
}

/// A running worker. Like every harness process it dies with the runner
/// (PDEATHSIG), and is killed and reaped on drop.
pub struct WorkerProc {
    pub client: String,
    child: Child,
    pid: u32,
    /// Set once the child is reaped: its pid may belong to another process.
    reaped: bool,
    /// Set once its stdout closed: no event will come any more.
    stdout_closed: Arc<AtomicBool>,
    stderr_log: tempfile::NamedTempFile,
    /// Unix ms when the runner killed it, if it did.
    pub killed_at: Option<i64>,
}

impl WorkerProc {
    /// Start the worker of `spec`; its events go into `log`.
    pub fn spawn(spec: &WorkerSpec, log: &EventLog) -> anyhow::Result<Self> {
        let stderr_log = tempfile::Builder::new()
            .prefix("worker-")
            .suffix(".log")
            .tempfile()?;
        let mut cmd = spec.command()?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr_log.reopen()?);
        let mut child = crate::process::spawn_tied_to_test(cmd).context("spawn the worker")?;
        let pid = child.id();
        let stdout = child.stdout.take().context("worker stdout")?;
        let stdout_closed = Arc::new(AtomicBool::new(false));
        let (log, client, closed) = (log.clone(), spec.client.clone(), stdout_closed.clone());
        std::thread::Builder::new()
            .name(format!("worker-{pid}-stdout"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let json = serde_json::from_str::<Value>(&line).unwrap_or_else(|e| {
                        serde_json::json!({"event": "unparsable", "line": line, "error": e.to_string()})
                    });
                    log.push(Event {
                        client: client.clone(),
                        json,
                        received_ms: now_ms(),
                    });
                }
                closed.store(true, Ordering::SeqCst);
                log.wake();
            })
            .context("spawn the worker's stdout reader")?;
        Ok(Self {
            client: spec.client.clone(),
            child,
            pid,
            reaped: false,
            stdout_closed,
            stderr_log,
            killed_at: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether its stdout closed (it exited): every event it printed is in the log.
    pub fn stdout_closed(&self) -> bool {
        self.stdout_closed.load(Ordering::SeqCst)
    }

    pub fn signal(&self, signal: Signal) {
        if !self.reaped {
            let _ = kill(Pid::from_raw(self.pid as i32), signal);
        }
    }

    /// A GC pause from outside: the whole process freezes, watchdog and
    /// heartbeats included.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// SIGTERM: the worker finishes or abandons its edit, releases, and exits 0.
    pub fn terminate(&self) {
        self.signal(Signal::SIGTERM);
    }

    /// A crash: SIGKILL, reaped.
    pub fn crash(&mut self) {
        if self.reaped {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
        self.killed_at = Some(now_ms());
    }

    /// Whether the process is in the stopped state (`T` in /proc/PID/stat).
    pub fn is_stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|s| {
                let state = s.rsplit_once(')')?.1.trim_start().chars().next()?;
                Some(state == 'T' || state == 't')
            })
            .unwrap_or(false)
    }

    /// Wait until the worker has really stopped itself (after `--stop-self-at`).
    pub async fn wait_stopped(&self, timeout: Duration) -> anyhow::Result<()> {
        crate::wait_until(timeout, || async {
            if self.is_stopped() {
                Ok(())
            } else {
                Err(anyhow::anyhow!("worker {} is not stopped", self.client))
            }
        })
        .await
    }

    /// Its exit status once it exited, within `timeout`.
    pub async fn exit_status(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.reaped = true;
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait for the process to exit on its own; kill it after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<()> {
        if self.exit_status(timeout).await.is_some() {
            return Ok(());
        }
        self.crash();
        bail!(
            "STUCK: worker {} did not finish within {timeout:?} (killed); stderr tail:\n{}",
            self.client,
            self.stderr_tail(20)
        )
    }

    /// The last `n` lines of its stderr.
    pub fn stderr_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.stderr_log.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.crash();
        }
    }
}
