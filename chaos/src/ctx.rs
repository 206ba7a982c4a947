//! What a scenario script works with (its backend's services, the gateway,
//! the row's timing and page, its workers and their events), the helpers
//! every script uses to start workers and wait on their events, and the
//! collection of the row's evidence at the end.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context};
use harness::faults::{Paused, StopSelf};
use harness::procs::{Event, EventLog, GatewayProc, WorkerProc, WorkerSpec};
use harness::{SentinelGroup, ZooKeeperHosts};
use rand::rngs::StdRng;
use rand::Rng;
use serde::Serialize;

use crate::backends::Services;
use crate::report::{self, Row};

/// How long a script waits for an event of a worker.
pub const EVENT_WAIT: Duration = Duration::from_secs(40);
/// How long a worker may take to finish once the fault is over.
const EXIT_WAIT: Duration = Duration::from_secs(60);

/// Timing drawn from the seed, so that a run can be replayed exactly.
#[derive(Debug, Clone, Serialize)]
pub struct Timing {
    pub ttl: Duration,
    pub work_ms: u64,
    /// Extra time a paused worker stays stopped after the other one wrote.
    pub resume_after: Duration,
    /// How long after `acquired` the crash comes.
    pub kill_after: Duration,
    /// How long a restarted service stays down.
    pub outage: Duration,
    /// Background workers editing the same page meanwhile (soak only).
    pub bystanders: u32,
}

impl Timing {
    pub fn draw(rng: &mut StdRng, soak: bool) -> Self {
        let spread = if soak { 4 } else { 1 };
        Self {
            ttl: Duration::from_secs(2),
            work_ms: rng.random_range(20..=120 * spread),
            resume_after: Duration::from_millis(rng.random_range(0..=300 * spread)),
            kill_after: Duration::from_millis(rng.random_range(0..=150 * spread)),
            outage: Duration::from_millis(rng.random_range(800..=1500 * spread)),
            bystanders: if soak { rng.random_range(0..=2) } else { 0 },
        }
    }
}

/// What the plan decides for one row.
#[derive(Debug, Clone)]
pub struct RowInput {
    /// The gateway's fence, on or off.
    pub fencing: bool,
    pub timing: Timing,
    /// The row's own page (hence its own lock).
    pub page: String,
}

/// Everything a scenario needs from its backend's run.
pub struct Ctx<'a> {
    pub services: &'a mut Services,
    pub gateway: &'a GatewayProc,
    pub fencing: bool,
    pub timing: Timing,
    /// The row's own page (hence its own lock).
    pub page: String,
    pub log: EventLog,
    pub workers: Vec<WorkerProc>,
}

impl<'a> Ctx<'a> {
    pub fn new(services: &'a mut Services, gateway: &'a GatewayProc, row: RowInput) -> Self {
        Self {
            services,
            gateway,
            fencing: row.fencing,
            timing: row.timing,
            page: row.page,
            log: EventLog::default(),
            workers: vec![],
        }
    }

    /// A worker of role `client` (one of [`harness::procs::CLIENTS`], so the
    /// gateway has its key) making `edits` edits on the row's page.
    pub fn spec(&self, client: &str, edits: u64) -> WorkerSpec {
        self.spec_via(client, edits, &self.gateway.url(), &HashMap::new())
    }

    /// [`Ctx::spec`] through `gateway`, and through the proxies of `via`
    /// (lock server port to proxy port).
    pub fn spec_via(
        &self,
        client: &str,
        edits: u64,
        gateway: &str,
        via: &HashMap<u16, u16>,
    ) -> WorkerSpec {
        let fenced = self.services.backend.mints_tokens();
        WorkerSpec::keyed(client)
            .args(self.services.worker_args(via, None))
            .arg("--gateway", gateway)
            .arg("--page", &self.page)
            .arg("--edits", edits)
            .arg("--ttl", humantime::format_duration(self.timing.ttl))
            .arg("--wait", "20s")
            .arg("--work-ms", self.timing.work_ms)
            // The worker always sends the token it has; whether stale ones are
            // refused is the gateway's fence, on or off per row.
            .arg("--fencing", if fenced { "on" } else { "off" })
    }

