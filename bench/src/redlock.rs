//! Redlock with N = 3 and N = 5 beside the single-instance Redis lock, beside
//! `rslock` (the Rust Redlock crate users find first on crates.io), and beside
//! the limit: the bare `SET NX PX` then `DEL` round trips to the same N nodes
//! with no lock logic at all. All in one run, on the same redis-servers.
//!
//! One operation is one uncontended acquire followed by its release, issued by
//! `--clients` concurrent tasks on distinct lock names over one shared client
//! per contender (how a worker process uses it). In each run every contender
//! gets `--seconds` in total, in 250 ms turns taken round-robin (so load from
//! elsewhere on the machine hits all alike); runs are repeated `--runs` times
//! and the table quotes medians over runs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fencelock::redis::RedisLock;
use fencelock::redlock::Redlock;
use fencelock::{AcquireOptions, LockService};
use futures::future::join_all;
use harness::Redis;
use tokio::time::Instant;

use crate::stats::{median, ms, spread, Run};

/// Length of one turn of one contender.
const SLICE_MS: u64 = 250;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Seconds each contender runs, per run.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Repetitions of the whole round (medians are quoted).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Concurrent tasks, each on its own lock name.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Lock TTL in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    ttl_ms: u64,
}

/// No renewal (the op is released at once); a round that misses its per-node
/// timeout on a starved machine is retried, as rslock retries (3 tries).
fn opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new(ttl)
        .auto_renew(false)
        .wait(Duration::from_secs(1))
}

/// Who is measured.
#[derive(Clone)]
enum Contender {
    Limit(Vec<redis::aio::MultiplexedConnection>),
    Single(Arc<RedisLock>),
    Ours(Arc<Redlock>),
    Rslock(rslock::LockManager),
}

impl Contender {
    async fn once(&self, name: &str, ttl: Duration) -> anyhow::Result<()> {
        match self {
            Contender::Limit(conns) => set_del_all(conns, name, ttl).await?,
            Contender::Single(lock) => {
                let lease = lock.acquire_with(name, opts(ttl)).await?;
                lease.release().await?;
            }
            Contender::Ours(lock) => {
                let lease = lock.acquire_with(name, opts(ttl)).await?;
                lease.release().await?;
            }
            Contender::Rslock(manager) => rslock_once(manager, name, ttl).await?,
        }
        Ok(())
    }
}

/// The limit's round trips: `SET name x NX PX ttl` on every node at once, then
/// `DEL name` on every node at once: Redlock's requests with no lock logic.
pub(crate) async fn set_del_all(
    conns: &[redis::aio::MultiplexedConnection],
    name: &str,
    ttl: Duration,
) -> anyhow::Result<()> {
    let ttl_ms = ttl.as_millis() as u64;
    let set = join_all(conns.iter().map(|c| {
        let mut c = c.clone();
        async move {
            redis::cmd("SET")
                .arg(name)
                .arg("x")
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .query_async::<redis::Value>(&mut c)
                .await
        }
    }))
    .await;
    for r in set {
        r?;
    }
    let del = join_all(conns.iter().map(|c| {
        let mut c = c.clone();
        async move { redis::cmd("DEL").arg(name).query_async::<i64>(&mut c).await }
    }))
    .await;
    for r in del {
        r?;
    }
    Ok(())
}

/// rslock's `lock` of `name` for `ttl`, then `unlock`.
pub(crate) async fn rslock_once(
    manager: &rslock::LockManager,
    name: &str,
    ttl: Duration,
) -> anyhow::Result<()> {
    let lock = manager
        .lock(name.as_bytes(), ttl)
        .await
        .map_err(|e| anyhow::anyhow!("rslock: {e}"))?;
    manager.unlock(&lock).await;
    Ok(())
}

