//! `cargo run --release -p bench -- scale`: fenced PUT/s with one and with two
//! gateway processes on one PostgreSQL, direct and behind HAProxy, beside
//! pgbench running the gateway's own statement (the database's ceiling), and
//! where the CPU goes in each (docs/SCALING.md).
//!
//! The gateways are the release binary as processes (`cargo build --release
//! -p gateway` first), each with its default pool of PostgreSQL connections.
//! The load is `clients` keep-alive HTTP/1.1 connections, each PUTting random
//! pages out of `--pages` back to back with one token per run (equal tokens
//! are accepted, so every request is an accepted fenced write). CPU is read
//! from /proc before and after each run: the gateways, PostgreSQL (the
//! postmaster, its live backends and the ones it reaped), HAProxy, and this
//! process with the children it reaped (the HTTP load generator; pgbench).
//! The load generator is [`crate::http`], pgbench runs the statement as
//! [`crate::pgbench`] has it: both as `bench gateway` uses them.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chaos::procs::GatewayProc;
use harness::{Haproxy, Postgres};

use crate::cpu::{cpu_of, Children};
use crate::http::{Counted, Headers, Load, Pages};
use crate::pgbench::{self, FencedPuts};
use crate::stats::{median, spread, Repeats, Run};
use crate::tools::output;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    runs: Repeats,
    /// Client counts (HTTP connections; pgbench clients).
    #[arg(long, value_delimiter = ',', default_value = "8,32")]
    clients: Vec<usize>,
    /// How many pages the writes are spread over (1: every write on one page,
    /// serialized by its row lock).
    #[arg(long, default_value_t = 1000)]
    pages: u64,
}

const BODY_LEN: usize = 100;
/// Whose key the load sends (one the chaos gateways know).
const BENCH_CLIENT: &str = "a";

/// One way of sending the load.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    OneGateway,
    TwoGateways,
    OneBehindHaproxy,
    TwoBehindHaproxy,
    Pgbench,
}

impl Setup {
    const ALL: [Setup; 5] = [
        Setup::OneGateway,
        Setup::TwoGateways,
        Setup::OneBehindHaproxy,
        Setup::TwoBehindHaproxy,
        Setup::Pgbench,
    ];

    fn label(self) -> &'static str {
        match self {
            Setup::OneGateway => "1 gateway",
            Setup::TwoGateways => "2 gateways (connections split evenly)",
            Setup::OneBehindHaproxy => "1 gateway behind HAProxy",
            Setup::TwoBehindHaproxy => "2 gateways behind HAProxy",
            Setup::Pgbench => "pgbench, the same statement (no HTTP)",
        }
    }
}

/// CPU seconds used during one run, by component.
#[derive(Clone, Copy, Default)]
struct Cpu {
    gateways: f64,
    postgres: f64,
    haproxy: f64,
    load: f64,
}

struct Measured {
    run: Run,
    cpu: Cpu,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut pg = Postgres::start().await;
    let pg_pid = pg.process().pid();
    let url = pg.create_database().await;
    let db = url.rsplit('/').next().context("database name")?.to_owned();
    // Keyed, as in the demo (one chaos client's key); no issuer check: the
    // tokens here are the bench's own, granted by no lock service.
    let gw1 = GatewayProc::spawn(&url, true, None).await?;
    let gw2 = GatewayProc::spawn(&url, true, None).await?;
    let mut lb1 = Haproxy::start(&[gw1.port()]).await;
    let mut lb2 = Haproxy::start(&[gw1.port(), gw2.port()]).await;
    for lb in [&lb1, &lb2] {
        lb.wait_up(1, Duration::from_secs(30))
            .await
            .map_err(|e| anyhow::anyhow!("balancer: {e}"))?;
    }
    lb2.wait_up(2, Duration::from_secs(30))
        .await
        .map_err(|e| anyhow::anyhow!("balancer: {e}"))?;
    let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let lb1_pid = lb1.process().pid();
    let lb2_pid = lb2.process().pid();
    let gw_pids: Vec<u32> = [&gw1, &gw2].iter().filter_map(|g| g.pid()).collect();

    let body = "x".repeat(BODY_LEN);
    let json = Load::json_of_len(BODY_LEN);
    let dir = tempfile::tempdir()?;
    let script = pgbench::fenced_access_script(dir.path(), args.pages)?;
    let mut token = 1_u64;
    eprintln!("seeding {} pages", args.pages);
    let each = Pages::Each {
        n: args.pages,
        token,
    };
    load(vec![addr(gw1.port())], 8, each, &json)
        .run(Duration::ZERO)
        .await?;
    eprintln!("warming up");
    let random = |token| Pages::Random {
        n: args.pages,
        token,
    };
    for setup in Setup::ALL {
        if setup != Setup::Pgbench {
            let targets = targets(setup, &gw1, &gw2, &lb1, &lb2);
            load(targets, 8, random(token), &json)
                .run(Duration::from_secs(1))
                .await?;
        }
    }

