//! `cargo run --release -p bench -- gateway`: fenced PUTs through the gateway
//! beside two pgbench limits against the same database, at the same client
//! counts, in the same run, alternating:
//! - the **limit**: pgbench running the minimal statement that does the same
//!   job ([`MINIMAL_SQL`]: a conditional fenced update of the page and one
//!   history row, with the same history index);
//! - pgbench running the gateway's own statement for this case
//!   ([`gateway::store::FENCED_ACCESS`]), to separate what the statement costs
//!   from what the HTTP path costs.
//!
//! Every side writes a random page out of `--pages` with one fencing token
//! per run (an equal token is accepted, so every request is an accepted
//! fenced write: row lock, fence check, new body and version, history row).
//! Tokens increase from run to run. The gateway runs in this process (its
//! own tokio tasks) and is driven by keep-alive HTTP/1.1 connections
//! ([`crate::http`]).
//!
//! Targets: gateway PUT/s >= 0.8x the limit at 8 and 32 connections, and
//! gateway p99 <= 2x the limit's p99 at 32.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use gateway::FenceCheck;

use crate::cpu::{cpu_of, Children};
use crate::http::{Counted, Headers, Load, Pages};
use crate::pgbench::{self, FencedPuts};
use crate::stats::{median, ms, spread, Repeats, Run};
use crate::{machine, sections};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    runs: Repeats,
    /// Client counts (HTTP connections for the gateway, pgbench clients).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    clients: Vec<usize>,
    /// How many pages the writes are spread over.
    #[arg(long, default_value_t = 1000)]
    pages: u64,
    /// Gateway pool size (PostgreSQL connections behind the HTTP connections).
    #[arg(long, default_value_t = gateway::DEFAULT_POOL_SIZE)]
    pool: u32,
    /// Do not rewrite the Gateway section of docs/BENCHMARKS.md.
    #[arg(long)]
    no_write: bool,
    /// Only the gateway's runs, no pgbench and no table: for profiling the
    /// gateway's request path (e.g. under `perf record`).
    #[arg(long)]
    gateway_only: bool,
}

const BODY_LEN: usize = 100;

/// The minimal statement that does a fenced PUT's job: update the page only
/// if the token is not older than its fence, and record one history row.
/// pgbench variables: `:id`, `:body`, `:tok`.
pub const MINIMAL_SQL: &str = "with u as (
    update pages set body = (:body::text), version = version + 1,
        fence_token = (:tok::bigint), updated_at = now()
    where id = (:id::text) and fence_token <= (:tok::bigint)
    returning id, version, fence_token
)
insert into page_history (page_id, method, outcome, token, version, fence_token)
select id, 'PUT', 'accepted', (:tok::bigint), version, fence_token from u";

/// The targets: gateway / limit at 8 and 32 connections, p99 at 32.
const MIN_THROUGHPUT_RATIO: f64 = 0.8;
const MAX_P99_RATIO: f64 = 2.0;

