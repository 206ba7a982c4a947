//! The project's own binaries as child processes: the worker (whose JSONL
//! events the runner reads) and the gateway.
//!
//! The runner spawns the real binaries rather than linking the libraries, so a
//! SIGSTOP stops a whole client, a SIGKILL is a real crash, and a worker can run
//! under libfaketime. Build them first: `cargo build -p worker -p gateway`
//! (`scripts/test` does).
//!
//! Trust is on, as in the demo: the gateway requires API keys (one per client
//! in [`CLIENTS`], each worker sends its own) and, with its fence on, checks
//! every token with the lock service that issued it.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Notify;

fn bin_dir() -> anyhow::Result<PathBuf> {
    Ok(match std::env::var_os("CHAOS_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let exe = std::env::current_exe().context("current exe")?;
            let mut dir = exe.parent().context("exe dir")?.to_path_buf();
            if dir.ends_with("deps") {
                dir.pop();
            }
            dir
        }
    })
}

/// The pinned copies of earlier runs (a static's temp dir is never dropped):
/// remove those older than an hour, which no live run still uses.
fn remove_stale_snapshots(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(3600));
        if old
            && entry
                .file_name()
                .to_string_lossy()
                .starts_with("chaos-bin-")
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Unix time in ms, the unit of the worker's `ts`.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The project's binary `name`, pinned for the whole run: the first call
/// hard-links (or copies) it into a private temp dir, so that a rebuild of the
/// shared target dir in the middle of a run cannot mix two versions.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    static SNAPSHOT: OnceLock<Mutex<(Option<tempfile::TempDir>, Vec<String>)>> = OnceLock::new();
    let snapshot = SNAPSHOT.get_or_init(|| Mutex::new((None, vec![])));
    let mut snap = snapshot.lock().expect("binary snapshot");
    if snap.0.is_none() {
        let dir = bin_dir()?;
        remove_stale_snapshots(&dir);
        snap.0 = Some(
            tempfile::Builder::new()
                .prefix("chaos-bin-")
                .tempdir_in(&dir)?,
        );
    }
    let pinned = snap.0.as_ref().expect("snapshot dir").path().join(name);
    if !snap.1.iter().any(|n| n == name) {
        let source = built_binary(name)?;
        if std::fs::hard_link(&source, &pinned).is_err() {
            std::fs::copy(&source, &pinned)
                .with_context(|| format!("copy {} to {}", source.display(), pinned.display()))?;
        }
        snap.1.push(name.to_string());
    }
    Ok(pinned)
}

/// Where the project's binaries are built: `$CHAOS_BIN_DIR`, else the cargo
/// target dir this executable runs from (`target/debug` or `target/debug/deps`).
fn built_binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = bin_dir()?.join(name);
    if !path.is_file() {
        bail!(
            "binary `{}` not found; build it first with `cargo build -p {name}` \
             (or set CHAOS_BIN_DIR)",
            path.display()
        );
    }
    Ok(path)
}

/// Every worker a scenario starts, by role: the gateway knows a key for each
/// (a scenario that starts another is refused with 401 and says so). One
/// row's workers have different roles; rows use different pages, so the same
/// role in two rows never shares a lock.
pub const CLIENTS: &[&str] = &[
    "paused",
    "other",
    "victim",
    "before",
    "after",
    "first",
    "second",
    "a",
    "b",
    "slow",
    "jumper",
    "bystander0",
    "bystander1",
    "bystander2",
    "bystander3",
];

/// The API key of a chaos client (never secret: test keys).
pub fn api_key(client: &str) -> String {
    format!("chaos-{client}-key-not-secret")
}

/// One JSONL event of a worker, with the runner's own receive time.
#[derive(Debug, Clone)]
pub struct Event {
    pub client: String,
    pub json: Value,
    /// Unix ms when the runner read the line.
    pub received_ms: i64,
}

impl Event {
    pub fn kind(&self) -> &str {
        self.json.get("event").and_then(Value::as_str).unwrap_or("")
    }

    pub fn u64(&self, field: &str) -> Option<u64> {
        self.json.get(field).and_then(Value::as_u64)
    }

    pub fn str(&self, field: &str) -> Option<&str> {
        self.json.get(field).and_then(Value::as_str)
    }