    let mut results: Vec<(Setup, usize, Vec<Measured>)> = vec![];
    for &c in &args.clients {
        for setup in Setup::ALL {
            results.push((setup, c, vec![]));
        }
    }
    for r in 0..args.runs.repeats {
        for (setup, clients, runs) in results.iter_mut() {
            token += 1;
            let pids = Pids {
                gateways: gw_pids.clone(),
                postgres: pg_pid,
                haproxy: match setup {
                    Setup::OneBehindHaproxy => lb1_pid,
                    Setup::TwoBehindHaproxy => lb2_pid,
                    _ => None,
                },
            };
            let before = pids.cpu();
            let run = if *setup == Setup::Pgbench {
                let puts = FencedPuts {
                    port: pg.port(),
                    db: &db,
                    script: &script,
                    clients: *clients,
                    secs: args.runs.secs,
                    token,
                    body: &body,
                };
                pgbench(&puts, dir.path()).await?
            } else {
                let targets = targets(*setup, &gw1, &gw2, &lb1, &lb2);
                load(targets, *clients, random(token), &json)
                    .run(Duration::from_secs(args.runs.secs))
                    .await?
                    .run
            };
            let after = pids.cpu();
            let cpu = Cpu {
                gateways: after.gateways - before.gateways,
                postgres: after.postgres - before.postgres,
                haproxy: after.haproxy - before.haproxy,
                load: after.load - before.load,
            };
            eprintln!(
                "run {}/{} c={clients:>2} {:<40} {:>7.0}/s",
                r + 1,
                args.runs.repeats,
                setup.label(),
                run.per_sec()
            );
            runs.push(Measured { run, cpu });
        }
    }
    println!("{}", table(&results));
    Ok(())
}

fn targets(
    setup: Setup,
    gw1: &GatewayProc,
    gw2: &GatewayProc,
    lb1: &Haproxy,
    lb2: &Haproxy,
) -> Vec<SocketAddr> {
    let a = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    match setup {
        Setup::OneGateway => vec![a(gw1.port())],
        Setup::TwoGateways => vec![a(gw1.port()), a(gw2.port())],
        Setup::OneBehindHaproxy => vec![a(lb1.port())],
        Setup::TwoBehindHaproxy => vec![a(lb2.port())],
        Setup::Pgbench => vec![],
    }
}

struct Pids {
    gateways: Vec<u32>,
    postgres: Option<u32>,
    haproxy: Option<u32>,
}

impl Pids {
    fn cpu(&self) -> Cpu {
        Cpu {
            gateways: self.gateways.iter().map(|&p| cpu_of(p, Children::No)).sum(),
            postgres: self.postgres.map_or(0.0, |p| cpu_of(p, Children::All)),
            haproxy: self.haproxy.map_or(0.0, |p| cpu_of(p, Children::No)),
            // With its reaped children: pgbench runs as one. The gateways,
            // PostgreSQL and HAProxy are live children, counted above.
            load: cpu_of(std::process::id(), Children::Reaped),
        }
    }
}

/// A load of fenced PUTs over `targets`, with the key of [`BENCH_CLIENT`].
fn load(targets: Vec<SocketAddr>, clients: usize, pages: Pages, json: &Arc<str>) -> Load {
    Load {
        targets,
        clients,
        pages,
        headers: Headers {
            key: Some(chaos::procs::api_key(BENCH_CLIENT)),
            ..Headers::default()
        },
        json: json.clone(),
        counted: Counted::Nothing,
    }
}

/// pgbench doing `puts` (in `dir`): its rate, and its mean latency as the
/// one sample it reports.
async fn pgbench(puts: &FencedPuts<'_>, dir: &Path) -> anyhow::Result<Run> {
    let stdout = output(puts.command().current_dir(dir))
        .await
        .context("run pgbench")?;
    let tx: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .context("pgbench's transaction count")?;
    let tps: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .context("pgbench's tps")?;
    let latency_ms: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("latency average = "))
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Ok(Run {
        ops: tx,
        elapsed: Duration::from_secs_f64(tx as f64 / tps),
        latencies: vec![Duration::from_secs_f64(latency_ms / 1000.0)],
    })
}

fn table(results: &[(Setup, usize, Vec<Measured>)]) -> String {
    let mut t = String::from(
        "| connections | setup | PUT/s (median, min..max) | vs 1 gateway | p50 / p99 ms | CPU ms per 1000 PUTs: gateways / PostgreSQL / HAProxy / load generator (or pgbench) |\n\
         |---:|---|---:|---:|---:|---:|\n",
    );
    for (setup, clients, runs) in results {
        let rates: Vec<f64> = runs.iter().map(|m| m.run.per_sec()).collect();
        let (lo, hi) = spread(&rates);
        let base: Vec<f64> = results
            .iter()
            .find(|(s, c, _)| *s == Setup::OneGateway && c == clients)
            .map(|(_, _, r)| r.iter().map(|m| m.run.per_sec()).collect())
            .unwrap_or_default();
        let per_k = |f: fn(&Cpu) -> f64| {
            let v: Vec<f64> = runs
                .iter()
                .map(|m| f(&m.cpu) * 1000.0 * 1000.0 / m.run.ops.max(1) as f64)
                .collect();
            median(&v)
        };
        let q = |f: fn(&Run) -> Duration| {
            let v: Vec<f64> = runs
                .iter()
                .map(|m| f(&m.run).as_secs_f64() * 1000.0)
                .collect();
            median(&v)
        };
        let latency = if *setup == Setup::Pgbench {
            format!("{:.2} (mean)", q(Run::p50))
        } else {
            format!("{:.2} / {:.2}", q(Run::p50), q(Run::p99))
        };
        t.push_str(&format!(
            "| {clients} | {} | {:.0} ({lo:.0}..{hi:.0}) | {:.2}× | {latency} | {:.0} / {:.0} / {:.0} / {:.0} |\n",
            setup.label(),
            median(&rates),
            median(&rates) / median(&base),
            per_k(|c| c.gateways),
            per_k(|c| c.postgres),
            per_k(|c| c.haproxy),
            per_k(|c| c.load),
        ));
    }
    t
}
