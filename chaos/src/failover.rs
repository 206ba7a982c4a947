//! The rows on stacks of their own: the storage's fence under a
//! PostgreSQL failover (asynchronous and synchronous standby), and one of two
//! gateways behind HAProxy SIGKILLed mid-run.
//!
//! # `postgres-failover-async` / `-sync`
//! One gateway on a primary with a streaming standby, reached through the
//! multi-host URL (`target_session_attrs=read-write`), so it follows the
//! promotion by itself.
//!
//! 1. Worker *paused* takes the lock (token t1), does its fenced read (the
//!    fence is t1 on the primary), and freezes itself at `writing`.
//! 2. The runner waits until the standby has replayed all of that, then cuts
//!    the replication link (both ways: a network partition between the two
//!    servers; clients still reach the primary).
//! 3. Worker *other* takes the lock once *paused*'s lease expired (t2 > t1)
//!    and edits twice. An asynchronous primary acknowledges both edits; a
//!    synchronous one cannot (the standby never confirms), so they hang.
//! 4. Right after the second acknowledgement, or [`STALL`] after *other*'s
//!    grant if none comes, the primary is SIGKILLed. What the link held is
//!    dropped; the standby is promoted.
//! 5. The fence of the page on the new primary is read straight from it, and
//!    compared with the highest token acknowledged to any client before the
//!    kill. Then *paused* resumes and sends its PUT with t1.
//!
//! Numbers: `lost updates` = acknowledged lines missing from the final page;
//! `stale accepted` = accepted writes whose token is below the fence already
//! acknowledged (including what the old primary acknowledged and the new one
//! never saw: see [`crate::history::stale_writes_accepted`]); a note says
//! whether the fence went backwards.
//!
//! # `gateway-kill`
//! Two gateway processes on one database behind HAProxy (health-checked on
//! `/readyz`); two workers edit through the balancer; one gateway is
//! SIGKILLed the moment a PUT leaves a worker. The row counts the requests
//! that failed and checks that edits go on through the other gateway and that
//! no acknowledged edit is lost.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use harness::faults::{gateway_kill, postgres_failover, StopSelf};
use harness::procs::{now_ms, Event, GatewayProc};
use harness::{Haproxy, PostgresPair, Replication};

use crate::backends::Services;
use crate::ctx::{Ctx, RowInput, EVENT_WAIT};
use crate::history;
use crate::report::Row;
use crate::scenarios::Scenario;

/// The phrase a failover row's note starts with when the page's fence on the
/// new primary is lower than a token already acknowledged.
pub const FENCE_WENT_BACKWARDS: &str = "FENCE WENT BACKWARDS";

/// How long the runner waits for the second acknowledged edit behind a cut
/// replication link before it kills the primary anyway (a synchronous primary
/// never acknowledges it).
pub const STALL: Duration = Duration::from_secs(4);

/// Whether `scenario` brings its own services (run by [`run`]).
pub fn owns_its_stack(scenario: Scenario) -> bool {
    matches!(
        scenario,
        Scenario::PostgresFailoverAsync | Scenario::PostgresFailoverSync | Scenario::GatewayKill
    )
}

/// Run one of [`owns_its_stack`]'s scenarios and fill `row`.
pub async fn run(
    scenario: Scenario,
    services: &mut Services,
    input: RowInput,
    row: &mut Row,
) -> anyhow::Result<()> {
    match scenario {
        Scenario::PostgresFailoverAsync => {
            postgres_failover(services, input, row, Replication::Async).await
        }
        Scenario::PostgresFailoverSync => {
            postgres_failover(services, input, row, Replication::Sync).await
        }
        Scenario::GatewayKill => gateway_kill(services, input, row).await,
        other => anyhow::bail!("{} does not bring its own stack", other.name()),
    }
}

/// What the script saw at the failover.
struct Failover {
    /// The highest token a client had been acknowledged (a fenced read or a
    /// write that succeeded) when the primary was killed.
    acknowledged_max: Option<u64>,
    /// The page's fence and last history id on the new primary, read right
    /// after the promotion.
    fence_after: Option<i64>,
    seq_after: i64,
    db_name: String,
}

