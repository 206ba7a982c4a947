//! The outside tools the benchmarks run beside the project's code (the limits
//! redis-benchmark, pgbench and mariadb-slap; the Python venv peers), and the
//! loops that run them: one place, shared by the per-backend subcommands and
//! `compare` (which only adds its record of the commands).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use fencelock::lease_table::{mysql, postgres, DEFAULT_TABLE};
use fencelock::redis::{GRANT_SCRIPT, RELEASE_SCRIPT};
use tokio::process::Command;
use tokio::time::Instant;

use crate::stats::Run;

/// Run `cmd` (killed if the caller gives up); its stdout, or an error with
/// its stdout and stderr.
pub(crate) async fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("spawn {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// SQL on one line (for tools that take a query as an argument or line).
pub(crate) fn one_line(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A statement on one line, without its `--` comments (joined onto one line,
/// a comment would swallow the rest of the statement, and a `;` in it would
/// split the statement for mariadb-slap). The lease statements have no `--`
/// inside their string literals.
pub(crate) fn sql_line(sql: &str) -> String {
    let code: Vec<&str> = sql
        .lines()
        .map(|line| line.find("--").map_or(line, |at| &line[..at]))
        .collect();
    one_line(&code.join("\n"))
}

/// `redis-cli SCRIPT LOAD script`: prints the script's sha1.
pub(crate) fn script_load_cmd(port: u16, script: &str) -> Command {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-p", &port.to_string(), "SCRIPT", "LOAD", script]);
    cmd
}

/// Requests for a redis-benchmark run of about `secs / 2` at the rate of a
/// 2,000-request probe (and never fewer than 2,000).
pub(crate) fn redis_benchmark_n(probe_rate: f64, secs: Duration) -> u64 {
    ((probe_rate * secs.as_secs_f64() / 2.0) as u64).max(2_000)
}

/// redis-benchmark, one client, `n` requests of `EVALSHA sha` on random lock
/// names (so every grant takes a free lock: SET and INCR), CSV output.
pub(crate) fn redis_benchmark_cmd(port: u16, sha: &str, n: u64) -> Command {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args([
        "-p",
        &port.to_string(),
        "-c",
        "1",
        "-n",
        &n.to_string(),
        "-r",
        "100000000",
        "--csv",
        "EVALSHA",
        sha,
        "2",
        "lock:{bench-__rand_int__}",
        "fence:{bench-__rand_int__}",
        "bench-owner",
        "10000",
    ]);
    cmd
}

/// (requests/s, p50, p99) from the CSV output of one redis-benchmark run.
pub(crate) fn parse_redis_benchmark(out: &str) -> anyhow::Result<(f64, Duration, Duration)> {
    let line = out
        .lines()
        .nth(1)
        .context("redis-benchmark printed no result")?;
    let fields: Vec<&str> = line.split("\",\"").map(|f| f.trim_matches('"')).collect();
    let num = |i: usize| -> anyhow::Result<f64> {
        fields
            .get(i)
            .context("short redis-benchmark line")?
            .parse::<f64>()
            .with_context(|| format!("redis-benchmark field {i} in {line}"))
    };
    Ok((
        num(1)?,
        Duration::from_secs_f64(num(4)? / 1000.0),
        Duration::from_secs_f64(num(6)? / 1000.0),
    ))
}

/// The pgbench script: the lease grant (`\gset` keeps its token), then the
/// release with `:token`: the calls of an uncontended acquire and release of
/// the fair lock (the light ones, see `fencelock::lease_table`), as the
/// library sends them.
pub(crate) fn pgbench_script() -> String {
    let sql = postgres::Statements::for_table(DEFAULT_TABLE);
    let grant = sql
        .acquire_fair_light
        .replace("$1", "'pgbench'")
        .replace("$2", "'pgbench-holder'")
        .replace("$3", "10.0")
        .replace("$4", "0.0")
        .replace("$5", "'pgbench-client'");
    let release = sql
        .release_light
        .replace("$1", "'pgbench'")
        .replace("$2", "'pgbench-holder'")
        .replace("$3", ":token");
    format!(
        "{} as token \\gset\n{};\n",
        sql_line(&grant),
        sql_line(&release)
    )
}

/// pgbench -M prepared, one client, for `t` seconds, running `script_path`
/// against `url` (`postgres://postgres@127.0.0.1:PORT/DB`), logging each
/// transaction to `dir/pgb*`.
pub(crate) fn pgbench_cmd(
    dir: &Path,
    script_path: &Path,
    url: &str,
    t: &str,
) -> anyhow::Result<Command> {
    let (host_port, db) = url
        .trim_start_matches("postgres://postgres@")
        .split_once('/')
        .context("postgres url")?;
    let (host, port) = host_port.split_once(':').context("postgres url port")?;
    let mut cmd = Command::new(harness::postgres::pgbench());
    cmd.current_dir(dir)
        .args(["-n", "-M", "prepared", "-c", "1", "-T", t])
        .args([
            "-h",
            host,
            "-p",
            port,
            "-U",
            "postgres",
            "-l",
            "--log-prefix",
        ])
        .arg(dir.join("pgb"))
        .arg("-f")
        .arg(script_path)
        .arg(db);
    Ok(cmd)
}

/// The per-transaction latencies of the pgbench logs `dir/pgb*`.
pub(crate) fn pgbench_latencies(dir: &Path) -> anyhow::Result<Vec<Duration>> {
    let mut latencies = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|f| f.to_string_lossy().starts_with("pgb"))
        {
            for line in std::fs::read_to_string(&path)?.lines() {
                // client_id transaction_no time_us script_no time_epoch time_us
                if let Some(us) = line.split_whitespace().nth(2) {
                    latencies.push(Duration::from_micros(us.parse()?));
                }
            }
        }
    }
    Ok(latencies)
}

/// The mariadb-slap query: the lease grant then release calls on the
/// existing row `limit`; the grant keeps its token in a user variable of
/// the connection, which the release reads.
pub(crate) fn mariadb_slap_query() -> String {
    let sql = mysql::Statements::for_table(DEFAULT_TABLE);
    // Binds as `LeaseTable` sends them: holder, client, TTL in µs, name,
    // lock-delay in µs.
    let grant = sql
        .acquire_fair_light
        .replacen("select ", "select @token := ", 1)
        .replacen('?', "'slap-holder'", 1)
        .replacen('?', "'slap-client'", 1)
        .replacen('?', "10000000", 1)
        .replacen('?', "'limit'", 1)
        .replacen('?', "0", 1);
    let release = sql
        .release
        .replacen('?', "'limit'", 1)
        .replacen('?', "'slap-holder'", 1)
        .replacen('?', "@token", 1);
    format!("{};{}", sql_line(&grant), sql_line(&release))
}

/// mariadb-slap, one client, `pairs` runs of `query` against database `db`.
pub(crate) fn mariadb_slap_cmd(port: u16, db: &str, pairs: u64, query: &str) -> Command {
    let mut cmd = Command::new("mariadb-slap");
    cmd.args([
        "--host=127.0.0.1",
        &format!("--port={port}"),
        "--user=root",
        &format!("--create-schema={db}"),
        "--concurrency=1",
        "--iterations=1",
        &format!("--number-of-queries={}", pairs * 2),
        "--delimiter=;",
        &format!("--query={query}"),
    ]);
    cmd
}

/// Pairs per second from the output of a mariadb-slap run of `pairs` pairs.
pub(crate) fn parse_mariadb_slap(out: &str, pairs: u64) -> anyhow::Result<f64> {
    let secs: f64 = out
        .lines()
        .find(|l| l.contains("Average number of seconds"))
        .and_then(|l| l.split_whitespace().find_map(|w| w.parse().ok()))
        .with_context(|| format!("mariadb-slap output: {out}"))?;
    Ok(pairs as f64 / secs)
}

/// The run a Python peer printed: `{"elapsed": s, "lat": [s, ...]}`.
pub(crate) fn parse_python_peer(out: &str, what: &'static str) -> anyhow::Result<Run> {
    #[derive(serde::Deserialize)]
    struct Out {
        elapsed: f64,
        lat: Vec<f64>,
    }
    let o: Out = serde_json::from_str(out.trim()).context(what)?;
    Ok(Run {
        ops: o.lat.len() as u64,
        elapsed: Duration::from_secs_f64(o.elapsed),
        latencies: o.lat.into_iter().map(Duration::from_secs_f64).collect(),
    })
}

/// A venv `target/NAME` with the pinned `packages` (which provide `modules`,
/// e.g. `"redis, kazoo"`), created on first use; its python. The venv code
/// lives in the harness crate (`harness::python`), shared with the OpenAPI
/// fuzz's schemathesis.
pub(crate) async fn python_venv(
    name: &str,
    modules: &str,
    packages: &[&str],
) -> anyhow::Result<PathBuf> {
    harness::python::venv(name, &format!("import {modules}"), packages).await
}

/// The limit for the Redis lock: redis-benchmark, one client, `EVALSHA` of the
/// grant script then (separately) of the release script, each for `secs / 2`
/// worth of requests on random lock names (so every grant takes a free lock).
/// The pair's rate is `1 / (1/grant + 1/release)`; its p50 and p99 are the
/// sums of the two halves'.
pub(crate) async fn redis_benchmark_pair(
    port: u16,
    secs: Duration,
) -> anyhow::Result<(f64, Duration, Duration)> {
    let mut halves = Vec::new();
    for script in [GRANT_SCRIPT, RELEASE_SCRIPT] {
        let sha = output(&mut script_load_cmd(port, script))
            .await?
            .trim()
            .to_string();
        // Probe the rate, then size -n so that the run lasts about secs / 2.
        let probe = redis_benchmark_once(port, &sha, 2_000).await?;
        let n = redis_benchmark_n(probe.0, secs);
        halves.push(redis_benchmark_once(port, &sha, n).await?);
    }
    let (grant, release) = (halves[0], halves[1]);
    Ok((
        1.0 / (1.0 / grant.0 + 1.0 / release.0),
        grant.1 + release.1,
        grant.2 + release.2,
    ))
}

/// The command line [`redis_benchmark_pair`] runs, for the reports.
pub(crate) const REDIS_BENCHMARK_COMMAND: &str =
    "redis-benchmark -p PORT -c 1 -n N -r 100000000 --csv EVALSHA <sha1 of GRANT_SCRIPT, then of \
     RELEASE_SCRIPT> 2 lock:{bench-__rand_int__} fence:{bench-__rand_int__} ... \
     (N sized from a 2,000-request probe to last half the time each)";

/// (requests/s, p50, p99) of one redis-benchmark run of `n` requests.
async fn redis_benchmark_once(
    port: u16,
    sha: &str,
    n: u64,
) -> anyhow::Result<(f64, Duration, Duration)> {
    let out = output(&mut redis_benchmark_cmd(port, sha, n)).await?;
    parse_redis_benchmark(&out)
}

/// The limit for the PostgreSQL lease table: pgbench, one client, the lease
/// grant then release SQL (prepared) for `secs` (at least one second), with
/// per-transaction latencies from its log.
pub(crate) async fn pgbench_lease(url: &str, secs: Duration) -> anyhow::Result<Run> {
    let dir = tempfile::tempdir()?;
    let script_path = dir.path().join("lock.sql");
    std::fs::write(&script_path, pgbench_script())?;
    let secs = secs.max(Duration::from_secs(1));
    let t = secs.as_secs().to_string();
    let mut cmd = pgbench_cmd(dir.path(), &script_path, url, &t)?;
    let start = Instant::now();
    output(&mut cmd).await?;
    let elapsed = start.elapsed().min(secs);
    let latencies = pgbench_latencies(dir.path())?;
    if latencies.is_empty() {
        bail!("pgbench logged no transactions");
    }
    Ok(Run {
        ops: latencies.len() as u64,
        elapsed,
        latencies,
    })
}

/// The command line [`pgbench_lease`] runs, for the reports.
pub(crate) const PGBENCH_COMMAND: &str =
    "pgbench -n -M prepared -c 1 -T SECS -h 127.0.0.1 -p PORT -U postgres -l -f lock.sql DB \
     (lock.sql: the lease grant \\gset, then the release with :token)";

/// The limit for the MariaDB lease table: mariadb-slap, one client, the lease
/// grant then release SQL on the existing row `limit`, sized from a 500-pair
/// probe to last `secs`. Pairs per second (it reports no latencies).
pub(crate) async fn mariadb_slap_pairs(
    port: u16,
    url: &str,
    secs: Duration,
) -> anyhow::Result<f64> {
    let db = url.rsplit('/').next().context("mysql url")?;
    let query = mariadb_slap_query();
    let slap = |pairs: u64| {
        let query = query.clone();
        async move {
            let out = output(&mut mariadb_slap_cmd(port, db, pairs, &query)).await?;
            parse_mariadb_slap(&out, pairs)
        }
    };
    let probe = slap(500).await?;
    slap(((probe * secs.as_secs_f64()) as u64).max(500)).await
}

/// The command line [`mariadb_slap_pairs`] runs, for the reports.
pub(crate) const MARIADB_SLAP_COMMAND: &str =
    "mariadb-slap --host=127.0.0.1 --port=PORT --user=root --create-schema=DB --concurrency=1 \
     --iterations=1 --number-of-queries=2N --delimiter=';' --query='<lease grant>;<release>' \
     (N sized from a 500-pair probe)";

/// Run a Python peer script (`python -c script args...`) that prints
/// `{"elapsed": s, "lat": [s, ...]}`.
pub(crate) async fn python_peer(
    python: &Path,
    script: &str,
    args: &[String],
) -> anyhow::Result<Run> {
    let out = output(Command::new(python).arg("-c").arg(script).args(args)).await?;
    parse_python_peer(&out, "python peer output")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_sql_keeps_every_statement_whole_without_comments() {
        let slap = mariadb_slap_query();
        assert!(!slap.contains("--"), "{slap}");
        assert!(!slap.contains('?'), "every parameter bound: {slap}");
        let (grant, release) = slap.split_once(';').expect("two statements");
        assert!(
            grant.ends_with("('slap-holder', 'slap-client', 10000000, 'limit', 0)"),
            "{grant}"
        );
        assert!(
            release.ends_with("('limit', 'slap-holder', @token)"),
            "{release}"
        );
        assert_eq!(slap.matches(';').count(), 1, "two statements: {slap}");
        let pgbench = pgbench_script();
        assert!(!pgbench.contains("--"), "{pgbench}");
        assert_eq!(pgbench.lines().count(), 2, "{pgbench}");
    }

    #[test]
    fn a_comment_ends_at_its_line() {
        assert_eq!(sql_line("select 1, -- one\n  2 -- two\n"), "select 1, 2");
    }
}
