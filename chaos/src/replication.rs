//! The faults of replicated lock services (issue 14): a ZooKeeper ensemble
//! losing its leader or being partitioned, a Sentinel failover that loses a
//! grant (with and without `WAIT 1`), and a Redlock client cut off from a
//! minority of its masters.
//!
//! As in [`crate::scenarios`], every step waits on an event (a worker's
//! JSONL event, a server's `srvr` mode, the sentinels' answer); the notes
//! report what the evidence shows, in numbers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::procs::{now_ms, Event};
use crate::report::Row;
use crate::scenarios::{Ctx, EVENT_WAIT};
use harness::proxy::{DelayProxy, Mode};

/// How long a failover or an election may take before the row fails.
const SERVICE_WAIT: Duration = Duration::from_secs(40);

fn events_of<'e>(events: &'e [Event], client: &str, kind: &str) -> Vec<&'e Event> {
    events
        .iter()
        .filter(|e| e.client == client && e.kind() == kind)
        .collect()
}

fn count(events: &[Event], kind: &str) -> usize {
    events.iter().filter(|e| e.kind() == kind).count()
}

/// The token of `client`'s first `acquired` event, as text.
fn first_token(events: &[Event], client: &str) -> String {
    events_of(events, client, "acquired")
        .first()
        .and_then(|e| e.u64("token"))
        .map_or_else(|| "none".into(), |t| t.to_string())
}

