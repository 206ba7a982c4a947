//! The hot page: one page, fenced edits through a real gateway,
//! by one worker alone and by three together, with the fair and the
//! non-fair variant of a lock. The question is whether the lock shares the
//! page (every worker gets edits) and wastes little of it (three together
//! make about as many edits per second as one alone), and how long the lock
//! sits idle between one holder's release and the next grant.
//!
//! Each worker is the worker's edit without its retries: acquire the page's
//! lock (TTL 2 s, wait 10 s, renewed), fenced GET, fenced PUT of the body
//! with one more line, release; no simulated work (`--work-ms 0`). Each has
//! its own lock-service connection (or session, or pool) and its own API key,
//! as separate processes would; the gateway checks every token with the
//! issuer (trust on, as in the demo). The page keeps its last 20 lines, so
//! that its growing body does not slow later edits down.
//!
//! Beside them, the ceiling: the same three workers taking turns on an
//! in-process FIFO mutex (tokio's), each acquiring the lock only once its
//! turn came, so that the lock service never sees contention. That is what
//! three workers on this machine make of one page when handing over costs
//! nothing but a task wake-up; the contended lock's own cost is the distance
//! from it (noise on this machine can put a run on either side).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use fencelock::{LockService, WaitStats};
use tokio::time::Instant;
use worker::client::{GatewayClient, OfferedToken};

use super::services::{worker_key, HotClient, Services};
use crate::stats::{median, quantile};

/// The workers of the "together" run.
pub const WORKERS: usize = 3;
/// The lines a page keeps.
const KEEP_LINES: usize = 20;

/// One hot-page measurement of one variant.
#[derive(Debug, Clone)]
pub struct Hot {
    /// Acknowledged edits per second, one worker alone.
    pub alone: f64,
    /// Acknowledged edits per second, three workers together.
    pub together: f64,
    /// Acknowledged edits per second, three workers taking turns on an
    /// in-process mutex (the ceiling, see the module's doc).
    pub turns: f64,
    /// Each worker's share of the acknowledged edits, together.
    pub shares: Vec<f64>,
    /// From a holder sending its release to the next holder's acquire
    /// returning (whoever that is), together.
    pub handover_p50: Duration,
    pub handover_p99: Duration,
    /// Lock-service round trips per second per worker beyond the one try of
    /// each grant, together: retries after refusals, and on MariaDB the bell
    /// waits (a PostgreSQL notification or a Redis message costs none).
    /// `None` for a lock that keeps no such counters (ZooKeeper).
    pub extra_round_trips: Option<f64>,
    /// Edits refused by the fence or the issuer check (should be none).
    pub rejected: u64,
    /// Edits that failed transiently (a 503: the gateway could not ask the
    /// issuer in time) and were given up; not counted as acknowledged.
    pub failed: u64,
}

impl Hot {
    /// Three together ÷ one alone.
    pub fn ratio(&self) -> f64 {
        self.of_alone(self.together)
    }

    /// The ceiling: three taking turns ÷ one alone.
    pub fn turns_ratio(&self) -> f64 {
        self.of_alone(self.turns)
    }

    /// `rate` ÷ one worker alone (0 when nothing was measured alone).
    fn of_alone(&self, rate: f64) -> f64 {
        if self.alone > 0.0 {
            rate / self.alone
        } else {
            0.0
        }
    }

