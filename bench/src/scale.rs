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
//!
//! Its own load generator and pgbench driver are small copies of the ones in
//! `gateway.rs`, kept apart so that `bench gateway` can change freely.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chaos::procs::GatewayProc;
use harness::{Haproxy, Postgres};

use crate::stats::{median, spread, Run};

#[derive(clap::Args)]
pub struct Args {
    /// Seconds per measured run.
    #[arg(long, default_value_t = 5)]
    secs: u64,
    /// Runs per setup and client count (figures are medians).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
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
    let json = serde_json::json!({ "body": body }).to_string();
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("fenced_put.sql");
    std::fs::write(
        &script,
        format!("\\set id random(1, {})\n{};\n", args.pages, pgbench_sql()),
    )?;
    let mut token = 1_u64;
    eprintln!("seeding {} pages", args.pages);
    load(
        &[addr(gw1.port())],
        8,
        Duration::ZERO,
        args.pages,
        token,
        &json,
        Some(args.pages),
    )
    .await?;
    eprintln!("warming up");
    for setup in Setup::ALL {
        if setup != Setup::Pgbench {
            let targets = targets(setup, &gw1, &gw2, &lb1, &lb2);
            load(
                &targets,
                8,
                Duration::from_secs(1),
                args.pages,
                token,
                &json,
                None,
            )
            .await?;
        }
    }

    let mut results: Vec<(Setup, usize, Vec<Measured>)> = vec![];
    for &c in &args.clients {
        for setup in Setup::ALL {
            results.push((setup, c, vec![]));
        }
    }
    for r in 0..args.repeats {
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
                pgbench(
                    &pg,
                    &db,
                    &script,
                    dir.path(),
                    *clients,
                    args.secs,
                    token,
                    &body,
                )
                .await?
            } else {
                let targets = targets(*setup, &gw1, &gw2, &lb1, &lb2);
                load(
                    &targets,
                    *clients,
                    Duration::from_secs(args.secs),
                    args.pages,
                    token,
                    &json,
                    None,
                )
                .await?
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
                args.repeats,
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

/// Which children's CPU counts with a process's own.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Children {
    No,
    /// Those it has waited for (their time is in its `cutime`/`cstime`).
    Reaped,
    /// Reaped ones and live ones (PostgreSQL forks a backend per connection).
    All,
}

/// CPU seconds of `pid` (user + system), with `children` as said.
fn cpu_of(pid: u32, children: Children) -> f64 {
    // USER_HZ: the unit of /proc/PID/stat's times, 100 on Linux.
    const TICKS: f64 = 100.0;
    let fields = |pid: u32| -> Vec<u64> {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = s.rsplit_once(')')?.1.to_string();
                // After the name: state is field 3; utime 14, stime 15, cutime 16, cstime 17.
                Some(
                    rest.split_whitespace()
                        .skip(11)
                        .take(4)
                        .filter_map(|f| f.parse().ok())
                        .collect(),
                )
            })
            .unwrap_or_default()
    };
    let own = fields(pid);
    let with_reaped = if children == Children::No { 2 } else { 4 };
    let mut ticks: u64 = own.iter().take(with_reaped).sum();
    if children == Children::All {
        for child in children_of(pid) {
            ticks += fields(child).iter().take(2).sum::<u64>();
        }
    }
    ticks as f64 / TICKS
}

fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')?
                        .1
                        .split_whitespace()
                        .nth(1)?
                        .parse::<u32>()
                        .ok()
                })
                == Some(parent)
        })
        .collect()
}

