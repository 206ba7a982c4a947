//! The scenarios of issue 7, each a script over real processes.
//!
//! Every scenario waits on the workers' events rather than on guesses: the one
//! deliberate sleep in each is the fault itself (an outage of some length, or
//! a jitter drawn from the seed).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::Rng;
use serde::Serialize;

use crate::backends::{Backend, Services};
use crate::procs::{EventLog, GatewayProc, WorkerProc, WorkerSpec};
use crate::report::{self, Row};
use harness::proxy::{DelayProxy, Mode};

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Scenario 1a: The holder stops itself right after `writing` (its lost-lock check
    /// passed, its PUT not sent), stays stopped while another worker takes
    /// the lock and writes, then resumes: only the fence can save the page.
    GcPauseWriting,
    /// Scenario 1b: The same pause at `read`: the worker's own lost-lock check should
    /// abandon the edit when it resumes.
    GcPauseRead,
    /// Scenario 2: The holder is SIGKILLed; the other worker continues after expiry.
    Crash,
    /// Scenario 3: Redis (single: the one instance; Redlock: two of three) is killed
    /// and restarted without persistence.
    RedisRestart,
    /// Scenario 4: The ZooKeeper server is killed while workers edit, and started again.
    /// (Session expiry of a paused client is 1a/1b on `zookeeper`.)
    ZookeeperRestart,
    /// Scenario 5: The gateway's PostgreSQL is killed under load and started again.
    PostgresRestart,
    /// Scenario 6: Everything the holder sends is held by the delay proxy from its
    /// `read` on: its PUT leaves before the lease expires and arrives after
    /// another worker's write.
    DelayedWrite,
    /// Scenario 7: The holder's wall clock jumps one hour ahead (libfaketime) while it
    /// holds the lock, as an NTP step would: CLOCK_MONOTONIC does not move.
    ClockJump,
    /// Scenario 7b: The same jump, but libfaketime moves CLOCK_MONOTONIC too: every
    /// timer and deadline of the worker sees one hour pass at once.
    ClockJumpMonotonic,
    /// Issue 14: SIGKILL the ensemble's leader (found with `srvr`) while two
    /// workers edit; start it again at the end.
    ZookeeperLeaderKill,
    /// Issue 14: a worker that can only reach one follower holds the lock;
    /// that follower is cut off from the other two servers for longer than
    /// the session timeout while another worker (on the majority) goes on;
    /// then the partition heals.
    ZookeeperPartition,
    /// Issue 14: a worker holds the lock on the master, whose replica's link
    /// was cut just before the grant; the master freezes, Sentinel promotes
    /// the replica, a second worker is granted the same lock there.
    SentinelFailover,
    /// Issue 14: the same with `WAIT 1` after every grant.
    SentinelFailoverWait,
    /// Issue 14: one Redlock client cannot reach one master of three (a
    /// minority) while two clients edit.
    RedlockPartition,
    /// Issue 15: PostgreSQL with an asynchronous standby. A holder freezes at
    /// `writing`; the replication link is cut; the next holder's writes are
    /// acknowledged; the primary is SIGKILLed and the standby promoted; the
    /// frozen holder resumes. See `failover.rs`.
    PostgresFailoverAsync,
    /// Issue 15: the same with a synchronous standby (`synchronous_commit = on`).
    PostgresFailoverSync,
    /// Issue 15: two gateways behind HAProxy; one is SIGKILLed mid-run.
    GatewayKill,
}