    /// The event's time: the worker's `ts`, unless the worker's clock is off by
    /// more than a minute (a worker under libfaketime), then the receive time.
    pub fn ts(&self) -> i64 {
        match self.json.get("ts").and_then(Value::as_i64) {
            Some(ts) if (ts - self.received_ms).abs() < 60_000 => ts,
            _ => self.received_ms,
        }
    }
}

/// Every event of every worker of one scenario, in arrival order.
#[derive(Clone, Default)]
pub struct EventLog {
    inner: Arc<(Mutex<Vec<Event>>, Notify)>,
}

impl EventLog {
    pub fn push(&self, e: Event) {
        self.inner.0.lock().expect("event log").push(e);
        self.inner.1.notify_waiters();
    }

    pub fn all(&self) -> Vec<Event> {
        self.inner.0.lock().expect("event log").clone()
    }

    /// Wait until an event matching `pred` is in the log (it may already be).
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Event) -> bool,
    ) -> anyhow::Result<Event> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(e) = self
                .inner
                .0
                .lock()
                .expect("event log")
                .iter()
                .find(|e| pred(e))
            {
                return Ok(e.clone());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                bail!("timed out after {timeout:?} waiting for {what}");
            }
        }
    }
}

/// A worker process started with `--events jsonl`.
pub struct WorkerProc {
    pub client: String,
    child: Child,
    stderr_log: tempfile::NamedTempFile,
    /// Unix ms when the runner killed it, if it did.
    pub killed_at: Option<i64>,
}

/// How to start one worker.
#[derive(Debug, Clone, Default)]
pub struct WorkerSpec {
    pub client: String,
    /// Flags as (name, value) pairs, e.g. ("--backend", "redis").
    pub args: Vec<(String, String)>,
    /// Extra environment (LD_PRELOAD for libfaketime...).
    pub env: Vec<(String, String)>,
}

impl WorkerSpec {
    pub fn arg(mut self, name: &str, value: impl ToString) -> Self {
        self.args.push((name.to_string(), value.to_string()));
        self
    }

    /// Replace the value of flag `name` (add it if absent).
    pub fn set(mut self, name: &str, value: impl ToString) -> Self {
        self.args.retain(|(k, _)| k != name);
        self.arg(name, value)
    }
}

impl WorkerProc {
    pub fn spawn(spec: &WorkerSpec, log: &EventLog) -> anyhow::Result<Self> {
        let stderr_log = tempfile::Builder::new()
            .prefix("chaos-worker-")
            .suffix(".log")
            .tempfile()?;
        let mut cmd = Command::new(binary("worker")?);
        for (k, v) in &spec.args {
            cmd.arg(k).arg(v);
        }
        cmd.arg("--client-id")
            .arg(&spec.client)
            .arg("--events")
            .arg("jsonl")
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "worker=debug,info")
            // In the environment rather than argv, as a real deployment would.
            .env("WORKER_API_KEY", api_key(&spec.client))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr_log.reopen()?)
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("spawn worker")?;
        let stdout = child.stdout.take().context("worker stdout")?;
        let log = log.clone();
        let client = spec.client.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(json) = serde_json::from_str::<Value>(&line) {
                    log.push(Event {
                        client: client.clone(),
                        json,
                        received_ms: now_ms(),
                    });
                }
            }
        });
        Ok(Self {
            client: spec.client.clone(),
            child,
            stderr_log,
            killed_at: None,
        })
    }

    pub fn pid(&self) -> Option<Pid> {
        self.child.id().map(|p| Pid::from_raw(p as i32))
    }

    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            let _ = kill(pid, signal);
        }
    }

    /// Whether the process is in the stopped state (`T` in /proc/PID/stat).
    pub fn is_stopped(&self) -> bool {
        let Some(pid) = self.pid() else { return false };
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let after = s.rsplit_once(')')?.1.trim_start().chars().next()?;
                Some(after == 'T' || after == 't')
            })
            .unwrap_or(false)
    }

    /// Wait until the worker has really stopped itself (after `--stop-self-at`).
    pub async fn wait_stopped(&self, timeout: Duration) -> anyhow::Result<()> {
        harness::wait_until(timeout, || async {
            if self.is_stopped() {
                Ok(())
            } else {
                Err(anyhow::anyhow!("worker {} is not stopped", self.client))
            }
        })
        .await
    }

    /// A GC pause from outside.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// A crash: SIGKILL, reaped.
    pub async fn crash(&mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.child.wait().await;
        self.killed_at = Some(now_ms());
    }

    /// Wait for the process to exit on its own; kill it after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<()> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => {
                status?;
                Ok(())
            }
            Err(_) => {
                self.resume();
                self.crash().await;
                bail!(
                    "STUCK: worker {} did not finish within {timeout:?} (killed); stderr tail:\n{}",
                    self.client,
                    self.stderr_tail(20)
                )
            }
        }
    }

    pub fn stderr_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.stderr_log.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        // A stopped process ignores SIGKILL until continued on some kernels' views
        // of job control; continue it first so kill_on_drop always reaps it.
        self.resume();
    }
}