/// `clients` keep-alive connections spread round-robin over `targets`, each
/// PUTting random pages back to back for `secs`; or, with `once`, PUTting
/// pages 1..=once exactly once between them (seeding).
async fn load(
    targets: &[SocketAddr],
    clients: usize,
    secs: Duration,
    pages: u64,
    token: u64,
    json: &str,
    once: Option<u64>,
) -> anyhow::Result<Run> {
    let start = Instant::now();
    let deadline = start + secs;
    let mut tasks = vec![];
    for c in 0..clients {
        let addr = targets[c % targets.len()];
        let json = json.to_string();
        tasks.push(tokio::spawn(async move {
            let mut conn = HttpConn::connect(addr).await?;
            let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (c as u64 + 1);
            let mut latencies = vec![];
            let mut k = c as u64;
            loop {
                let id = match once {
                    Some(n) => {
                        if k >= n {
                            break;
                        }
                        k += clients as u64;
                        k - clients as u64 + 1
                    }
                    None => {
                        if Instant::now() >= deadline {
                            break;
                        }
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng % pages + 1
                    }
                };
                let t0 = Instant::now();
                let status = conn.put(id, token, &json).await?;
                if !(200..300).contains(&status) {
                    bail!("PUT /pages/{id} answered {status}");
                }
                latencies.push(t0.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = vec![];
    for t in tasks {
        latencies.extend(t.await??);
    }
    Ok(Run {
        ops: latencies.len() as u64,
        elapsed: start.elapsed(),
        latencies,
    })
}

/// One keep-alive HTTP/1.1 connection that only sends our PUT.
struct HttpConn {
    stream: tokio::io::BufReader<tokio::net::TcpStream>,
    request: Vec<u8>,
    line: String,
    /// The API key of [`BENCH_CLIENT`].
    key: String,
}

impl HttpConn {
    async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: tokio::io::BufReader::new(stream),
            request: Vec::with_capacity(512),
            line: String::new(),
            key: chaos::procs::api_key(BENCH_CLIENT),
        })
    }

    async fn put(&mut self, id: u64, token: u64, json: &str) -> anyhow::Result<u16> {
        use std::io::Write;
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        self.request.clear();
        write!(
            self.request,
            "PUT /pages/{id} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n\
             fencing-token: {token}\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\n\r\n{json}",
            self.key,
            json.len()
        )?;
        self.stream.get_mut().write_all(&self.request).await?;
        self.line.clear();
        self.stream.read_line(&mut self.line).await?;
        let status: u16 = self
            .line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {:?}", self.line))?;
        let mut length = 0_usize;
        loop {
            self.line.clear();
            if self.stream.read_line(&mut self.line).await? == 0 {
                bail!("connection closed");
            }
            let l = self.line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse()?;
                }
            }
        }
        let mut body = vec![0_u8; length];
        self.stream.read_exact(&mut body).await?;
        Ok(status)
    }
}

/// The gateway's statement with pgbench variables for its parameters.
fn pgbench_sql() -> String {
    let mut sql: String = gateway::store::FENCED_ACCESS
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for (param, var) in [
        ("$8", "(:client::text)"),
        ("$7", "(:enforce::boolean)"),
        ("$6", "(null::bigint)"),
        ("$5", "(:issuer::text)"),
        ("$4", "(:tok::bigint)"),
        ("$3", "(:body::text)"),
        ("$2", "(:method::text)"),
        ("$1", "(:id::text)"),
    ] {
        sql = sql.replace(param, var);
    }
    sql
}

#[allow(clippy::too_many_arguments)]
async fn pgbench(
    pg: &Postgres,
    db: &str,
    script: &Path,
    dir: &Path,
    clients: usize,
    secs: u64,
    token: u64,
    body: &str,
) -> anyhow::Result<Run> {
    let out = tokio::process::Command::new(harness::postgres::pgbench())
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &pg.port().to_string(),
            "-U",
            "postgres",
            "-d",
            db,
        ])
        .args(["-n", "-M", "prepared"])
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args(["-T", &secs.to_string()])
        .args(["-D", "method=PUT", "-D", &format!("body={body}")])
        .args(["-D", &format!("tok={token}"), "-D", "issuer=default"])
        .args(["-D", "enforce=true", "-D", "client=pgbench"])
        .arg("-f")
        .arg(script)
        .current_dir(dir)
        .kill_on_drop(true)
        .output()
        .await
        .context("run pgbench")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "pgbench failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
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