pub async fn run(args: Args) -> anyhow::Result<()> {
    // The gateway logs as its binary does (its default filter) into a sink:
    // what per-request tracing costs is measured, its output is not kept.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            gateway::DEFAULT_LOG_FILTER,
        ))
        .with_writer(std::io::sink)
        .with_ansi(false)
        .try_init();
    let pg = harness::Postgres::start().await;
    let url = pg.create_database().await;
    let db = url.rsplit('/').next().context("database name")?.to_owned();
    let gw = gateway::spawn_with(&url, FenceCheck::Enforce, args.pool).await?;
    let body = "x".repeat(BODY_LEN);
    let json = Load::json_of_len(BODY_LEN);
    let dir = tempfile::tempdir()?;
    let own = pgbench::fenced_access_script(dir.path(), args.pages)?;
    let minimal = pgbench::write_script(dir.path(), "minimal.sql", MINIMAL_SQL, args.pages)?;
    let mut token = 1_u64;

    eprintln!("seeding {} pages", args.pages);
    let each = Pages::Each {
        n: args.pages,
        token,
    };
    load(gw.addr(), 8, each, &json).run(Duration::ZERO).await?;

    eprintln!("warming up");
    gateway_run(
        gw.addr(),
        8,
        Duration::from_secs(1),
        args.pages,
        token,
        &json,
    )
    .await?;
    let puts = |script, clients, secs, token| FencedPuts {
        port: pg.port(),
        db: &db,
        script,
        clients,
        secs,
        token,
        body: &body,
    };
    for script in [&minimal, &own] {
        pgbench_run(&puts(script, 8, 1, token), dir.path()).await?;
    }

    let mut rows = Vec::new();
    for &c in &args.clients {
        rows.push(Row {
            clients: c,
            gateway: Vec::new(),
            cpu_us: Vec::new(),
            minimal: Vec::new(),
            own: Vec::new(),
        });
    }
    for r in 0..args.runs.repeats {
        for row in rows.iter_mut() {
            token += 1;
            let secs = Duration::from_secs(args.runs.secs);
            let (g, cpu_us) =
                gateway_run(gw.addr(), row.clients, secs, args.pages, token, &json).await?;
            if args.gateway_only {
                eprintln!(
                    "run {}/{} c={:>2}: gateway {:>7.0}/s p50 {} p99 {} cpu {:.0} us/PUT  (load {})",
                    r + 1,
                    args.runs.repeats,
                    row.clients,
                    g.per_sec(),
                    ms(g.p50()),
                    ms(g.p99()),
                    cpu_us,
                    machine::load_average(),
                );
                continue;
            }
            let (clients, secs) = (row.clients, args.runs.secs);
            let m = pgbench_run(&puts(&minimal, clients, secs, token), dir.path()).await?;
            let o = pgbench_run(&puts(&own, clients, secs, token), dir.path()).await?;
            eprintln!(
                "run {}/{} c={:>2}: gateway {:>7.0}/s p99 {} cpu {:.0} us/PUT  minimal {:>7.0}/s p99 {}  own statement {:>7.0}/s  (load {})",
                r + 1,
                args.runs.repeats,
                row.clients,
                g.per_sec(),
                ms(g.p99()),
                cpu_us,
                m.per_sec(),
                ms(m.p99()),
                o.per_sec(),
                machine::load_average(),
            );
            row.gateway.push(g);
            row.cpu_us.push(cpu_us);
            row.minimal.push(m);
            row.own.push(o);
        }
    }
    gw.shutdown().await?;
    if args.gateway_only {
        return Ok(());
    }

    let table = table(&rows);
    println!("{table}");
    if !args.no_write {
        let section = section_text(&args, &table);
        sections::write_section(HEADING, &section, None)?;
        eprintln!("wrote the Gateway section of docs/BENCHMARKS.md");
    }
    Ok(())
}

struct Row {
    clients: usize,
    gateway: Vec<Run>,
    /// CPU microseconds per PUT of this process (gateway and load generator).
    cpu_us: Vec<f64>,
    /// pgbench running [`MINIMAL_SQL`].
    minimal: Vec<Run>,
    /// pgbench running the gateway's own statement.
    own: Vec<Run>,
}

/// A load of fenced PUTs on the gateway at `addr`, as the bench's client.
fn load(addr: SocketAddr, clients: usize, pages: Pages, json: &Arc<str>) -> Load {
    Load {
        targets: vec![addr],
        clients,
        pages,
        headers: Headers {
            client_id: Some("bench".into()),
            ..Headers::default()
        },
        json: json.clone(),
        counted: Counted::Nothing,
    }
}

/// `clients` keep-alive connections, each PUTting random pages back to back
/// for `secs`; the CPU microseconds per PUT of this process (the gateway and
/// the load generator) beside the run.
async fn gateway_run(
    addr: SocketAddr,
    clients: usize,
    secs: Duration,
    pages: u64,
    token: u64,
    json: &Arc<str>,
) -> anyhow::Result<(Run, f64)> {
    let cpu_start = cpu_of(std::process::id(), Children::No);
    let run = load(addr, clients, Pages::Random { n: pages, token }, json)
        .run(secs)
        .await?
        .run;
    let cpu = cpu_of(std::process::id(), Children::No) - cpu_start;
    let cpu_us = cpu * 1e6 / run.ops.max(1) as f64;
    Ok((run, cpu_us))
}

/// pgbench doing `puts`, with its per-transaction log (under `dir`): each
/// transaction's latency, and the rate over the span the transactions ran.
async fn pgbench_run(puts: &FencedPuts<'_>, dir: &Path) -> anyhow::Result<Run> {
    let log_dir = tempfile::tempdir_in(dir)?;
    let prefix = log_dir.path().join("tx");
    let out = puts
        .command()
        .arg("-l")
        .arg(format!("--log-prefix={}", prefix.display()))
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
    let failed = stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of failed transactions: "))
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or("0");
    if failed != "0" {
        bail!("pgbench had failed transactions: {stdout}");
    }
    // Per-transaction log lines: client_id transaction_no latency_us script_no epoch epoch_us
    let mut latencies = Vec::new();
    let mut first = u64::MAX;
    let mut last = 0_u64;
    for entry in std::fs::read_dir(log_dir.path())? {
        let text = std::fs::read_to_string(entry?.path())?;
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 {
                continue;
            }
            let latency_us: u64 = f[2].parse()?;
            let end_us = f[4].parse::<u64>()? * 1_000_000 + f[5].parse::<u64>()?;
            first = first.min(end_us.saturating_sub(latency_us));
            last = last.max(end_us);
            latencies.push(Duration::from_micros(latency_us));
        }
    }
    if latencies.is_empty() {
        bail!("pgbench logged no transactions: {stdout}");
    }
    // Throughput over the span the transactions actually ran (pgbench's own
    // tps line excludes connection time the same way).
    Ok(Run {
        ops: latencies.len() as u64,
        elapsed: Duration::from_micros(last - first),
        latencies,
    })
}

fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| connections | gateway PUT/s (median, min..max) | gateway p50 / p99 ms | limit: pgbench minimal statement tx/s (median, min..max) | limit p50 / p99 ms | pgbench gateway's statement tx/s | gateway / limit | p99 gateway / limit | bench process CPU µs per PUT |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let g: Vec<f64> = row.gateway.iter().map(Run::per_sec).collect();
        let m: Vec<f64> = row.minimal.iter().map(Run::per_sec).collect();
        let o: Vec<f64> = row.own.iter().map(Run::per_sec).collect();
        let (g_min, g_max) = spread(&g);
        let (m_min, m_max) = spread(&m);
        let q = |runs: &[Run], f: fn(&Run) -> Duration| {
            let v: Vec<f64> = runs.iter().map(|r| f(r).as_secs_f64()).collect();
            median(&v)
        };
        let secs = |s: f64| ms(Duration::from_secs_f64(s));
        let ratio = median(&g) / median(&m);
        let p99_ratio = q(&row.gateway, Run::p99) / q(&row.minimal, Run::p99);
        t.push_str(&format!(
            "| {} | {:.0} ({:.0}..{:.0}) | {} / {} | {:.0} ({:.0}..{:.0}) | {} / {} | {:.0} | {:.2}× {} | {:.2}× {} | {:.0} |\n",
            row.clients,
            median(&g),
            g_min,
            g_max,
            secs(q(&row.gateway, Run::p50)),
            secs(q(&row.gateway, Run::p99)),
            median(&m),
            m_min,
            m_max,
            secs(q(&row.minimal, Run::p50)),
            secs(q(&row.minimal, Run::p99)),
            median(&o),
            ratio,
            if ratio >= MIN_THROUGHPUT_RATIO { "(met)" } else { "(NOT met)" },
            p99_ratio,
            if p99_ratio <= MAX_P99_RATIO { "(met)" } else { "(NOT met)" },
            median(&row.cpu_us),
        ));
    }
    t
}

fn section_text(args: &Args, table: &str) -> String {
    let date = machine::utc_now();
    let clients: Vec<String> = args.clients.iter().map(usize::to_string).collect();
    format!(
        "Command: `cargo run --release -p bench -- gateway` \
         (here: `--secs {} --repeats {} --clients {} --pages {} --pool {}`)\n\n\
         Machine: {} CPUs (`nproc`), {}. Date: {date}. PostgreSQL 15 from Debian, private server started by the \
         bench (`fsync=off`), the gateway in the bench's process with a pool of {} PostgreSQL connections \
         (its default) behind the HTTP connections, and pgbench (one PostgreSQL connection per \
         client) and the HTTP load generator on the same machine: everything shares the same cores.\n\n\
         Each request is an accepted fenced write of a random page out of {} (100-byte body, \
         one token per run, equal tokens accepted). The limit is pgbench running the minimal \
         statement that does the same job (a conditional fenced update of the page and one \
         history row, with the same history index; `MINIMAL_SQL` in `bench/src/gateway.rs`); \
         the third column is pgbench running the gateway's own statement for this case \
         (`gateway/src/sql/fenced_access.sql`, If-Match NULL as in the gateway's requests). \
         pgbench uses `-M prepared` and one connection per client; every run of the three \
         alternates with the others at each client count. Figures are medians of {} runs of {} s; \
         p50/p99 are medians of the runs' own. Targets: gateway / limit >= {MIN_THROUGHPUT_RATIO} \
         at 8 and 32 connections, p99 gateway / limit <= {MAX_P99_RATIO} at 32. The last column is \
         the CPU time of the bench's process (the gateway and the HTTP load generator) per PUT, \
         from `/proc/self/stat`: less sensitive to the other sessions' load than throughput. \
         The gateway logs as its binary does (`gateway=info,tower_http=info`), into a sink.\n\n\
         Load average (`/proc/loadavg`) at the end of the run: {}.\n\n\
         {table}",
        args.runs.secs,
        args.runs.repeats,
        clients.join(","),
        args.pages,
        args.pool,
        machine::cpus(),
        machine::cpu_model(),
        args.pool,
        args.pages,
        args.runs.repeats,
        args.runs.secs,
        machine::load_average(),
    )
}

const HEADING: &str = "## Gateway: fenced PUT vs pgbench running the same job";