    pub fn spawn(&mut self, spec: &WorkerSpec) -> anyhow::Result<usize> {
        self.workers.push(WorkerProc::spawn(spec, &self.log)?);
        Ok(self.workers.len() - 1)
    }

    /// Spawn the worker of `spec` with `pause` armed, and wait until it
    /// stopped itself there.
    pub async fn spawn_stopped(
        &mut self,
        spec: WorkerSpec,
        pause: StopSelf,
    ) -> anyhow::Result<(usize, Paused)> {
        let i = self.spawn(&pause.arm(spec))?;
        let paused = pause
            .stopped(&self.workers[i], &self.log, EVENT_WAIT)
            .await
            .map_err(|e| self.with_logs(e))?;
        Ok((i, paused))
    }

    /// Soak mode: workers that keep editing the same page meanwhile.
    pub fn spawn_bystanders(&mut self) -> anyhow::Result<()> {
        for i in 0..self.timing.bystanders {
            let spec = self.spec(&format!("bystander{i}"), 3);
            self.spawn(&spec)?;
        }
        Ok(())
    }

    /// Start workers `a` and `b`, `edits` edits each, and wait for the first
    /// acknowledged edit: the moment to strike a service under load.
    pub async fn start_editing(&mut self, edits: u64) -> anyhow::Result<()> {
        for client in ["a", "b"] {
            let spec = self.spec(client, edits);
            self.spawn(&spec)?;
        }
        self.log
            .wait_for("a first `wrote`", EVENT_WAIT, |e| e.kind() == "wrote")
            .await?;
        Ok(())
    }

    /// Wait for a `kind` event of `client`.
    pub async fn wait_event(&self, client: &str, kind: &str) -> anyhow::Result<Event> {
        self.log
            .wait_event(client, kind, EVENT_WAIT)
            .await
            .map_err(|e| self.with_logs(e))
    }

    /// Resume every worker still alive and wait until each has finished.
    pub async fn wait_all_exit(&mut self) -> anyhow::Result<()> {
        let mut errors = vec![];
        for w in &mut self.workers {
            if w.killed_at.is_none() {
                w.resume();
                if let Err(e) = w.wait_exit(EXIT_WAIT).await {
                    errors.push(e.to_string());
                }
            }
        }
        if !errors.is_empty() {
            bail!("{}", errors.join("\n"));
        }
        Ok(())
    }

    /// `e`, with the tail of every worker's log.
    fn with_logs(&self, e: anyhow::Error) -> anyhow::Error {
        let logs: Vec<String> = self
            .workers
            .iter()
            .map(|w| format!("--- {} stderr ---\n{}", w.client, w.stderr_tail(15)))
            .collect();
        anyhow::anyhow!("{e}\n{}", logs.join("\n"))
    }

    /// What the worker `client` did with its edit after the fault, in words.
    pub fn outcome_of(&self, client: &str) -> String {
        let events = self.log.all();
        let last = events
            .iter()
            .filter(|e| e.client == client)
            .filter(|e| matches!(e.kind(), "wrote" | "rejected" | "lost" | "error"))
            .map(|e| match e.kind() {
                "wrote" => "its stale write was ACCEPTED".to_string(),
                "rejected" => format!("its write was rejected ({})", e.str("error").unwrap_or("?")),
                "lost" => "its lost-lock check abandoned the edit".to_string(),
                other => format!("{other}: {}", e.json),
            })
            .next_back();
        last.unwrap_or_else(|| "it did nothing visible".into())
    }