async fn postgres_failover(
    services: &mut Services,
    input: RowInput,
    row: &mut Row,
    replication: Replication,
) -> anyhow::Result<()> {
    let page = input.page.clone();
    let mut pg = PostgresPair::start(replication).await;
    let url = pg.create_database().await;
    let gateway = GatewayProc::spawn(&url, input.fencing, services.issuer().as_ref()).await?;
    let mut ctx = Ctx::new(services, &gateway, input);
    let script = failover_script(&mut ctx, row, &mut pg, &url).await;
    let collected = ctx.collect(row, &gateway.url()).await;
    let failover = script?;
    collected?;

    let attempts = history::load(
        &pg.primary_url(&failover.db_name),
        std::slice::from_ref(&page),
    )
    .await?;
    let floor = failover.acknowledged_max.map(|t| (failover.seq_after, t));
    row.stale_accepted = history::stale_writes_accepted(&attempts, floor);

    let backwards = failover
        .acknowledged_max
        .is_some_and(|acked| failover.fence_after.unwrap_or(0) < acked as i64);
    let fence_after = failover
        .fence_after
        .map_or("none".to_string(), |t| t.to_string());
    let acked = failover
        .acknowledged_max
        .map_or("none".to_string(), |t| t.to_string());
    if backwards {
        row.note(format!(
            "{FENCE_WENT_BACKWARDS}: token {acked} had been acknowledged, the new primary's fence is {fence_after}"
        ));
    } else {
        row.note(format!(
            "fence kept: new primary's fence {fence_after}, highest token acknowledged before the kill {acked}"
        ));
    }
    row.note(paused_outcome(
        &ctx.log.all(),
        "paused",
        failover.acknowledged_max,
    ));
    if replication != Replication::Async {
        if backwards {
            row.note("EXPECTED the fence to survive a synchronous failover");
        }
        if row.lost_updates != 0 || row.stale_accepted != 0 {
            row.note("EXPECTED no loss and no stale write with a synchronous standby");
        }
    }
    Ok(())
}

async fn failover_script(
    ctx: &mut Ctx<'_>,
    row: &mut Row,
    pg: &mut PostgresPair,
    url: &str,
) -> anyhow::Result<Failover> {
    let db_name = history::database_name(url)?;

    let (p, paused) = ctx
        .spawn_stopped(ctx.spec("paused", 1), StopSelf("writing"))
        .await?;

    pg.wait_caught_up(Duration::from_secs(30))
        .await
        .map_err(|e| anyhow::anyhow!("standby did not catch up: {e}"))?;
    let cut = postgres_failover::cut(pg);

    let other = ctx.spec("other", 2);
    ctx.spawn(&other)?;
    ctx.wait_event("other", "acquired").await?;
    let second_ack = ctx
        .log
        .wait_for("a second `wrote` from other", STALL, |e| {
            e.is("other", "wrote") && e.u64("edit").is_some_and(|n| n >= 2)
        })
        .await;
    // The stack goes with the row: the failover is not healed.
    let failed_over = cut.fail_over(pg).await;
    let killed_at = failed_over.killed_at;
    let events = ctx.log.all();
    let acknowledged_max = acknowledged_tokens(&events, killed_at).into_iter().max();
    let acked_before = events
        .iter()
        .filter(|e| e.kind() == "wrote" && e.received_ms <= killed_at)
        .count();
    let (fence_after, seq_after) =
        history::fence_and_seq(&pg.primary_url(&db_name), &ctx.page).await?;

    let missing_wal = failed_over
        .wal_lost
        .map_or("unknown".to_string(), |b| format!("{b} bytes"));
    let killed = if second_ack.is_ok() {
        "right after other's second acknowledged edit".to_string()
    } else {
        format!(
            "after waiting {} s for an acknowledgement that never came",
            STALL.as_secs()
        )
    };
    row.note(format!(
        "{} standby, link cut after it caught up; the primary was SIGKILLed {killed} with {acked_before} edit(s) acknowledged behind the cut ({missing_wal} of WAL never reached the standby); promoted in {} ms",
        pg.replication().name(),
        failed_over.promotion.as_millis()
    ));

    // The gateway kept pooled connections to the dead primary; each fails
    // one request before it is replaced. Any traffic flushes them: wait until
    // the gateway serves the page from the new primary, so that the resumed
    // holder's PUT reaches it (instead of failing once, after which the
    // worker re-checks its lease and abandons).
    let page_url = format!("{}/pages/{}", ctx.gateway.url(), ctx.page);
    let http = reqwest::Client::new();
    harness::wait_until(Duration::from_secs(30), || async {
        let status = http.get(&page_url).send().await?.status();
        if status.is_success() || status == reqwest::StatusCode::NOT_FOUND {
            Ok(())
        } else {
            Err(anyhow::anyhow!("gateway answered {status}"))
        }
    })
    .await
    .context("the gateway did not serve from the new primary")?;

    paused.heal(&ctx.workers[p]);
    ctx.wait_all_exit().await?;
    Ok(Failover {
        acknowledged_max,
        fence_after,
        seq_after,
        db_name,
    })
}