impl Scenario {
    pub const ALL: [Scenario; 17] = [
        Scenario::GcPauseWriting,
        Scenario::GcPauseRead,
        Scenario::Crash,
        Scenario::PostgresRestart,
        Scenario::DelayedWrite,
        Scenario::ClockJump,
        Scenario::ClockJumpMonotonic,
        // Each of these runs on a stack of its own (see failover.rs).
        Scenario::PostgresFailoverAsync,
        Scenario::PostgresFailoverSync,
        Scenario::GatewayKill,
        // The restarts kill the services shared by a backend's scenarios: last.
        Scenario::RedisRestart,
        Scenario::ZookeeperRestart,
        // Issue 14: the replicated services' failures.
        Scenario::ZookeeperLeaderKill,
        Scenario::ZookeeperPartition,
        Scenario::SentinelFailover,
        Scenario::SentinelFailoverWait,
        Scenario::RedlockPartition,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::GcPauseWriting => "gc-pause-writing",
            Scenario::GcPauseRead => "gc-pause-read",
            Scenario::Crash => "crash",
            Scenario::RedisRestart => "redis-restart",
            Scenario::ZookeeperRestart => "zookeeper-restart",
            Scenario::PostgresRestart => "postgres-restart",
            Scenario::DelayedWrite => "delayed-write",
            Scenario::ClockJump => "clock-jump",
            Scenario::ClockJumpMonotonic => "clock-jump-monotonic",
            Scenario::ZookeeperLeaderKill => "zookeeper-leader-kill",
            Scenario::ZookeeperPartition => "zookeeper-partition",
            Scenario::SentinelFailover => "sentinel-failover",
            Scenario::SentinelFailoverWait => "sentinel-failover-wait",
            Scenario::RedlockPartition => "redlock-partition",
            Scenario::PostgresFailoverAsync => "postgres-failover-async",
            Scenario::PostgresFailoverSync => "postgres-failover-sync",
            Scenario::GatewayKill => "gateway-kill",
        }
    }

    pub fn applies_to(self, backend: Backend) -> bool {
        match self {
            Scenario::RedisRestart => matches!(backend, Backend::Redis | Backend::Redlock),
            Scenario::ZookeeperRestart
            | Scenario::ZookeeperLeaderKill
            | Scenario::ZookeeperPartition => backend == Backend::Zookeeper,
            Scenario::SentinelFailover | Scenario::SentinelFailoverWait => {
                backend == Backend::RedisSentinel
            }
            Scenario::RedlockPartition => backend == Backend::Redlock,
            // About the storage's fence: a backend without tokens has none.
            // (Issue 15's stacks are about PostgreSQL and the gateways: the
            // Sentinel group does not run them again.)
            Scenario::PostgresFailoverAsync
            | Scenario::PostgresFailoverSync
            | Scenario::GatewayKill => backend.mints_tokens() && backend != Backend::RedisSentinel,
            // The Sentinel group is the single-instance lock otherwise: it
            // runs the pauses and the crash, not the whole list again.
            Scenario::GcPauseWriting | Scenario::GcPauseRead | Scenario::Crash => true,
            _ => backend != Backend::RedisSentinel,
        }
    }

    /// The rows of issue 14, shown with the fence on and off by default.
    pub fn is_replication(self) -> bool {
        matches!(
            self,
            Scenario::ZookeeperLeaderKill
                | Scenario::ZookeeperPartition
                | Scenario::SentinelFailover
                | Scenario::SentinelFailoverWait
                | Scenario::RedlockPartition
        )
    }
}

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

/// Everything a scenario needs from its backend's run.
pub struct Ctx<'a> {
    pub services: &'a mut Services,
    pub gateway: &'a GatewayProc,
    pub fencing: bool,
    pub timing: Timing,
    pub page: String,
    pub log: EventLog,
    pub workers: Vec<WorkerProc>,
}

pub(crate) const EVENT_WAIT: Duration = Duration::from_secs(40);
const EXIT_WAIT: Duration = Duration::from_secs(60);