    /// The ZooKeeper ensemble, for the rows that need one.
    pub fn ensemble(&mut self) -> anyhow::Result<&mut ZooKeeperHosts> {
        self.services
            .zookeeper
            .as_mut()
            .context("zookeeper")?
            .ensemble()
    }

    /// The Sentinel group.
    pub fn sentinel(&mut self) -> anyhow::Result<&mut SentinelGroup> {
        self.services.sentinel.as_mut().context("sentinel group")
    }

    /// Fill the row's numbers from the events, the history and the final
    /// body that the gateway at `gateway` serves; then `outcome`, the
    /// script's, or the collection's error.
    pub async fn finish(
        &self,
        row: &mut Row,
        outcome: anyhow::Result<()>,
        gateway: &str,
    ) -> anyhow::Result<()> {
        let collected = self.collect(row, gateway).await;
        outcome.and(collected)
    }

    /// Fill the row's numbers from the events, the history and the final body.
    pub async fn collect(&self, row: &mut Row, gateway: &str) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let page_url = format!("{gateway}/pages/{}", self.page);
        let resp = http.get(&page_url).send().await?;
        let body = if resp.status() == reqwest::StatusCode::NOT_FOUND {
            String::new()
        } else {
            let v: serde_json::Value = resp.error_for_status()?.json().await?;
            v["body"].as_str().unwrap_or_default().to_string()
        };
        // Every attempt, newest first, a page of 1000 at a time.
        let mut entries: Vec<serde_json::Value> = Vec::new();
        loop {
            let before = entries
                .last()
                .map_or(i64::MAX, |e| e["seq"].as_i64().unwrap_or(0));
            let got: serde_json::Value = http
                .get(format!("{page_url}/history?limit=1000&before={before}"))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let got = got["history"].as_array().cloned().unwrap_or_default();
            let full = got.len() == 1000;
            entries.extend(got);
            if !full {
                break;
            }
        }
        let history = report::parse_history(&serde_json::Value::Array(entries));
        let events = self.log.all();
        if let Some(dir) = std::env::var_os("CHAOS_EVENTS_DIR") {
            // Every event of the row, with the runner's receive time, for a post-mortem.
            let lines: Vec<String> = events
                .iter()
                .map(|e| {
                    serde_json::json!({"client": e.client, "received_ms": e.received_ms, "event": e.json})
                        .to_string()
                })
                .collect();
            let path = std::path::Path::new(&dir).join(format!("{}.jsonl", self.page));
            std::fs::write(&path, lines.join("\n") + "\n")
                .with_context(|| format!("write {}", path.display()))?;
        }
        let (acked, lost, missing) = report::lost_updates(&events, &body);
        row.acknowledged = acked;
        row.lost_updates = lost;
        if !missing.is_empty() {
            row.note(format!("missing from the page: {}", missing.join(", ")));
        }
        let (stale_token, token_not_current) = report::stale_rejected(&history);
        row.stale_token = stale_token;
        row.token_not_current = token_not_current;
        row.stale_rejected = stale_token + token_not_current;
        row.stale_accepted = report::stale_accepted(&history);
        let ends: HashMap<String, i64> = self
            .workers
            .iter()
            .filter_map(|w| w.killed_at.map(|t| (w.client.clone(), t)))
            .collect();
        row.double_holders = report::double_holders(&events, &ends);
        Ok(())
    }
}

/// How many `kind` events `client` sent.
pub fn count_of(events: &[Event], client: &str, kind: &str) -> usize {
    events.iter().filter(|e| e.is(client, kind)).count()
}

/// How many `kind` events there are, of any client.
pub fn count(events: &[Event], kind: &str) -> usize {
    events.iter().filter(|e| e.kind() == kind).count()
}

/// The token of `client`'s first `acquired` event, as text.
pub fn first_token(events: &[Event], client: &str) -> String {
    events
        .iter()
        .find(|e| e.is(client, "acquired"))
        .and_then(|e| e.u64("token"))
        .map_or_else(|| "none".into(), |t| t.to_string())
}
