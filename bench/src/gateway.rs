//! `cargo run --release -p bench -- gateway`: fenced PUTs through the gateway
//! beside two pgbench limits against the same database, at the same client
//! counts, in the same run, alternating (issue 18):
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
//! own tokio tasks) and is driven by keep-alive HTTP/1.1 connections.
//!
//! Targets (issue 18): gateway PUT/s >= 0.8x the limit at 8 and 32
//! connections, and gateway p99 <= 2x the limit's p99 at 32.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gateway::FenceCheck;

use crate::stats::{median, ms, spread, Run};

#[derive(clap::Args)]
pub struct Args {
    /// Seconds per measured run.
    #[arg(long, default_value_t = 5)]
    secs: u64,
    /// Runs per system and client count (figures are medians).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
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

/// Targets of issue 18.
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
    let base = gw.url();
    let body = "x".repeat(BODY_LEN);
    let dir = tempfile::tempdir()?;
    let own = write_pgbench_script(dir.path(), "own.sql", &pgbench_sql(), args.pages)?;
    let minimal = write_pgbench_script(dir.path(), "minimal.sql", MINIMAL_SQL, args.pages)?;
    let mut token = 1_u64;

    eprintln!("seeding {} pages", args.pages);
    let client = http_client(32)?;
    for id in 1..=args.pages {
        put(&client, &base, id, token, &body).await?;
    }

    eprintln!("warming up");
    gateway_run(
        gw.addr(),
        8,
        Duration::from_secs(1),
        args.pages,
        token,
        &body,
    )
    .await?;
    for script in [&minimal, &own] {
        pgbench_run(&pg_args(&pg, &db), script, dir.path(), 8, 1, token, &body).await?;
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
    for r in 0..args.repeats {
        for row in rows.iter_mut() {
            token += 1;
            let secs = Duration::from_secs(args.secs);
            let (g, cpu_us) =
                gateway_run(gw.addr(), row.clients, secs, args.pages, token, &body).await?;
            if args.gateway_only {
                eprintln!(
                    "run {}/{} c={:>2}: gateway {:>7.0}/s p50 {} p99 {} cpu {:.0} us/PUT  ({})",
                    r + 1,
                    args.repeats,
                    row.clients,
                    g.per_sec(),
                    ms(g.p50()),
                    ms(g.p99()),
                    cpu_us,
                    load_average(),
                );
                continue;
            }
            let conn = pg_args(&pg, &db);
            let m = pgbench_run(
                &conn,
                &minimal,
                dir.path(),
                row.clients,
                args.secs,
                token,
                &body,
            )
            .await?;
            let o = pgbench_run(
                &conn,
                &own,
                dir.path(),
                row.clients,
                args.secs,
                token,
                &body,
            )
            .await?;
            eprintln!(
                "run {}/{} c={:>2}: gateway {:>7.0}/s p99 {} cpu {:.0} us/PUT  minimal {:>7.0}/s p99 {}  own statement {:>7.0}/s  ({})",
                r + 1,
                args.repeats,
                row.clients,
                g.per_sec(),
                ms(g.p99()),
                cpu_us,
                m.per_sec(),
                ms(m.p99()),
                o.per_sec(),
                load_average(),
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
        let section = section_text(&args, &table)?;
        write_section(&section)?;
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

/// `/proc/loadavg`'s first three fields, to say how loaded the machine was.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| {
            let f: Vec<&str> = s.split_whitespace().take(3).collect();
            format!("load {}", f.join(" "))
        })
        .unwrap_or_default()
}

fn pg_args(pg: &harness::Postgres, db: &str) -> Vec<String> {
    vec![
        "-h".into(),
        "127.0.0.1".into(),
        "-p".into(),
        pg.port().to_string(),
        "-U".into(),
        "postgres".into(),
        "-d".into(),
        db.into(),
    ]
}

fn http_client(connections: usize) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()?)
}

async fn put(
    client: &reqwest::Client,
    base: &str,
    id: u64,
    token: u64,
    body: &str,
) -> anyhow::Result<()> {
    let resp = client
        .put(format!("{base}/pages/{id}"))
        .header("Fencing-Token", token)
        .header("Client-Id", "bench")
        .json(&serde_json::json!({ "body": body }))
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!(
            "PUT /pages/{id}: {} {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        );
    }
    Ok(())
}

