//! The faults of replicated lock services: a ZooKeeper ensemble losing its
//! leader or being partitioned, a Sentinel failover that loses a grant (with
//! and without `WAIT 1`), and a Redlock client cut off from a minority of its
//! masters.
//!
//! As in [`crate::scenarios`], every step waits on an event (a worker's
//! JSONL event, a server's `srvr` mode, the sentinels' answer); the notes
//! report what the evidence shows, in numbers.

use std::time::Duration;

use anyhow::{bail, Context};
use harness::faults::{
    zookeeper_leader_kill, zookeeper_partition, HeldLink, SentinelFailover, StopSelf,
};
use harness::procs::{Event, WorkerSpec};

use crate::ctx::{count, count_of, first_token, Ctx, EVENT_WAIT};
use crate::report::Row;

/// Kill the leader after the first acknowledged edit; the workers go on.
pub async fn zookeeper_leader_kill(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    ctx.start_editing(4).await?;
    let killed = zookeeper_leader_kill::inject(ctx.ensemble()?).await?;
    let (new_leader, election) = killed.elected.clone().map_err(anyhow::Error::msg)?;
    let (leader, killed_ms) = (killed.leader, killed.at_ms);
    ctx.wait_all_exit().await?;
    killed.heal(ctx.ensemble()?).await?;
    let after: Vec<Event> = ctx
        .log
        .all()
        .into_iter()
        .filter(|e| e.ts() >= killed_ms)
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
    let zk = ctx.ensemble()?;
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
    let partitioned = zookeeper_partition::inject(ctx.ensemble()?, cut)?;
    let cut_ms = partitioned.at_ms;
    let b = ctx.spec("b", 2);
    ctx.spawn(&b)?;
    // b's grant means the majority expired a's session: the partition
    // lasted longer than the session timeout.
    let b_acquired = ctx.wait_event("b", "acquired").await?;
    let a_done = ctx
        .log
        .wait_for("a's outcome", EVENT_WAIT, |e| {
            e.client == "a" && matches!(e.kind(), "wrote" | "rejected" | "lost" | "error")
        })
        .await?;
    ctx.wait_event("b", "wrote").await?;
    let healed = partitioned.heal(ctx.ensemble()?).await?;
    ctx.wait_all_exit().await?;
    let events = ctx.log.all();
    row.note(format!(
        "zk{} (a follower, a's only server) cut off from the other two right after a's read \
         (token {}), healed {} ms later; b was granted the lock {} ms after the cut (token {}); \
         a's outcome {} ms after the cut: {}",
        cut + 1,
        first_token(&events, "a"),
        healed.at_ms - cut_ms,
        b_acquired.ts() - cut_ms,
        first_token(&events, "b"),
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
    let with_wait = |spec: WorkerSpec| {
        if wait {
            spec.arg("--redis-wait-replicas", 1)
                .arg("--redis-wait-timeout", "200ms")
        } else {
            spec
        }
    };
    let sides = SentinelFailover::find(ctx.sentinel()?).await?;

    // Some history first, replicated: the page's fence and the counter on
    // both servers agree.
    let before = with_wait(ctx.spec("before", 2));
    ctx.spawn(&before)?;
    ctx.wait_all_exit().await?;
    sides.wait_in_sync(ctx.sentinel()?).await?;
    sides.detach(ctx.sentinel()?).await?;

    if !wait {
        // a is granted the lock on the master only, and stops right before
        // its PUT (its lease, 10 s, stays valid through what follows).
        let (ia, paused) = ctx
            .spawn_stopped(with_wait(ctx.spec("a", 1)), StopSelf("writing"))
            .await?;
        let promoted = sides.inject(ctx.sentinel()?).await?;
        // The old master comes back at once (the sentinels turn it into a
        // replica of the new one) while b works on the new master.
        ctx.sentinel()?.thaw(promoted.old());
        let b = with_wait(ctx.spec("b", 1));
        ctx.spawn(&b)?;
        ctx.wait_event("b", "wrote").await?;
        paused.heal(&ctx.workers[ia]);
        ctx.wait_event("a", "released").await?;
        let took = promoted.took;
        promoted.heal(ctx.sentinel()?).await?;
        ctx.wait_all_exit().await?;
        let events = ctx.log.all();
        let (ta, tb) = (first_token(&events, "a"), first_token(&events, "b"));
        row.note(format!(
            "master frozen, replica promoted in {} ms; a's grant (token {ta}) never reached it",
            took.as_millis()
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
        let refused_by_wait = |e: &Event| {
            e.kind() == "error" && e.str("message").is_some_and(|m| m.contains("(WAIT)"))
        };
        ctx.log
            .wait_for("a grant refused by WAIT", EVENT_WAIT, |e| {
                e.client == "a" && refused_by_wait(e)
            })
            .await?;
        let promoted = sides.inject(ctx.sentinel()?).await?;
        let b = with_wait(ctx.spec("b", 1));
        ctx.spawn(&b)?;
        // The new master has no replica until the old one is back as one:
        // until then WAIT refuses every grant there too.
        let took = promoted.took;
        promoted.heal(ctx.sentinel()?).await?;
        ctx.wait_event("b", "wrote").await?;
        ctx.wait_all_exit().await?;
        let events = ctx.log.all();
        let refused = events.iter().filter(|e| refused_by_wait(e)).count();
        row.note(format!(
            "WAIT 1 refused (and released) {refused} grant(s) that no replica acknowledged; \
             master frozen, replica promoted in {} ms; no grant was ever held that the \
             failover lost; tokens: a {}, b {}",
            took.as_millis(),
            first_token(&events, "a"),
            first_token(&events, "b"),
        ));
    }
    Ok(())
}

/// Client *a* cannot reach master 1 of 3 (a proxy holds its traffic) while
/// *a* and *b* both edit.
pub async fn redlock_partition(ctx: &mut Ctx<'_>, row: &mut Row) -> anyhow::Result<()> {
    let masters = ctx.services.ports();
    let cut = *masters.first().context("no redlock node")?;
    let link = HeldLink::start([cut]).await?;
    let held = link.inject();
    let a = ctx.spec_via("a", 3, &ctx.gateway.url(), &link.via());
    ctx.spawn(&a)?;
    let b = ctx.spec("b", 3);
    ctx.spawn(&b)?;
    ctx.wait_all_exit().await?;
    held.heal();
    let events = ctx.log.all();
    row.note(format!(
        "a could not reach master 1 of {} during its whole run ({} bytes held); \
         acknowledged: a {}, b {}; a majority of the other masters still decides",
        masters.len(),
        link.bytes_held(cut),
        count_of(&events, "a", "wrote"),
        count_of(&events, "b", "wrote"),
    ));
    Ok(())
}