/// Run `contender` for `slice` and add what it did to `run`.
async fn measure(
    contender: &Contender,
    label: &str,
    clients: usize,
    slice: Duration,
    ttl: Duration,
    run: &mut Run,
) -> anyhow::Result<()> {
    let until = Instant::now() + slice;
    let started = Instant::now();
    let tasks = (0..clients).map(|i| {
        let contender = contender.clone();
        let name = format!("bench-{label}-{i}");
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < until {
                let t = Instant::now();
                contender.once(&name, ttl).await?;
                latencies.push(t.elapsed());
            }
            anyhow::Ok(latencies)
        })
    });
    for t in join_all(tasks).await {
        let latencies = t.context("bench task panicked")??;
        run.ops += latencies.len() as u64;
        run.latencies.extend(latencies);
    }
    run.elapsed += started.elapsed();
    Ok(())
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let ttl = Duration::from_millis(args.ttl_ms);
    let single_server = Redis::start().await;
    let mut nodes = Vec::new();
    for _ in 0..5 {
        nodes.push(Redis::start().await);
    }
    let urls: Vec<String> = nodes.iter().map(Redis::url).collect();

    let mut contenders: Vec<(String, usize, Contender)> = Vec::new();
    let bare_single = redis::Client::open(single_server.url())?
        .get_multiplexed_async_connection()
        .await?;
    contenders.push((
        "limit: bare SET NX PX + DEL".into(),
        1,
        Contender::Limit(vec![bare_single]),
    ));
    let single = RedisLock::connect(&single_server.url()).await?;
    contenders.push((
        "worker RedisLock (single instance)".into(),
        1,
        Contender::Single(Arc::new(single)),
    ));
    for n in [3usize, 5] {
        let mut conns = Vec::new();
        for url in &urls[..n] {
            conns.push(
                redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            );
        }
        contenders.push((
            "limit: bare SET NX PX + DEL on all nodes".into(),
            n,
            Contender::Limit(conns),
        ));
        let ours = Redlock::connect(&urls[..n]).await?;
        contenders.push(("worker Redlock".into(), n, Contender::Ours(Arc::new(ours))));
        let rs = rslock::LockManager::new(urls[..n].to_vec());
        contenders.push(("rslock 0.10.0".into(), n, Contender::Rslock(rs)));
    }

    // Warm up every contender (connections, script caches).
    for (i, (_, _, c)) in contenders.iter().enumerate() {
        for _ in 0..50 {
            c.once(&format!("warmup-{i}"), ttl).await?;
        }
    }

    // The machine is shared and noisy: within a run the contenders take turns
    // in short slices, so a burst of load hits all of them alike.
    let slice = Duration::from_millis(SLICE_MS);
    let slices = (args.seconds * 1000 / SLICE_MS).max(1);
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); contenders.len()];
    for r in 0..args.runs {
        let mut this_run = vec![Run::default(); contenders.len()];
        for _ in 0..slices {
            for (i, (_, _, c)) in contenders.iter().enumerate() {
                measure(
                    c,
                    &format!("{i}"),
                    args.clients,
                    slice,
                    ttl,
                    &mut this_run[i],
                )
                .await?;
            }
        }
        for (i, ((label, n, _), run)) in contenders.iter().zip(this_run).enumerate() {
            eprintln!(
                "run {}: {label} N={n}: {:.0}/s p50 {} ms p99 {} ms",
                r + 1,
                run.per_sec(),
                ms(run.p50()),
                ms(run.p99())
            );
            runs[i].push(run);
        }
    }

    println!(
        "\n{} runs × {} s per contender, {} concurrent client task(s), TTL {} ms, \
         acquire+release uncontended\n",
        args.runs, args.seconds, args.clients, args.ttl_ms
    );
    println!("| what | N | acquire+release/s (median) | spread | p50 ms | p99 ms | vs rslock |");
    println!("|---|---|---|---|---|---|---|");
    let rslock_rate = |n: usize| {
        contenders
            .iter()
            .zip(&runs)
            .find(|((_, m, c), _)| *m == n && matches!(c, Contender::Rslock(_)))
            .map(|(_, rs)| median(&rs.iter().map(Run::per_sec).collect::<Vec<_>>()))
    };
    for ((label, n, _), rs) in contenders.iter().zip(&runs) {
        let rates: Vec<f64> = rs.iter().map(Run::per_sec).collect();
        let rate = median(&rates);
        let (lo, hi) = spread(&rates);
        let p50 = median(&rs.iter().map(|r| r.p50().as_secs_f64()).collect::<Vec<_>>());
        let p99 = median(&rs.iter().map(|r| r.p99().as_secs_f64()).collect::<Vec<_>>());
        let versus = match rslock_rate(*n) {
            Some(base) if base > 0.0 => format!("{:.2}×", rate / base),
            _ => "—".into(),
        };
        println!(
            "| {label} | {n} | {rate:.0} | {lo:.0}–{hi:.0} | {} | {} | {versus} |",
            ms(Duration::from_secs_f64(p50)),
            ms(Duration::from_secs_f64(p99)),
        );
    }
    Ok(())
}