impl Ctx<'_> {
    pub(crate) fn spec(&self, client: &str, edits: u64) -> WorkerSpec {
        self.spec_via(client, edits, &self.gateway.url(), &HashMap::new())
    }

    pub(crate) fn spec_via(
        &self,
        client: &str,
        edits: u64,
        gateway: &str,
        via: &HashMap<u16, u16>,
    ) -> WorkerSpec {
        let mut spec = WorkerSpec {
            client: self.client(client),
            args: self.services.worker_args(via),
            env: vec![],
        };
        let fenced = self.services.backend.mints_tokens();
        spec = spec
            .arg("--gateway", gateway)
            .arg("--page", &self.page)
            .arg("--edits", edits)
            .arg("--ttl", humantime::format_duration(self.timing.ttl))
            .arg("--wait", "20s")
            .arg("--work-ms", self.timing.work_ms)
            // The worker always sends the token it has; whether stale ones are
            // refused is the gateway's fence, on or off per row.
            .arg("--fencing", if fenced { "on" } else { "off" });
        spec
    }

    /// A worker's client id: its role (one of [`crate::procs::CLIENTS`], so
    /// the gateway has its key). The page is the row's own.
    pub(crate) fn client(&self, name: &str) -> String {
        name.to_string()
    }

    pub(crate) fn spawn(&mut self, spec: &WorkerSpec) -> anyhow::Result<usize> {
        self.workers.push(WorkerProc::spawn(spec, &self.log)?);
        Ok(self.workers.len() - 1)
    }

    /// Soak mode: workers that keep editing the same page meanwhile.
    fn spawn_bystanders(&mut self) -> anyhow::Result<()> {
        for i in 0..self.timing.bystanders {
            let spec = self.spec(&format!("bystander{i}"), 3);
            self.spawn(&spec)?;
        }
        Ok(())
    }

    pub(crate) async fn wait_event(
        &self,
        who: &str,
        kind: &str,
    ) -> anyhow::Result<crate::procs::Event> {
        let client = self.client(who);
        let k = kind.to_string();
        self.log
            .wait_for(&format!("`{kind}` from {client}"), EVENT_WAIT, move |e| {
                e.client == client && e.kind() == k
            })
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.worker_logs()))
    }

    pub(crate) async fn wait_all_exit(&mut self) -> anyhow::Result<()> {
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

    pub(crate) fn worker_logs(&self) -> String {
        self.workers
            .iter()
            .map(|w| format!("--- {} stderr ---\n{}", w.client, w.stderr_tail(15)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// What the worker `who` did with its edit after the fault, in words.
    pub(crate) fn outcome_of(&self, who: &str) -> String {
        let client = self.client(who);
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
}

/// Run one scenario to the end. The evidence is collected by the caller.
pub async fn run(scenario: Scenario, ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    match scenario {
        Scenario::GcPauseWriting => gc_pause(ctx, row, "writing").await,
        Scenario::GcPauseRead => gc_pause(ctx, row, "read").await,
        Scenario::Crash => crash(ctx, row).await,
        Scenario::RedisRestart if ctx.services.backend == Backend::Redlock => {
            redlock_restart(ctx, row).await
        }
        Scenario::RedisRestart => redis_restart(ctx, row).await,
        Scenario::ZookeeperRestart => zookeeper_restart(ctx, row).await,
        Scenario::PostgresRestart => {
            unreachable!("postgres-restart runs with its own gateway; see runner")
        }
        Scenario::PostgresFailoverAsync
        | Scenario::PostgresFailoverSync
        | Scenario::GatewayKill => {
            unreachable!(
                "{} runs on a stack of its own; see failover.rs",
                scenario.name()
            )
        }
        Scenario::DelayedWrite => delayed_write(ctx, row).await,
        Scenario::ClockJump => clock_jump(ctx, row, false).await,
        Scenario::ClockJumpMonotonic => clock_jump(ctx, row, true).await,
        Scenario::ZookeeperLeaderKill => crate::replication::zookeeper_leader_kill(ctx, row).await,
        Scenario::ZookeeperPartition => crate::replication::zookeeper_partition(ctx, row).await,
        Scenario::SentinelFailover => crate::replication::sentinel_failover(ctx, row, false).await,
        Scenario::SentinelFailoverWait => {
            crate::replication::sentinel_failover(ctx, row, true).await
        }
        Scenario::RedlockPartition => crate::replication::redlock_partition(ctx, row).await,
    }
}

async fn gc_pause(ctx: &mut Ctx<'_>, row: &mut Row, at: &str) -> anyhow::Result<()> {
    let paused = ctx.spec("paused", 1).arg("--stop-self-at", at);
    let a = ctx.spawn(&paused)?;
    ctx.wait_event("paused", at).await?;
    ctx.workers[a]
        .wait_stopped(Duration::from_secs(5))
        .await
        .context("the worker did not stop itself")?;
    // It read version v and is frozen. Another worker takes the lock once the
    // lease expires (nobody renews it) and writes v+1.
    ctx.spawn_bystanders()?;
    let other = ctx.spec("other", 2);
    ctx.spawn(&other)?;
    ctx.wait_event("other", "wrote").await?;
    tokio::time::sleep(ctx.timing.resume_after).await;
    ctx.workers[a].resume();
    ctx.wait_all_exit().await?;
    row.note(format!("paused at `{at}`: {}", ctx.outcome_of("paused")));
    Ok(())
}

async fn crash(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    let victim = ctx.spec("victim", 3);
    let v = ctx.spawn(&victim)?;
    ctx.wait_event("victim", "acquired").await?;
    let other = ctx.spec("other", 3);
    ctx.spawn(&other)?;
    ctx.spawn_bystanders()?;
    tokio::time::sleep(ctx.timing.kill_after).await;
    ctx.workers[v].crash().await;
    ctx.wait_all_exit().await?;
    let acked_after = ctx
        .log
        .all()
        .iter()
        .filter(|e| e.client == ctx.client("other") && e.kind() == "wrote")
        .count();
    row.note(format!(
        "holder SIGKILLed; the other worker then had {acked_after} edit(s) acknowledged"
    ));
    Ok(())
}

/// Single Redis: the token counter is lost, new tokens are lower than the fence.
async fn redis_restart(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    let before = ctx.spec("before", 3);
    ctx.spawn(&before)?;
    ctx.wait_all_exit().await?;
    ctx.services.redis[0].restart().await;
    let after = ctx.spec("after", 2);
    ctx.spawn(&after)?;
    ctx.wait_all_exit().await?;
    let events = ctx.log.all();
    let client = ctx.client("after");
    let count = |k: &str| {
        events
            .iter()
            .filter(|e| e.client == client && e.kind() == k)
            .count()
    };
    let (acked, rejected) = (count("wrote"), count("rejected"));
    if acked == 0 && rejected > 0 {
        row.note(format!(
            "after the restart every write was rejected ({rejected}/{rejected}): tokens restarted below the fence, safe but STUCK until the counter passes it"
        ));
    } else {
        row.note(format!(
            "after the restart: {acked} acknowledged, {rejected} rejected"
        ));
    }
    Ok(())
}

/// Redlock: two of three masters forget the key; a second client gets a majority.
async fn redlock_restart(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    ctx.timing.ttl = Duration::from_secs(10);
    let first = ctx.spec("first", 1).arg("--stop-self-at", "writing");
    let a = ctx.spawn(&first)?;
    ctx.wait_event("first", "writing").await?;
    ctx.workers[a].wait_stopped(Duration::from_secs(5)).await?;
    ctx.services.redis[1].restart().await;
    ctx.services.redis[2].restart().await;
    let second = ctx.spec("second", 1);
    ctx.spawn(&second)?;
    ctx.wait_event("second", "wrote").await?;
    ctx.workers[a].resume();
    ctx.wait_all_exit().await?;
    row.note(format!(
        "2 of 3 masters restarted empty while the first held the lock (ttl 10s, not expired); a second client acquired; first: {}",
        ctx.outcome_of("first")
    ));
    Ok(())
}

async fn zookeeper_restart(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    let a = ctx.spec("a", 4);
    let b = ctx.spec("b", 4);
    ctx.spawn(&a)?;
    ctx.spawn(&b)?;
    ctx.log
        .wait_for("a first `wrote`", EVENT_WAIT, |e| e.kind() == "wrote")
        .await?;
    let zk = ctx.services.zookeeper.as_mut().context("zookeeper")?;
    // Every server of the service (all three of the ensemble) at once.
    zk.kill_all();
    tokio::time::sleep(ctx.timing.outage).await;
    zk.start_all_again().await;
    ctx.wait_all_exit().await?;
    let events = ctx.log.all();
    let lost = events.iter().filter(|e| e.kind() == "lost").count();
    row.note(format!(
        "server down {:?} mid-run; {lost} `lost` event(s) in the workers",
        ctx.timing.outage
    ));
    Ok(())
}

/// Postgres behind the gateway dies under load and comes back.
pub async fn postgres_restart(
    ctx: &mut Ctx<'_>,
    row: &mut Row,
    pg: &mut harness::Postgres,
) -> anyhow::Result<()> {
    let a = ctx.spec("a", 6);
    let b = ctx.spec("b", 6);
    ctx.spawn(&a)?;
    ctx.spawn(&b)?;
    ctx.log
        .wait_for("a first `wrote`", EVENT_WAIT, |e| e.kind() == "wrote")
        .await?;
    pg.kill();
    // Longer than the other outages, so that requests surely land in it.
    let outage = ctx.timing.outage + Duration::from_secs(1);
    let killed = tokio::time::Instant::now();
    // PostgreSQL backends are their own process groups (setsid), so a backend
    // can outlive the killed postmaster for a moment: probe until the gateway
    // notices, within the outage.
    let url = format!("{}/pages/{}", ctx.gateway.url(), ctx.page);
    let http = reqwest::Client::new();
    let mut seen = vec![];
    let mut status = String::new();
    while killed.elapsed() < outage {
        status = http
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .map(|r| r.status().as_u16().to_string())
            .unwrap_or_else(|e| format!("no answer ({e})"));
        if seen.last() != Some(&status) {
            seen.push(status.clone());
        }
        if status == "503" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let noticed = killed.elapsed();
    tokio::time::sleep(outage.saturating_sub(noticed)).await;
    pg.start_again().await;
    ctx.wait_all_exit().await?;
    let events = ctx.log.all();
    let failed = events.iter().filter(|e| e.kind() == "error").count();
    let gave_up: u64 = events
        .iter()
        .filter(|e| e.kind() == "summary")
        .filter_map(|e| e.u64("errors"))
        .sum();
    row.note(format!(
        "gateway answered {} while Postgres was down {:?} (503 after {} ms), then recovered; \
         workers saw {failed} failed request(s), {gave_up} edit(s) ended in error (never acknowledged)",
        seen.join(" then "),
        outage,
        noticed.as_millis()
    ));
    if status != "503" {
        row.note("EXPECTED 503 during the outage");
    }
    Ok(())
}

async fn delayed_write(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    // One proxy in front of the gateway and one in front of each lock server,
    // all for the delayed worker only: its whole network is slow.
    let gw_proxy = DelayProxy::start(([127, 0, 0, 1], ctx.gateway.port()).into()).await?;
    let mut proxies = vec![];
    let mut via = HashMap::new();
    for port in ctx.services.ports() {
        let p = DelayProxy::start(([127, 0, 0, 1], port).into()).await?;
        via.insert(port, p.port());
        proxies.push(p);
    }
    let gw_url = format!("http://127.0.0.1:{}", gw_proxy.port());
    let slow = ctx.spec_via("slow", 1, &gw_url, &via);
    ctx.spawn(&slow)?;
    ctx.wait_event("slow", "read").await?;
    gw_proxy.set_mode(Mode::Hold);
    for p in &proxies {
        p.set_mode(Mode::Hold);
    }
    // The lost-lock check passes (the lease is fresh) and the PUT leaves...
    ctx.wait_event("slow", "writing").await?;
    // ...but is held. Renewals are held too, so the lease expires.
    ctx.spawn_bystanders()?;
    let other = ctx.spec("other", 1);
    ctx.spawn(&other)?;
    ctx.wait_event("other", "wrote").await?;
    tokio::time::sleep(ctx.timing.resume_after).await;
    gw_proxy.set_mode(Mode::Pass);
    for p in &proxies {
        p.set_mode(Mode::Pass);
    }
    ctx.wait_all_exit().await?;
    row.note(format!(
        "PUT held {} bytes until after the other's write; slow worker: {}",
        gw_proxy.bytes_delayed(),
        ctx.outcome_of("slow")
    ));
    Ok(())
}

pub(crate) const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

async fn clock_jump(ctx: &mut Ctx<'_>, row: &mut Row, monotonic: bool) -> anyhow::Result<()> {
    if !std::path::Path::new(LIBFAKETIME).exists() {
        bail!("{LIBFAKETIME} missing: install Debian's `faketime`");
    }
    let offset = tempfile::NamedTempFile::new()?;
    std::fs::write(offset.path(), "+0\n")?;
    let mut jumper = ctx.spec("jumper", 3);
    jumper.env = vec![
        ("LD_PRELOAD".into(), LIBFAKETIME.into()),
        (
            "FAKETIME_TIMESTAMP_FILE".into(),
            offset.path().display().to_string(),
        ),
        ("FAKETIME_NO_CACHE".into(), "1".into()),
    ];
    if !monotonic {
        // An NTP step moves the wall clock (CLOCK_REALTIME) only; CLOCK_MONOTONIC,
        // which timers and Instants use, never jumps.
        jumper
            .env
            .push(("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()));
    }
    ctx.spawn(&jumper)?;
    let other = ctx.spec("other", 3);
    ctx.spawn(&other)?;
    ctx.wait_event("jumper", "acquired").await?;
    std::fs::write(offset.path(), "+1h\n")?;
    ctx.wait_all_exit().await?;
    let events = ctx.log.all();
    let client = ctx.client("jumper");
    let count = |k: &str| {
        events
            .iter()
            .filter(|e| e.client == client && e.kind() == k)
            .count()
    };
    let jumped = events.iter().filter(|e| e.client == client).any(|e| {
        e.json["ts"]
            .as_i64()
            .is_some_and(|ts| ts - e.received_ms > 3_000_000)
    });
    let first = |k: &str, field: &str| {
        events
            .iter()
            .find(|e| e.client == client && e.kind() == k)
            .and_then(|e| e.str(field).map(|m| format!(" [{k}: {m}]")))
            .unwrap_or_default()
    };
    let details = format!("{}{}", first("lost", "reason"), first("error", "message"));
    row.note(
        format!(
            "wall clock +1h while holding ({}){}: {} wrote, {} rejected, {} lost, {} error(s)",
            if monotonic {
                "monotonic +1h too"
            } else {
                "monotonic untouched"
            },
            if jumped {
                ""
            } else {
                " [jump NOT observed in ts]"
            },
            count("wrote"),
            count("rejected"),
            count("lost"),
            count("error")
        ) + &details,
    );
    Ok(())
}

/// Fill the row's numbers from the events, the history and the final body.
pub async fn collect(
    row: &mut Row,
    log: &EventLog,
    gateway: &str,
    page: &str,
    workers: &[WorkerProc],
) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let page_url = format!("{gateway}/pages/{page}");
    let resp = http.get(&page_url).send().await?;
    let body = if resp.status() == reqwest::StatusCode::NOT_FOUND {
        String::new()
    } else {
        let v: serde_json::Value = resp.error_for_status()?.json().await?;
        v["body"].as_str().unwrap_or_default().to_string()
    };
    let history: serde_json::Value = http
        .get(format!("{page_url}/history?limit=10000"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let history = report::parse_history(&history);
    let events = log.all();
    if let Some(dir) = std::env::var_os("CHAOS_EVENTS_DIR") {
        // Every event of the row, with the runner's receive time, for a post-mortem.
        let lines: Vec<String> = events
            .iter()
            .map(|e| {
                serde_json::json!({"client": e.client, "received_ms": e.received_ms, "event": e.json})
                    .to_string()
            })
            .collect();
        let path = std::path::Path::new(&dir).join(format!("{page}.jsonl"));
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
    let ends: HashMap<String, i64> = workers
        .iter()
        .filter_map(|w| w.killed_at.map(|t| (w.client.clone(), t)))
        .collect();
    row.double_holders = report::double_holders(&events, &ends);
    Ok(())
}