/// `clients` keep-alive connections, each PUTting random pages back to back
/// for `secs`. The load generator is a minimal HTTP/1.1 client on raw TCP
/// (requests pre-formatted, responses parsed by Content-Length), so that, like
/// pgbench's C client, it takes as little of the shared CPU as possible.
async fn gateway_run(
    addr: std::net::SocketAddr,
    clients: usize,
    secs: Duration,
    pages: u64,
    token: u64,
    body: &str,
) -> anyhow::Result<(Run, f64)> {
    let start = Instant::now();
    let cpu_start = process_cpu();
    let deadline = start + secs;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let json = serde_json::json!({ "body": body }).to_string();
        tasks.push(tokio::spawn(async move {
            let mut conn = HttpConn::connect(addr).await?;
            let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ (c as u64 + 1));
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let id = rng.next() % pages + 1;
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
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    let cpu = process_cpu().saturating_sub(cpu_start);
    let run = Run {
        ops: latencies.len() as u64,
        elapsed: start.elapsed(),
        latencies,
    };
    let cpu_us = cpu.as_secs_f64() * 1e6 / run.ops.max(1) as f64;
    Ok((run, cpu_us))
}

/// CPU time this process (the gateway and the load generator) has used so
/// far, from `/proc/self/stat` (utime + stime, in clock ticks of 10 ms).
fn process_cpu() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may contain spaces).
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// One keep-alive HTTP/1.1 connection that only sends our PUT.
struct HttpConn {
    stream: tokio::io::BufReader<tokio::net::TcpStream>,
    request: Vec<u8>,
    line: String,
}

impl HttpConn {
    async fn connect(addr: std::net::SocketAddr) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: tokio::io::BufReader::new(stream),
            request: Vec::with_capacity(512),
            line: String::new(),
        })
    }

    async fn put(&mut self, id: u64, token: u64, json: &str) -> anyhow::Result<u16> {
        use std::io::Write;
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        self.request.clear();
        write!(
            self.request,
            "PUT /pages/{id} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n\
             fencing-token: {token}\r\nclient-id: bench\r\ncontent-length: {}\r\n\r\n{json}",
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

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The gateway's statement with pgbench variables for its parameters.
/// `$6` (If-Match) is NULL on both sides; comment lines are dropped because
/// pgbench would substitute `:names` inside them too.
fn pgbench_sql() -> String {
    let mut sql: String = gateway::store::FENCED_ACCESS
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    // pgbench makes every occurrence of a variable its own parameter, so each
    // one gets the type the gateway's (single, typed) parameter has.
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

fn write_pgbench_script(dir: &Path, name: &str, sql: &str, pages: u64) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, format!("\\set id random(1, {pages})\n{sql};\n"))?;
    Ok(path)
}

async fn pgbench_run(
    conn: &[String],
    script: &Path,
    dir: &Path,
    clients: usize,
    secs: u64,
    token: u64,
    body: &str,
) -> anyhow::Result<Run> {
    let log_dir = tempfile::tempdir_in(dir)?;
    let prefix = log_dir.path().join("tx");
    let out = tokio::process::Command::new(harness::postgres::pgbench())
        .args(conn)
        .args(["-n", "-M", "prepared", "-l"])
        .arg(format!("--log-prefix={}", prefix.display()))
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args(["-T", &secs.to_string()])
        .args([
            "-D",
            "method=PUT",
            "-D",
            &format!("body={body}"),
            "-D",
            &format!("tok={token}"),
        ])
        .args([
            "-D",
            "issuer=default",
            "-D",
            "enforce=true",
            "-D",
            "client=pgbench",
        ])
        .arg("-f")
        .arg(script)
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

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} CPUs (`nproc`), {model}")
}

fn section_text(args: &Args, table: &str) -> anyhow::Result<String> {
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let clients: Vec<String> = args.clients.iter().map(usize::to_string).collect();
    Ok(format!(
        "Command: `cargo run --release -p bench -- gateway` \
         (here: `--secs {} --repeats {} --clients {} --pages {} --pool {}`)\n\n\
         Machine: {}. Date: {date}. PostgreSQL 15 from Debian, private server started by the \
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
         p50/p99 are medians of the runs' own. Targets (issue 18): gateway / limit >= {MIN_THROUGHPUT_RATIO} \
         at 8 and 32 connections, p99 gateway / limit <= {MAX_P99_RATIO} at 32. The last column is \
         the CPU time of the bench's process (the gateway and the HTTP load generator) per PUT, \
         from `/proc/self/stat`: less sensitive to the other sessions' load than throughput. \
         The gateway logs as its binary does (`gateway=info,tower_http=info`), into a sink.\n\n\
         Load average (`/proc/loadavg`) at the end of the run: {}.\n\n\
         {table}",
        args.secs,
        args.repeats,
        clients.join(","),
        args.pages,
        args.pool,
        machine(),
        args.pool,
        args.pages,
        args.repeats,
        args.secs,
        load_average(),
    ))
}

const HEADING: &str = "## Gateway: fenced PUT vs pgbench running the same job";

/// Replace the body of the Gateway section, leaving the other sections alone.
fn write_section(body: &str) -> anyhow::Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/BENCHMARKS.md");
    let text = std::fs::read_to_string(&path)?;
    let start = text
        .find(HEADING)
        .context("Gateway heading in docs/BENCHMARKS.md")?
        + HEADING.len();
    let end = text[start..]
        .find("\n## ")
        .map_or(text.len(), |i| start + i + 1);
    // Keep any hand-written notes after the generated part (marked by a line
    // starting with "Notes:").
    let old = &text[start..end];
    let notes = old
        .find("\nNotes:")
        .map(|i| old[i..].trim_end().to_owned() + "\n")
        .unwrap_or_default();
    let new = format!(
        "{}{HEADING}\n\n{}\n{notes}\n{}",
        &text[..start - HEADING.len()],
        body.trim_end(),
        &text[end..]
    );
    std::fs::write(&path, new)?;
    Ok(())
}