/// What the resumed holder's write came to, against what had been
/// acknowledged before the kill.
fn paused_outcome(events: &[Event], client: &str, acknowledged_max: Option<u64>) -> String {
    let token = events
        .iter()
        .find(|e| e.client == client && e.kind() == "acquired")
        .and_then(|e| e.u64("token"));
    let last = events.iter().rfind(|e| {
        e.client == client && matches!(e.kind(), "wrote" | "rejected" | "lost" | "error")
    });
    let show = |t: Option<u64>| t.map_or("none".to_string(), |t| t.to_string());
    let what = match last.map(Event::kind) {
        Some("wrote") if token < acknowledged_max => format!(
            "ACCEPTED although token {} had been acknowledged before the failover: a stale write",
            show(acknowledged_max)
        ),
        Some("wrote") => "accepted: nothing newer than its token had been acknowledged (the \
                          next holder's access never committed), so it is not stale; that \
                          holder read it before writing"
            .to_string(),
        Some("rejected") => match last.and_then(|e| e.str("error")) {
            Some("stale_token") => "refused by the fence (stale_token)".to_string(),
            Some("token_not_current") => "refused by the issuer check (token_not_current: \
                                          the lock service no longer grants that token)"
                .to_string(),
            other => format!("refused ({})", other.unwrap_or("?")),
        },
        Some("lost") => "abandoned by its own lost-lock check".to_string(),
        Some(other) => format!("ended in {other}"),
        None => "did nothing visible".to_string(),
    };
    format!(
        "paused holder (token {}) resumed: its write was {what}",
        show(token)
    )
}

/// Tokens the storage acknowledged to a client before `until` (unix ms): the
/// token of each `wrote`, and the grant's token of each `read` (a fenced read
/// that succeeded raised the fence to it).
pub fn acknowledged_tokens(events: &[Event], until: i64) -> Vec<u64> {
    let mut granted: HashMap<&str, u64> = HashMap::new();
    let mut out = vec![];
    for e in events.iter().filter(|e| e.received_ms <= until) {
        match e.kind() {
            "acquired" => {
                if let Some(t) = e.u64("token") {
                    granted.insert(&e.client, t);
                }
            }
            "read" => out.extend(granted.get(e.client.as_str()).copied()),
            "wrote" => out.extend(e.u64("token")),
            _ => {}
        }
    }
    out
}

async fn gateway_kill(
    services: &mut Services,
    input: RowInput,
    row: &mut Row,
) -> anyhow::Result<()> {
    let db = harness::fresh_database().await;
    let issuer = services.issuer();
    let mut victim = GatewayProc::spawn(&db, input.fencing, issuer.as_ref()).await?;
    let survivor = GatewayProc::spawn(&db, input.fencing, issuer.as_ref()).await?;
    let balancer = Haproxy::start(&[victim.port(), survivor.port()]).await;
    balancer
        .wait_up(2, Duration::from_secs(30))
        .await
        .map_err(|e| anyhow::anyhow!("balancer: {e}"))?;
    let mut ctx = Ctx::new(services, &survivor, input);
    let outcome = gateway_kill_script(&mut ctx, row, &balancer, &mut victim).await;
    ctx.finish(row, outcome, &balancer.url()).await
}

