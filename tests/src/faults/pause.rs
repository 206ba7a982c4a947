//! A worker frozen whole, as a GC pause freezes a process: SIGSTOP stops its
//! watchdog and renewals too. Healed with SIGCONT.

use std::time::Duration;

use anyhow::Context;

use crate::procs::{EventLog, WorkerProc, WorkerSpec};

/// How long a worker may take to show as stopped after it stopped itself.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// What undoes a pause: continue the worker.
#[must_use = "a paused worker stays frozen until healed"]
pub struct Paused(());

impl Paused {
    pub fn heal(self, worker: &WorkerProc) {
        worker.resume();
    }
}

/// SIGSTOP from outside, wherever the worker is.
pub fn pause(worker: &WorkerProc) -> Paused {
    worker.pause();
    Paused(())
}

/// The pause at a chosen step: the worker stops itself right after emitting
/// `step` (`read`: before its lost-lock check; `writing`: after it, its PUT
/// not sent), so that the pause falls exactly where the story needs it.
#[derive(Debug, Clone, Copy)]
pub struct StopSelf(pub &'static str);

impl StopSelf {
    /// The worker's spec, with the pause armed.
    pub fn arm(&self, spec: WorkerSpec) -> WorkerSpec {
        spec.arg("--stop-self-at", self.0)
    }

    /// Wait until the armed worker reached its step and is stopped.
    pub async fn stopped(
        &self,
        worker: &WorkerProc,
        log: &EventLog,
        timeout: Duration,
    ) -> anyhow::Result<Paused> {
        log.wait_event(&worker.client, self.0, timeout).await?;
        worker
            .wait_stopped(STOP_WAIT)
            .await
            .with_context(|| format!("{} did not stop itself", worker.client))?;
        Ok(Paused(()))
    }
}