/// The gateway binary on a free port.
pub struct GatewayProc {
    child: Child,
    port: u16,
    log: tempfile::NamedTempFile,
    _keys: tempfile::NamedTempFile,
}

impl GatewayProc {
    /// With the keys of [`CLIENTS`] required, and, with the fence on, every
    /// token checked with `issuer` (`Fencing-Issuer` name, URL), if any.
    pub async fn spawn(
        database_url: &str,
        fencing: bool,
        issuer: Option<&(String, String)>,
    ) -> anyhow::Result<Self> {
        Self::spawn_on(database_url, fencing, issuer, harness::free_port()).await
    }

    /// [`GatewayProc::spawn`] on a chosen port (a balancer's configuration
    /// names it; a gateway started again after a kill takes it back).
    pub async fn spawn_on(
        database_url: &str,
        fencing: bool,
        issuer: Option<&(String, String)>,
        port: u16,
    ) -> anyhow::Result<Self> {
        let clients: Vec<String> = CLIENTS.iter().map(|c| c.to_string()).collect();
        let issuers: Vec<(String, String)> = issuer.into_iter().cloned().collect();
        Self::spawn_for(database_url, fencing, &issuers, &clients, port).await
    }

    /// A gateway on `port` that knows the keys of `clients` (see [`api_key`])
    /// and, with its fence on, checks tokens with every one of `issuers`
    /// (`Fencing-Issuer` name, URL).
    pub async fn spawn_for(
        database_url: &str,
        fencing: bool,
        issuers: &[(String, String)],
        clients: &[String],
        port: u16,
    ) -> anyhow::Result<Self> {
        let log = tempfile::Builder::new()
            .prefix("chaos-gateway-")
            .suffix(".log")
            .tempfile()?;
        let keys = tempfile::Builder::new()
            .prefix("chaos-api-keys-")
            .tempfile()?;
        let lines: Vec<String> = clients
            .iter()
            .map(|c| format!("{c}={}", api_key(c)))
            .collect();
        std::fs::write(keys.path(), lines.join("\n") + "\n")?;
        let mut cmd = Command::new(binary("gateway")?);
        cmd.arg("--database-url")
            .arg(database_url)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--fencing")
            .arg(if fencing { "enforce" } else { "off" })
            .arg("--auth")
            .arg("required")
            .arg("--api-keys-file")
            .arg(keys.path());
        if fencing {
            for (name, url) in issuers {
                cmd.arg("--issuer").arg(format!("{name}={url}"));
            }
        }
        let child = cmd
            .env("RUST_LOG", "gateway=info")
            .stdin(Stdio::null())
            .stdout(log.reopen()?)
            .stderr(log.reopen()?)
            .kill_on_drop(true)
            .spawn()
            .context("spawn gateway")?;
        let me = Self {
            child,
            port,
            log,
            _keys: keys,
        };
        let http = reqwest::Client::new();
        let url = format!("{}/healthz", me.url());
        let ready = harness::wait_until(Duration::from_secs(30), || async {
            http.get(&url).send().await?.error_for_status()
        })
        .await;
        if let Err(e) = ready {
            bail!(
                "gateway did not answer {url}: {e}\n--- log ---\n{}",
                std::fs::read_to_string(me.log.path()).unwrap_or_default()
            );
        }
        Ok(me)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}