async fn gateway_kill_script(
    ctx: &mut Ctx<'_>,
    row: &mut Row,
    balancer: &Haproxy,
    victim: &mut GatewayProc,
) -> anyhow::Result<()> {
    for name in ["a", "b"] {
        let spec = ctx.spec_via(name, 6, &balancer.url(), &HashMap::new());
        ctx.spawn(&spec)?;
    }
    ctx.log
        .wait_for("a first `wrote`", EVENT_WAIT, |e| e.kind() == "wrote")
        .await?;
    // Load besides the two workers (who take turns under one lock): readers
    // hammering the page through the balancer, so that requests are in
    // flight on the victim when it dies.
    let readers = Readers::start(&format!("{}/pages/{}", balancer.url(), ctx.page), 4);
    let armed = now_ms();
    ctx.log
        .wait_for("a PUT leaving a worker", EVENT_WAIT, |e| {
            e.kind() == "writing" && e.received_ms >= armed
        })
        .await?;
    // The victim is the balancer's first server; it stays down.
    let down = gateway_kill::inject(victim, balancer, 0).await;
    let killed_at = down.killed_at;
    let after = ctx
        .log
        .wait_for("an edit acknowledged after the kill", EVENT_WAIT, |e| {
            e.kind() == "wrote" && e.received_ms > killed_at
        })
        .await;
    let (reads, failed_reads, first_read_failure) = readers.stop(killed_at).await;
    ctx.wait_all_exit().await?;

    let events = ctx.log.all();
    let failed: Vec<&Event> = events
        .iter()
        .filter(|e| e.kind() == "error" && e.received_ms >= killed_at)
        .collect();
    let acked_after = events
        .iter()
        .filter(|e| e.kind() == "wrote" && e.received_ms > killed_at)
        .count();
    let first_failure = failed
        .first()
        .and_then(|e| e.str("message"))
        .map(|m| format!(" (first: {})", without_urls(m)))
        .unwrap_or_default();
    row.note(format!(
        "gateway 1 of 2 SIGKILLed as a PUT left a worker; balancer marked it DOWN after {}; \
         background reads through the balancer: {failed_reads} of {reads} failed{first_read_failure}; \
         the workers' requests: {} failed after the kill{first_failure}; {acked_after} edit(s) acknowledged after it through the other gateway",
        match &down.marked_down {
            Ok(after) => format!("{} ms", after.as_millis()),
            Err(e) => format!("NEVER ({e})"),
        },
        failed.len(),
    ));
    if after.is_err() || down.marked_down.is_err() {
        row.note("EXPECTED edits to go on through the surviving gateway");
    }
    Ok(())
}

/// Requests made, and the failed ones as (unix ms, what).
type ReaderTally = (u64, Vec<(i64, String)>);

/// Concurrent readers of one URL, counting what fails.
struct Readers {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<ReaderTally>>,
}

impl Readers {
    fn start(url: &str, n: usize) -> Self {
        let (stop, _) = tokio::sync::watch::channel(false);
        let tasks = (0..n)
            .map(|_| {
                let url = url.to_string();
                let stopped = stop.subscribe();
                tokio::spawn(async move {
                    let http = reqwest::Client::new();
                    let (mut n, mut failures) = (0, vec![]);
                    while !*stopped.borrow() {
                        n += 1;
                        let outcome = http
                            .get(&url)
                            .timeout(Duration::from_secs(5))
                            .send()
                            .await
                            .map(|r| r.status());
                        match outcome {
                            Ok(s) if s.is_success() => {}
                            Ok(s) => failures.push((now_ms(), s.to_string())),
                            Err(e) => failures.push((now_ms(), error_chain(&e))),
                        }
                    }
                    (n, failures)
                })
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stop; `(requests, failed, " (first: ... N ms after the kill)")`.
    async fn stop(self, killed_at: i64) -> (u64, u64, String) {
        self.stop.send_replace(true);
        let (mut total, mut failures) = (0, vec![]);
        for t in self.tasks {
            if let Ok((n, f)) = t.await {
                total += n;
                failures.extend(f);
            }
        }
        failures.sort();
        let first = failures
            .first()
            .map(|(at, what)| format!(" (first: {what}, {} ms after the kill)", at - killed_at))
            .unwrap_or_default();
        (total, failures.len() as u64, first)
    }
}

/// An error and its sources, `a: b: c`, without the URLs.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    without_urls(&parts.join(": "))
}

/// `... for url (http://x/y): ...` -> `...: ...`: the URLs only add noise to a table.
fn without_urls(text: &str) -> String {
    let mut out = text.to_string();
    while let Some(start) = out.find(" (http") {
        match out[start..].find(')') {
            Some(end) => out.replace_range(start..start + end + 1, ""),
            None => break,
        }
    }
    out.replace(" for url", "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(client: &str, received_ms: i64, v: serde_json::Value) -> Event {
        Event {
            client: client.into(),
            json: v,
            received_ms,
        }
    }

    #[test]
    fn grants_count_once_read_and_writes_once_acknowledged() {
        let events = vec![
            ev("p", 1, json!({"event": "acquired", "token": 5})),
            ev("p", 2, json!({"event": "read"})),
            ev("o", 3, json!({"event": "acquired", "token": 7})),
            ev("o", 9, json!({"event": "read"})),
            ev("o", 10, json!({"event": "wrote", "token": 7})),
        ];
        assert_eq!(acknowledged_tokens(&events, 5), vec![5]);
        assert_eq!(acknowledged_tokens(&events, 10), vec![5, 7, 7]);
    }

    #[test]
    fn urls_are_left_out_of_messages() {
        assert_eq!(
            without_urls("error sending request for url (http://127.0.0.1:1/pages/x): reset"),
            "error sending request: reset"
        );
    }
}