/// Kill the leader after the first acknowledged edit; the workers go on.
pub async fn zookeeper_leader_kill(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    let a = ctx.spec("a", 4);
    let b = ctx.spec("b", 4);
    ctx.spawn(&a)?;
    ctx.spawn(&b)?;
    ctx.log
        .wait_for("a first `wrote`", EVENT_WAIT, |e| e.kind() == "wrote")
        .await?;
    let zk = ctx
        .services
        .zookeeper
        .as_mut()
        .context("zookeeper")?
        .ensemble()?;
    let leader = zk.leader().await.context("no leader before the kill")?;
    let killed = Instant::now();
    let killed_ms = now_ms();
    zk.kill(leader);
    let new_leader = harness::wait_until(SERVICE_WAIT, || async {
        match zk.leader().await {
            Some(l) if l != leader => Ok(l),
            other => Err(format!("leader {other:?}")),
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("no new leader after the kill: {e}\n{}", zk.logs(20)))?;
    let election = killed.elapsed();
    ctx.wait_all_exit().await?;
    let zk = ctx
        .services
        .zookeeper
        .as_mut()
        .context("zookeeper")?
        .ensemble()?;
    zk.start_again(leader).await;
    let events = ctx.log.all();
    let after: Vec<Event> = events
        .iter()
        .filter(|e| e.ts() >= killed_ms)
        .cloned()
        .collect();
    row.note(format!(
        "SIGKILLed the leader zk{} after the first acknowledged edit; zk{} led {} ms later; \
         after the kill: {} edit(s) acknowledged, {} `lost`, {} failed request(s) retried",
        leader + 1,
        new_leader + 1,
        election.as_millis(),
        count(&after, "wrote"),
        count(&after, "lost"),
        count(&after, "error"),
    ));
    Ok(())
}

/// Worker *a* reaches only follower X; X is cut off from the other two for
/// longer than the session timeout while worker *b* (on the majority) goes on.
pub async fn zookeeper_partition(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    let zk = ctx
        .services
        .zookeeper
        .as_mut()
        .context("zookeeper")?
        .ensemble()?;
    let leader = zk.leader().await.context("no leader")?;
    let cut = (leader + 1) % zk.len();
    if zk.mode(cut).await.as_deref() != Some("follower") {
        bail!("zk{} is not a follower", cut + 1);
    }
    let only_cut = zk.connect_string_to(cut);
    // a works 3 s between its read and its lost-lock check, so that the
    // partition (right after its read) falls inside its critical section.
    let a = ctx
        .spec("a", 1)
        .set("--zookeeper-connect", &only_cut)
        .set("--work-ms", 3000);
    ctx.spawn(&a)?;
    ctx.wait_event("a", "read").await?;
    let zk = ctx
        .services
        .zookeeper
        .as_mut()
        .context("zookeeper")?
        .ensemble()?;
    zk.partition(cut)?;
    let cut_ms = now_ms();
    let b = ctx.spec("b", 2);
    ctx.spawn(&b)?;
    // b's grant means the majority expired a's session: the partition
    // lasted longer than the session timeout.
    let b_acquired = ctx.wait_event("b", "acquired").await?;
    let a_client = ctx.client("a");
    let a_done = ctx
        .log
        .wait_for("a's outcome", EVENT_WAIT, move |e| {
            e.client == a_client && matches!(e.kind(), "wrote" | "rejected" | "lost" | "error")
        })
        .await?;
    ctx.wait_event("b", "wrote").await?;
    let zk = ctx
        .services
        .zookeeper
        .as_mut()
        .context("zookeeper")?
        .ensemble()?;
    zk.heal()?;
    let healed_ms = now_ms();
    zk.wait_all_serving(SERVICE_WAIT)
        .await
        .map_err(|e| anyhow::anyhow!("after the heal: {e}\n{}", zk.logs(20)))?;
    ctx.wait_all_exit().await?;
    row.note(format!(
        "zk{} (a follower, a's only server) cut off from the other two right after a's read \
         (token {}), healed {} ms later; b was granted the lock {} ms after the cut (token {}); \
         a's outcome {} ms after the cut: {}",
        cut + 1,
        first_token(&ctx.log.all(), &ctx.client("a")),
        healed_ms - cut_ms,
        b_acquired.ts() - cut_ms,
        first_token(&ctx.log.all(), &ctx.client("b")),
        a_done.ts() - cut_ms,
        ctx.outcome_of("a"),
    ));
    Ok(())
}

/// The Sentinel failover that loses a grant; `wait`: every worker sends
/// `WAIT 1 200` after its grants.
pub async fn sentinel_failover(ctx: &mut Ctx<'_>, row: &mut Row, wait: bool) -> anyhow::Result<()> {
    // The first holder's lease must still be valid when the second is granted.
    ctx.timing.ttl = Duration::from_secs(10);
    let with_wait = |spec: crate::procs::WorkerSpec| {
        if wait {
            spec.arg("--redis-wait-replicas", 1)
                .arg("--redis-wait-timeout", "200ms")
        } else {
            spec
        }
    };
    let group = ctx.services.sentinel.as_mut().context("sentinel group")?;
    let master = group
        .named_master()
        .await
        .context("the sentinels name no master")?;
    let replica = 1 - master;
    group
        .wait_in_sync(master, replica, SERVICE_WAIT)
        .await
        .map_err(anyhow::Error::msg)?;

    // Some history first, replicated: the page's fence and the counter on
    // both servers agree.
    let before = with_wait(ctx.spec("before", 2));
    ctx.spawn(&before)?;
    ctx.wait_all_exit().await?;
    let group = ctx.services.sentinel.as_mut().context("sentinel group")?;
    group
        .wait_in_sync(master, replica, SERVICE_WAIT)
        .await
        .map_err(anyhow::Error::msg)?;
    group
        .detach_replica(replica, master)
        .await
        .map_err(anyhow::Error::msg)?;

    if !wait {
        // a is granted the lock on the master only, and stops right before
        // its PUT (its lease, 10 s, stays valid through what follows).
        let a = with_wait(ctx.spec("a", 1)).arg("--stop-self-at", "writing");
        let ia = ctx.spawn(&a)?;
        ctx.wait_event("a", "writing").await?;
        ctx.workers[ia]
            .wait_stopped(Duration::from_secs(5))
            .await
            .context("a did not stop itself")?;
        let failover = failover(ctx, master, replica).await?;
        // The old master comes back at once (the sentinels turn it into a
        // replica of the new one) while b works on the new master.
        ctx.services
            .sentinel
            .as_mut()
            .context("sentinel group")?
            .thaw(master);
        let b = with_wait(ctx.spec("b", 1));
        ctx.spawn(&b)?;
        ctx.wait_event("b", "wrote").await?;
        ctx.workers[ia].resume();
        ctx.wait_event("a", "released").await?;
        restore(ctx, master, replica).await?;
        ctx.wait_all_exit().await?;
        let events = ctx.log.all();
        let (ta, tb) = (
            first_token(&events, &ctx.client("a")),
            first_token(&events, &ctx.client("b")),
        );
        row.note(format!(
            "master frozen, replica promoted in {} ms; a's grant (token {ta}) never reached it",
            failover.as_millis()
        ));
        row.note(format!(
            "second holder: b was granted the same lock by the promoted replica with token {tb} \
             while a's lease was valid; {}; then a resumed: {}",
            if ta == tb {
                format!(
                    "the same number, re-minted by a counter that never saw a's grant. \
                     The fence refuses only LOWER tokens, so it alone lets both pass; {}",
                    if ctx.fencing {
                        "the gateway's issuer check asks the promoted master, which names \
                         b as the holder of that token"
                    } else {
                        "with the fence off nothing is checked"
                    }
                )
            } else {
                format!("tokens {ta} (a) and {tb} (b)")
            },
            ctx.outcome_of("a")
        ));
    } else {
        // a's grants are refused by WAIT while the replica is cut off.
        let a = with_wait(ctx.spec("a", 1));
        ctx.spawn(&a)?;
        let a_client = ctx.client("a");
        ctx.log
            .wait_for("a grant refused by WAIT", EVENT_WAIT, move |e| {
                e.client == a_client
                    && e.kind() == "error"
                    && e.str("message").is_some_and(|m| m.contains("(WAIT)"))
            })
            .await?;
        let failover = failover(ctx, master, replica).await?;
        let b = with_wait(ctx.spec("b", 1));
        ctx.spawn(&b)?;
        // The new master has no replica until the old one is back as one:
        // until then WAIT refuses every grant there too.
        restore(ctx, master, replica).await?;
        ctx.wait_event("b", "wrote").await?;
        ctx.wait_all_exit().await?;
        let events = ctx.log.all();
        let refused = events
            .iter()
            .filter(|e| {
                e.kind() == "error" && e.str("message").is_some_and(|m| m.contains("(WAIT)"))
            })
            .count();
        row.note(format!(
            "WAIT 1 refused (and released) {refused} grant(s) that no replica acknowledged; \
             master frozen, replica promoted in {} ms; no grant was ever held that the \
             failover lost; tokens: a {}, b {}",
            failover.as_millis(),
            first_token(&events, &ctx.client("a")),
            first_token(&events, &ctx.client("b")),
        ));
    }
    Ok(())
}

/// Freeze the master, thaw the detached replica, wait until the sentinels
/// promote it. How long that took.
async fn failover(ctx: &mut Ctx<'_>, master: usize, replica: usize) -> anyhow::Result<Duration> {
    let group = ctx.services.sentinel.as_mut().context("sentinel group")?;
    group.freeze(master);
    let frozen = Instant::now();
    group.thaw(replica);
    group
        .wait_master(replica, SERVICE_WAIT)
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(frozen.elapsed())
}

/// Thaw the old master; the sentinels turn it into a replica of the new one.
/// Wait until it is in sync, so the group is whole for the next row.
async fn restore(ctx: &mut Ctx<'_>, old: usize, new: usize) -> anyhow::Result<()> {
    let group = ctx.services.sentinel.as_mut().context("sentinel group")?;
    group.thaw(old);
    group
        .wait_in_sync(new, old, SERVICE_WAIT)
        .await
        .map_err(|e| anyhow::anyhow!("the old master did not rejoin as a replica: {e}"))
}

/// Client *a* cannot reach master 1 of 3 (a proxy holds its traffic) while
/// *a* and *b* both edit.
pub async fn redlock_partition(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    let mut proxies = vec![];
    let mut via = HashMap::new();
    for port in ctx.services.ports() {
        let p = DelayProxy::start(([127, 0, 0, 1], port).into()).await?;
        via.insert(port, p.port());
        proxies.push(p);
    }
    let cut = proxies.first().context("no redlock node")?;
    cut.set_mode(Mode::Hold);
    let a = ctx.spec_via("a", 3, &ctx.gateway.url(), &via);
    ctx.spawn(&a)?;
    let b = ctx.spec("b", 3);
    ctx.spawn(&b)?;
    ctx.wait_all_exit().await?;
    cut.set_mode(Mode::Pass);
    let events = ctx.log.all();
    let acked = |who: &str| events_of(&events, &ctx.client(who), "wrote").len();
    row.note(format!(
        "a could not reach master 1 of {} during its whole run ({} bytes held); \
         acknowledged: a {}, b {}; a majority of the other masters still decides",
        proxies.len(),
        cut.bytes_delayed(),
        acked("a"),
        acked("b"),
    ));
    Ok(())
}
