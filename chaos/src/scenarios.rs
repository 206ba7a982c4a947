//! The scenarios: which rows there are, and the scripts of the rows on one
//! lock service (a paused, crashed, delayed or time-travelling worker, and
//! restarts of the services). The replicated services' scripts are in
//! [`crate::replication`], the rows on stacks of their own in
//! [`crate::failover`].
//!
//! Every script waits on the workers' events rather than on guesses: the
//! one deliberate sleep in each is the fault itself (an outage of some
//! length, or a jitter drawn from the seed). The faults themselves are the
//! harness's catalogue ([`harness::faults`]).

use std::time::Duration;

use anyhow::Context;
use harness::faults::{restart, ClockJump, HeldLink, StopSelf};
use serde::Serialize;

use crate::backends::Backend;
use crate::ctx::{count, count_of, Ctx, EVENT_WAIT};
use crate::replication;
use crate::report::Row;

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
    /// The ZooKeeper ensemble: SIGKILL its leader (found with `srvr`) while two
    /// workers edit; start it again at the end.
    ZookeeperLeaderKill,
    /// The ZooKeeper ensemble: a worker that can only reach one follower holds the lock;
    /// that follower is cut off from the other two servers for longer than
    /// the session timeout while another worker (on the majority) goes on;
    /// then the partition heals.
    ZookeeperPartition,
    /// Redis Sentinel: a worker holds the lock on the master, whose replica's link
    /// was cut just before the grant; the master freezes, Sentinel promotes
    /// the replica, a second worker is granted the same lock there.
    SentinelFailover,
    /// Redis Sentinel: the same with `WAIT 1` after every grant.
    SentinelFailoverWait,
    /// Redlock: one client cannot reach one master of three (a
    /// minority) while two clients edit.
    RedlockPartition,
    /// The storage failing over: PostgreSQL with an asynchronous standby. A holder freezes at
    /// `writing`; the replication link is cut; the next holder's writes are
    /// acknowledged; the primary is SIGKILLed and the standby promoted; the
    /// frozen holder resumes. See `failover.rs`.
    PostgresFailoverAsync,
    /// The same with a synchronous standby (`synchronous_commit = on`).
    PostgresFailoverSync,
    /// Two gateways behind HAProxy; one is SIGKILLed mid-run.
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
        // The replicated lock services' failures.
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
            // (The failover stacks are about PostgreSQL and the gateways: the
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

    /// The replicated lock services' rows, shown with the fence on and off
    /// by default.
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
        Scenario::ZookeeperLeaderKill => replication::zookeeper_leader_kill(ctx, row).await,
        Scenario::ZookeeperPartition => replication::zookeeper_partition(ctx, row).await,
        Scenario::SentinelFailover => replication::sentinel_failover(ctx, row, false).await,
        Scenario::SentinelFailoverWait => replication::sentinel_failover(ctx, row, true).await,
        Scenario::RedlockPartition => replication::redlock_partition(ctx, row).await,
    }
}

async fn gc_pause(ctx: &mut Ctx<'_>, row: &mut Row, at: &'static str) -> anyhow::Result<()> {
    let (a, paused) = ctx
        .spawn_stopped(ctx.spec("paused", 1), StopSelf(at))
        .await?;
    // It read version v and is frozen. Another worker takes the lock once the
    // lease expires (nobody renews it) and writes v+1.
    ctx.spawn_bystanders()?;
    let other = ctx.spec("other", 2);
    ctx.spawn(&other)?;
    ctx.wait_event("other", "wrote").await?;
    tokio::time::sleep(ctx.timing.resume_after).await;
    paused.heal(&ctx.workers[a]);
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
    ctx.workers[v].crash();
    ctx.wait_all_exit().await?;
    row.note(format!(
        "holder SIGKILLed; the other worker then had {} edit(s) acknowledged",
        count_of(&ctx.log.all(), "other", "wrote")
    ));
    Ok(())
}

/// Single Redis: the token counter is lost, new tokens are lower than the fence.
async fn redis_restart(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    let before = ctx.spec("before", 3);
    ctx.spawn(&before)?;
    ctx.wait_all_exit().await?;
    let redis = &mut ctx.services.redis[0];
    restart::kill(redis).heal(redis).await?;
    let after = ctx.spec("after", 2);
    ctx.spawn(&after)?;
    ctx.wait_all_exit().await?;
    let events = ctx.log.all();
    let (acked, rejected) = (
        count_of(&events, "after", "wrote"),
        count_of(&events, "after", "rejected"),
    );
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
    let (a, paused) = ctx
        .spawn_stopped(ctx.spec("first", 1), StopSelf("writing"))
        .await?;
    for redis in &mut ctx.services.redis[1..] {
        restart::kill(redis).heal(redis).await?;
    }
    let second = ctx.spec("second", 1);
    ctx.spawn(&second)?;
    ctx.wait_event("second", "wrote").await?;
    paused.heal(&ctx.workers[a]);
    ctx.wait_all_exit().await?;
    row.note(format!(
        "2 of 3 masters restarted empty while the first held the lock (ttl 10s, not expired); a second client acquired; first: {}",
        ctx.outcome_of("first")
    ));
    Ok(())
}

