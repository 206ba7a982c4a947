//! A worker's wall clock steps one hour ahead while it holds the lock, as an
//! NTP step would (libfaketime, which re-reads its offset file on every
//! call). Not undone: the worker keeps the clock it has until it exits.

use std::time::Duration;

use anyhow::bail;

use crate::procs::{EventLog, WorkerSpec};

pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// One worker's clock. Keep it alive until the worker exits.
pub struct ClockJump {
    offset: tempfile::NamedTempFile,
    monotonic: bool,
}

impl ClockJump {
    /// `monotonic`: CLOCK_MONOTONIC jumps too, so every timer and deadline of
    /// the worker sees the hour pass at once; otherwise only CLOCK_REALTIME
    /// moves, as with a real NTP step.
    pub fn new(monotonic: bool) -> anyhow::Result<Self> {
        if !std::path::Path::new(LIBFAKETIME).exists() {
            bail!("{LIBFAKETIME} missing: install Debian's `faketime`");
        }
        let offset = tempfile::NamedTempFile::new()?;
        std::fs::write(offset.path(), "+0\n")?;
        Ok(Self { offset, monotonic })
    }

    pub fn monotonic(&self) -> bool {
        self.monotonic
    }

    /// The worker's spec, under this clock.
    pub fn arm(&self, spec: WorkerSpec) -> WorkerSpec {
        let spec = spec
            .env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", self.offset.path().display())
            .env("FAKETIME_NO_CACHE", "1");
        if self.monotonic {
            spec
        } else {
            spec.env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        }
    }

    /// Jump one hour ahead as soon as `client` (the armed worker) holds the lock.
    pub async fn inject(
        &self,
        log: &EventLog,
        client: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        log.wait_event(client, "acquired", timeout).await?;
        std::fs::write(self.offset.path(), "+1h\n")?;
        Ok(())
    }
}
