//! One `worker` process seen as a stream of events, for tests that follow a
//! worker step by step and fail (with its log) when it does not do what they
//! await.
//!
//! The process itself is [`crate::procs::WorkerProc`], the one the chaos
//! runner uses: the binary is the one cargo built next to the test binary
//! (`scripts/test` runs `cargo build --workspace --bins` first); it dies with
//! the test binary (PDEATHSIG) and is killed and reaped on drop.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use serde_json::Value;

use crate::procs::{EventLog, WorkerProc, WorkerSpec};

/// One event line of the worker: `{"event": ..., "client", "page", "edit", ...}`.
pub type WorkerEvent = Value;

/// How long an awaited event may take before the test fails.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`WorkerProcess::wait_summary`] waits for a worker to finish.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// The `worker` binary next to the running test binary (`target/<profile>/worker`).
pub fn worker_binary() -> PathBuf {
    crate::procs::binary("worker").unwrap_or_else(|e| panic!("{e:#}"))
}

/// A running worker process and the events it printed so far.
pub struct WorkerProcess {
    proc: WorkerProc,
    log: EventLog,
    /// Every event received, in order.
    seen: Vec<WorkerEvent>,
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
        let mut spec =
            WorkerSpec::new("worker").args(args.into_iter().map(|a| a.as_ref().to_string()));
        for (k, v) in envs {
            spec = spec.env(k.as_ref(), v.as_ref());
        }
        let log = EventLog::default();
        let proc = WorkerProc::spawn(&spec, &log).expect("spawn the worker binary");
        WorkerProcess {
            proc,
            log,
            seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Every event received so far, in order.
    pub fn events(&self) -> &[WorkerEvent] {
        &self.seen
    }

    /// The next event, or `None` once stdout is closed (the worker exited).
    /// Panics (with the worker's log) if none comes within [`EVENT_TIMEOUT`].
    pub async fn next_event(&mut self) -> Option<WorkerEvent> {
        let n = self.seen.len();
        let proc = &self.proc;
        let next = self
            .log
            .wait_until("the next event", EVENT_TIMEOUT, |events| {
                match events.get(n) {
                    Some(e) => Some(Some(e.json.clone())),
                    None if proc.stdout_closed() => Some(None),
                    None => None,
                }
            })
            .await;
        match next {
            Ok(Some(e)) => {
                self.seen.push(e.clone());
                Some(e)
            }
            Ok(None) => None,
            Err(_) => panic!(
                "worker {} printed no event for {EVENT_TIMEOUT:?}; last events: {:?}\n--- its log:\n{}",
                self.pid(),
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
                    self.pid(),
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
                self.pid(),
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
                    self.pid(),
                    self.seen,
                    self.log_tail(40)
                )
            });
        (summary, status)
    }

    /// Wait up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match self.proc.exit_status(timeout).await {
            Some(status) => status,
            None => panic!(
                "worker {} still running after {timeout:?}\n--- its log:\n{}",
                self.pid(),
                self.log_tail(40)
            ),
        }
    }

    /// SIGSTOP: the whole process freezes, watchdog and heartbeats included.
    pub fn sigstop(&self) {
        self.proc.pause();
    }

    pub fn sigcont(&self) {
        self.proc.resume();
    }

    /// SIGTERM: the worker finishes or abandons its edit, releases, and exits 0.
    pub fn terminate(&self) {
        self.proc.terminate();
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        self.proc.crash();
    }

    /// Whether the kernel reports the process as stopped (state `T` in /proc).
    pub fn is_stopped(&self) -> bool {
        self.proc.is_stopped()
    }

    /// The last `n` lines of the worker's stderr log.
    pub fn log_tail(&self, n: usize) -> String {
        self.proc.stderr_tail(n)
    }
}