async fn zookeeper_restart(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    ctx.start_editing(4).await?;
    let zk = ctx.services.zookeeper.as_mut().context("zookeeper")?;
    // Every server of the service (all three of the ensemble) at once.
    let down = restart::kill(zk);
    tokio::time::sleep(ctx.timing.outage).await;
    down.heal(zk).await?;
    ctx.wait_all_exit().await?;
    row.note(format!(
        "server down {:?} mid-run; {} `lost` event(s) in the workers",
        ctx.timing.outage,
        count(&ctx.log.all(), "lost")
    ));
    Ok(())
}

/// Postgres behind the gateway dies under load and comes back.
pub async fn postgres_restart(
    ctx: &mut Ctx<'_>,
    row: &mut Row,
    pg: &mut harness::Postgres,
) -> anyhow::Result<()> {
    ctx.start_editing(6).await?;
    let down = restart::kill(pg);
    // Longer than the other outages, so that requests surely land in it.
    let outage = ctx.timing.outage + Duration::from_secs(1);
    // PostgreSQL backends are their own process groups (setsid), so a backend
    // can outlive the killed postmaster for a moment: probe until the gateway
    // notices, within the outage.
    let url = format!("{}/pages/{}", ctx.gateway.url(), ctx.page);
    let http = reqwest::Client::new();
    let mut seen = vec![];
    let mut status = String::new();
    while down.at.elapsed() < outage {
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
    let noticed = down.at.elapsed();
    tokio::time::sleep(outage.saturating_sub(noticed)).await;
    down.heal(pg).await?;
    ctx.wait_all_exit().await?;
    let events = ctx.log.all();
    let gave_up: u64 = events
        .iter()
        .filter(|e| e.kind() == "summary")
        .filter_map(|e| e.u64("errors"))
        .sum();
    row.note(format!(
        "gateway answered {} while Postgres was down {:?} (503 after {} ms), then recovered; \
         workers saw {} failed request(s), {gave_up} edit(s) ended in error (never acknowledged)",
        seen.join(" then "),
        outage,
        noticed.as_millis(),
        count(&events, "error"),
    ));
    if status != "503" {
        row.note("EXPECTED 503 during the outage");
    }
    Ok(())
}

async fn delayed_write(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    // One proxy in front of the gateway and one in front of each lock server,
    // all for the delayed worker only: its whole network is slow.
    let gateway = ctx.gateway.port();
    let link = HeldLink::start(std::iter::once(gateway).chain(ctx.services.ports())).await?;
    let gw_url = format!(
        "http://127.0.0.1:{}",
        link.proxy_port(gateway).context("the gateway's proxy")?
    );
    let slow = ctx.spec_via("slow", 1, &gw_url, &link.via());
    ctx.spawn(&slow)?;
    ctx.wait_event("slow", "read").await?;
    let held = link.inject();
    // The lost-lock check passes (the lease is fresh) and the PUT leaves...
    ctx.wait_event("slow", "writing").await?;
    // ...but is held. Renewals are held too, so the lease expires.
    ctx.spawn_bystanders()?;
    let other = ctx.spec("other", 1);
    ctx.spawn(&other)?;
    ctx.wait_event("other", "wrote").await?;
    tokio::time::sleep(ctx.timing.resume_after).await;
    held.heal();
    ctx.wait_all_exit().await?;
    row.note(format!(
        "PUT held {} bytes until after the other's write; slow worker: {}",
        link.bytes_held(gateway),
        ctx.outcome_of("slow")
    ));
    Ok(())
}

async fn clock_jump(ctx: &mut Ctx<'_>, row: &mut Row, monotonic: bool) -> anyhow::Result<()> {
    let clock = ClockJump::new(monotonic)?;
    let jumper = clock.arm(ctx.spec("jumper", 3));
    ctx.spawn(&jumper)?;
    let other = ctx.spec("other", 3);
    ctx.spawn(&other)?;
    clock.inject(&ctx.log, "jumper", EVENT_WAIT).await?;
    ctx.wait_all_exit().await?;
    let events = ctx.log.all();
    let jumped = events.iter().filter(|e| e.client == "jumper").any(|e| {
        e.json["ts"]
            .as_i64()
            .is_some_and(|ts| ts - e.received_ms > 3_000_000)
    });
    let first = |k: &str, field: &str| {
        events
            .iter()
            .find(|e| e.is("jumper", k))
            .and_then(|e| e.str(field).map(|m| format!(" [{k}: {m}]")))
            .unwrap_or_default()
    };
    let details = format!("{}{}", first("lost", "reason"), first("error", "message"));
    let count = |k: &str| count_of(&events, "jumper", k);
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