    /// The smallest worker's share.
    pub fn min_share(&self) -> f64 {
        self.shares.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// The targets: ≥ 0.8× and every worker ≥ 20 %.
    pub fn meets_targets(&self) -> bool {
        self.ratio() >= 0.8 && self.min_share() >= 0.2
    }
}

/// The medians of a variant's repeats, figure by figure.
pub fn medians(runs: &[Hot]) -> Option<Hot> {
    if runs.is_empty() {
        return None;
    }
    let med = |f: fn(&Hot) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let med_d = |f: fn(&Hot) -> Duration| {
        Duration::from_secs_f64(median(
            &runs.iter().map(|h| f(h).as_secs_f64()).collect::<Vec<_>>(),
        ))
    };
    // The shares of the median run by smallest share, so they add up.
    let mut by_share: Vec<&Hot> = runs.iter().collect();
    by_share.sort_by(|a, b| a.min_share().total_cmp(&b.min_share()));
    let extra: Vec<f64> = runs.iter().filter_map(|h| h.extra_round_trips).collect();
    Some(Hot {
        alone: med(|h| h.alone),
        together: med(|h| h.together),
        turns: med(|h| h.turns),
        shares: by_share[by_share.len() / 2].shares.clone(),
        handover_p50: med_d(|h| h.handover_p50),
        handover_p99: med_d(|h| h.handover_p99),
        extra_round_trips: (!extra.is_empty()).then(|| median(&extra)),
        rejected: runs.iter().map(|h| h.rejected).sum(),
        failed: runs.iter().map(|h| h.failed).sum(),
    })
}

/// One edit of one worker.
struct Edit {
    granted: Instant,
    release_sent: Instant,
}

/// What one worker did in one run.
struct WorkerRun {
    edits: Vec<Edit>,
    acknowledged: u64,
    rejected: u64,
    failed: u64,
}

/// Measure one variant: one worker alone on page `<page>-1`, then three
/// together on `<page>-3`, then three taking turns on `<page>-turns`, `secs`
/// each.
pub async fn measure(
    services: &Services,
    page: &str,
    fair: bool,
    secs: Duration,
) -> anyhow::Result<Hot> {
    if services.issuer().is_none() {
        bail!("the hot page needs a lock that mints tokens");
    }
    let gw = services.gateway(WORKERS).await?;
    let mut clients = vec![];
    for i in 0..WORKERS {
        let client = services.hot_client(&format!("cmp-{i}"), fair).await?;
        let gateway = GatewayClient::new(&gw.url(), &format!("cmp-{i}"))?
            .with_api_key(Some(worker_key(i).parse().map_err(anyhow::Error::msg)?));
        clients.push((client, gateway));
    }
    let result = async {
        let alone = run(&clients[..1], &format!("{page}-1"), secs, None).await?;
        let before: Vec<Option<WaitStats>> = clients
            .iter()
            .map(|(c, _)| c.stats.as_ref().map(|s| s()))
            .collect();
        let start = Instant::now();
        let together = run(&clients, &format!("{page}-3"), secs, None).await?;
        let elapsed = start.elapsed().as_secs_f64();
        let after: Vec<Option<WaitStats>> = clients
            .iter()
            .map(|(c, _)| c.stats.as_ref().map(|s| s()))
            .collect();
        let turn = Arc::new(tokio::sync::Mutex::new(()));
        let turns = run(&clients, &format!("{page}-turns"), secs, Some(turn)).await?;
        let turns_acked: u64 = turns.0.iter().map(|w| w.acknowledged).sum();
        let alone_acked: u64 = alone.0.iter().map(|w| w.acknowledged).sum();
        let acked: Vec<u64> = together.0.iter().map(|w| w.acknowledged).collect();
        let total: u64 = acked.iter().sum();
        if alone_acked == 0 || total == 0 {
            bail!("no edit acknowledged (alone {alone_acked}, together {total})");
        }
        // Hand-over: every grant after the first, from the release before it.
        let mut edits: Vec<&Edit> = together.0.iter().flat_map(|w| &w.edits).collect();
        edits.sort_by_key(|e| e.granted);
        let handovers: Vec<Duration> = edits
            .windows(2)
            .map(|w| w[1].granted.saturating_duration_since(w[0].release_sent))
            .collect();
        let extra_round_trips = before
            .iter()
            .zip(&after)
            .map(|(b, a)| match (b, a) {
                (Some(b), Some(a)) => Some(
                    (a.tries - b.tries)
                        + if services.waits_are_round_trips() {
                            (a.notified - b.notified) + (a.timed_out - b.timed_out)
                        } else {
                            0
                        },
                ),
                _ => None,
            })
            .collect::<Option<Vec<u64>>>()
            .map(|per_worker| {
                let grants = edits.len() as u64;
                let extra = per_worker.iter().sum::<u64>().saturating_sub(grants);
                extra as f64 / elapsed / WORKERS as f64
            });
        Ok(Hot {
            alone: alone_acked as f64 / alone.1.as_secs_f64(),
            together: total as f64 / together.1.as_secs_f64(),
            turns: turns_acked as f64 / turns.1.as_secs_f64(),
            shares: acked.iter().map(|&a| a as f64 / total as f64).collect(),
            handover_p50: quantile(&handovers, 0.5),
            handover_p99: quantile(&handovers, 0.99),
            extra_round_trips,
            rejected: [&alone.0, &together.0, &turns.0]
                .into_iter()
                .flatten()
                .map(|w| w.rejected)
                .sum(),
            failed: [&alone.0, &together.0, &turns.0]
                .into_iter()
                .flatten()
                .map(|w| w.failed)
                .sum(),
        })
    }
    .await;
    let _ = gw.shutdown().await;
    result
}

/// The given workers edit `page` together for `secs`; each worker's run and
/// how long they took. With `turn`, each edit waits for its turn on that
/// mutex first (FIFO) and keeps it until its lease is released.
async fn run(
    clients: &[(HotClient, GatewayClient)],
    page: &str,
    secs: Duration,
    turn: Option<Arc<tokio::sync::Mutex<()>>>,
) -> anyhow::Result<(Vec<WorkerRun>, Duration)> {
    let start = Instant::now();
    let until = start + secs;
    let tasks = clients.iter().enumerate().map(|(i, (client, gateway))| {
        let locks = client.locks.clone();
        let gateway = gateway.clone();
        let page = page.to_string();
        let turn = turn.clone();
        tokio::spawn(async move { edits(&*locks, &gateway, &page, i, until, turn).await })
    });
    let mut runs = vec![];
    for t in futures::future::join_all(tasks).await {
        runs.push(t.context("hot-page worker panicked")??);
    }
    Ok((runs, start.elapsed()))
}

/// One worker's edits until `until`.
async fn edits(
    locks: &dyn LockService,
    gateway: &GatewayClient,
    page: &str,
    worker: usize,
    until: Instant,
    turn: Option<Arc<tokio::sync::Mutex<()>>>,
) -> anyhow::Result<WorkerRun> {
    let lock = format!("page:{page}");
    let mut run = WorkerRun {
        edits: vec![],
        acknowledged: 0,
        rejected: 0,
        failed: 0,
    };
    while Instant::now() < until {
        let my_turn = match &turn {
            Some(t) => Some(t.lock().await),
            None => None,
        };
        let lease = locks
            .acquire(&lock, Duration::from_secs(2), Duration::from_secs(10))
            .await
            .with_context(|| format!("worker {worker}: acquire"))?;
        let granted = Instant::now();
        let fence = OfferedToken {
            token: lease.token().context("the hot page needs tokens")?,
            issuer: lease.issuer().to_string(),
        };
        let outcome = async {
            let read = gateway.get(page, Some(&fence)).await?;
            let mut lines: Vec<&str> = read.body.lines().collect();
            let line = format!("cmp-{worker} token={}", fence.token);
            lines.push(&line);
            let keep = lines.len().saturating_sub(KEEP_LINES);
            let body = lines[keep..].join("\n");
            gateway.put(page, &body, Some(&fence), None).await
        }
        .await;
        let release_sent = Instant::now();
        lease
            .release()
            .await
            .with_context(|| format!("worker {worker}: release"))?;
        match outcome {
            Ok(_) => run.acknowledged += 1,
            Err(e) if e.is_fence_rejection() => run.rejected += 1,
            Err(e) if e.is_transient() => run.failed += 1,
            Err(e) => return Err(anyhow::anyhow!("worker {worker}: {e}")),
        }
        drop(my_turn);
        run.edits.push(Edit {
            granted,
            release_sent,
        });
    }
    Ok(run)
}
