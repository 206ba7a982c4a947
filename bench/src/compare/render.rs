//! The comparison as tables (terminal and `COMPARISON.md`) and as an SVG chart.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use super::{BackendReport, Cell, ChaosResult, ChaosRow, HotCell, Report};
use crate::stats::ms;

/// The machine the figures come from.
#[derive(Debug, Clone)]
pub struct Machine {
    pub nproc: usize,
    pub cpu: String,
    pub memory: String,
    pub os: String,
    /// The services' versions as their binaries report them.
    pub services: Vec<String>,
}

impl Machine {
    pub fn probe() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let memory = read("/proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0))
            .unwrap_or_else(|| "unknown".into());
        let pretty = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_else(|| "unknown OS".into());
        let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
        Machine {
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu,
            memory,
            os: format!("{pretty}, Linux {kernel}"),
            services: service_versions(),
        }
    }
}

/// First line of `program args`, or nothing when it cannot run.
fn version_of(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next()?.trim();
    (!line.is_empty()).then(|| line.to_string())
}

fn service_versions() -> Vec<String> {
    let mut v = vec![];
    if let Some(l) = version_of("redis-server", &["--version"]) {
        // "Redis server v=7.0.15 sha=..."
        let ver = l.split_whitespace().find_map(|w| w.strip_prefix("v="));
        v.push(format!("redis-server {}", ver.unwrap_or(&l)));
    }
    if let Some(l) = version_of(
        &harness::postgres::pgbench()
            .with_file_name("postgres")
            .to_string_lossy(),
        &["--version"],
    ) {
        v.push(l);
    }
    if let Some(l) = version_of("mariadbd", &["--version"]) {
        v.push(
            l.split(" for ")
                .next()
                .unwrap_or(&l)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    let zk = std::fs::read_dir("/usr/share/java")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find_map(|f| {
            f.strip_prefix("zookeeper-")?
                .strip_suffix(".jar")
                .filter(|ver| ver.starts_with(|c: char| c.is_ascii_digit()))
                .map(|ver| format!("ZooKeeper {ver}, standalone and a 3-node ensemble"))
        });
    v.extend(zk);
    v
}

/// Now, UTC, to the minute (civil date from the Unix day count).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

pub fn label(backend: chaos::Backend) -> &'static str {
    match backend {
        chaos::Backend::Redis => "Redis",
        chaos::Backend::Redlock => "Redlock N=5",
        chaos::Backend::Zookeeper => "ZooKeeper",
        chaos::Backend::LeasePostgres => "lease table, PostgreSQL",
        chaos::Backend::LeaseMysql => "lease table, MariaDB",
        chaos::Backend::RedisSentinel => "Redis + Sentinel (1 replica)",
    }
}

/// The name of a report's row: the backend's label, and for ZooKeeper which
/// deployment was measured (standalone, or the three-node ensemble).
pub fn row_label(r: &BackendReport) -> String {
    match (r.backend, r.ensemble) {
        (_, true) => format!("{} (3-node ensemble)", label(r.backend)),
        (chaos::Backend::Zookeeper, false) => format!("{} (standalone)", label(r.backend)),
        _ => label(r.backend).to_string(),
    }
}

/// Reasons for "not measured", numbered once each, listed under a table.
#[derive(Default)]
struct Footnotes(Vec<String>);

impl Footnotes {
    fn mark(&mut self, reason: &str) -> String {
        let i = match self.0.iter().position(|r| r == reason) {
            Some(i) => i,
            None => {
                self.0.push(reason.to_string());
                self.0.len() - 1
            }
        };
        format!("not measured [{}]", i + 1)
    }

    fn render(&self, out: &mut String) {
        if self.0.is_empty() {
            return;
        }
        out.push('\n');
        for (i, r) in self.0.iter().enumerate() {
            let _ = writeln!(out, "[{}] not measured: {r}  ", i + 1);
        }
    }
}

fn num(rate: f64) -> String {
    if rate >= 100.0 {
        format!("{rate:.0}")
    } else {
        format!("{rate:.1}")
    }
}

/// "median (min–max)" of a cell's rates, or its not-measured mark.
fn rate_cell(cell: &Cell, notes: &mut Footnotes) -> String {
    match cell {
        Cell::NotMeasured(r) => notes.mark(r),
        Cell::Measured(v) if v.is_empty() => notes.mark("no run"),
        Cell::Measured(v) => {
            let rate = cell.rate().unwrap_or(0.0);
            let (lo, hi) = cell.spread().unwrap_or((rate, rate));
            if v.len() == 1 {
                num(rate)
            } else {
                format!("{} ({}–{})", num(rate), num(lo), num(hi))
            }
        }
    }
}

fn lat_cell(cell: &Cell, pick: fn(&super::Figure) -> Option<Duration>) -> String {
    match cell {
        Cell::Measured(_) => cell.latency(pick).map(ms).unwrap_or_else(|| "—".into()),
        Cell::NotMeasured(_) => "—".into(),
    }
}

/// One line per backend as it finishes (above the progress bar).
pub fn backend_line(r: &BackendReport) -> String {
    let show = |c: &Cell| match (c, c.rate()) {
        (_, Some(rate)) => num(rate),
        (Cell::NotMeasured(reason), None) => format!("not measured ({reason})"),
        _ => "—".into(),
    };
    let mut line = format!(
        "{}: uncontended {}/s, contended {}/s, end to end {} edits/s, limit {}/s",
        row_label(r),
        show(&r.uncontended),
        show(&r.contended),
        show(&r.e2e),
        show(&r.limit.1)
    );
    if let Some(hot) = &r.hot {
        for (variant, cell) in [("fair", &hot.fair), ("non-fair", &hot.non_fair)] {
            let _ = match (cell, cell.medians()) {
                (_, Some(h)) => write!(
                    line,
                    "; hot page {variant}: {} alone, {} by 3 ({:.2}×; taking turns in-process \
                     {:.2}×), smallest share {:.0} %",
                    num(h.alone),
                    num(h.together),
                    h.ratio(),
                    h.turns_ratio(),
                    h.min_share() * 100.0
                ),
                (HotCell::NotMeasured(why), None) => {
                    write!(line, "; hot page {variant}: not measured ({why})")
                }
                _ => Ok(()),
            };
        }
    }
    line
}

/// Uncontended acquire+release of the fair and the non-fair variant, side
/// by side (the issue: fair must not cost more than 10 %).
fn fairness_table(report: &Report, out: &mut String) {
    let mut notes = Footnotes::default();
    let _ = writeln!(
        out,
        "| backend | fair: acquire+release/s | p50 ms | non-fair: acquire+release/s | p50 ms | fair ÷ non-fair |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
    for b in &report.backends {
        let Some(non_fair) = &b.uncontended_non_fair else {
            continue;
        };
        let ratio = match (b.uncontended.rate(), non_fair.rate()) {
            (Some(f), Some(n)) if n > 0.0 => format!("{:.2}×", f / n),
            _ => "—".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {ratio} |",
            row_label(b),
            rate_cell(&b.uncontended, &mut notes),
            lat_cell(&b.uncontended, |f| f.p50),
            rate_cell(non_fair, &mut notes),
            lat_cell(non_fair, |f| f.p50),
        );
    }
    notes.render(out);
}

/// The hot page: per backend and variant, one worker alone and three together.
fn hot_table(report: &Report, out: &mut String) {
    let mut notes = Footnotes::default();
    let _ = writeln!(
        out,
        "| backend | lock | 1 worker: edits/s | {w} workers: edits/s | {w} ÷ 1 | ceiling: {w} taking turns in-process ÷ 1 | shares of the {w} | smallest share | hand-over p50 ms | p99 ms | extra lock round trips/s per worker | targets (≥ 0.8×, every share ≥ 20 %) |",
        w = super::hot::WORKERS
    );
    let _ = writeln!(
        out,
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"
    );
    let mut failures = vec![];
    for b in &report.backends {
        let Some(hot) = &b.hot else { continue };
        for (variant, cell) in [("fair", &hot.fair), ("non-fair", &hot.non_fair)] {
            match (cell, cell.medians()) {
                (_, Some(h)) => {
                    let shares: Vec<String> = h
                        .shares
                        .iter()
                        .map(|s| format!("{:.0} %", s * 100.0))
                        .collect();
                    let _ = writeln!(
                        out,
                        "| {} | {variant} | {} | {} | {:.2}× | {:.2}× | {} | {:.0} % | {} | {} | {} | {} |",
                        row_label(b),
                        num(h.alone),
                        num(h.together),
                        h.ratio(),
                        h.turns_ratio(),
                        shares.join(" / "),
                        h.min_share() * 100.0,
                        ms(h.handover_p50),
                        ms(h.handover_p99),
                        h.extra_round_trips
                            .map(num)
                            .unwrap_or_else(|| "not counted".into()),
                        if h.meets_targets() { "met" } else { "NOT met" },
                    );
                    if h.rejected + h.failed > 0 {
                        failures.push(format!(
                            "{} ({variant}): {} edit(s) refused by the fence or the issuer \
                             check, {} failed transiently (503), over all repeats",
                            row_label(b),
                            h.rejected,
                            h.failed
                        ));
                    }
                }
                (HotCell::NotMeasured(why), None) => {
                    let mark = notes.mark(why);
                    let _ = writeln!(
                        out,
                        "| {} | {variant} | {mark} | | | | | | | | | |",
                        row_label(b)
                    );
                }
                _ => {}
            }
        }
    }
    notes.render(out);
    for f in failures {
        let _ = writeln!(out, "\n- {f}");
    }
}

fn speed_table(report: &Report, out: &mut String) {
    let s = &report.settings;
    let mut notes = Footnotes::default();
    let _ = writeln!(
        out,
        "| backend | uncontended acquire+release/s | p50 ms | p99 ms | {} contenders on one lock: acquire+release/s | p50 ms | p99 ms | fenced edits/s through the gateway, {} workers |",
        s.contenders, s.workers
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for b in &report.backends {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row_label(b),
            rate_cell(&b.uncontended, &mut notes),
            lat_cell(&b.uncontended, |f| f.p50),
            lat_cell(&b.uncontended, |f| f.p99),
            rate_cell(&b.contended, &mut notes),
            lat_cell(&b.contended, |f| f.p50),
            lat_cell(&b.contended, |f| f.p99),
            rate_cell(&b.e2e, &mut notes),
        );
    }
    notes.render(out);
}

fn limits_table(report: &Report, out: &mut String) {
    let mut notes = Footnotes::default();
    let _ = writeln!(
        out,
        "| backend | beside it | what | ops/s | p50 ms | p99 ms | our uncontended rate ÷ this |"
    );
    let _ = writeln!(out, "|---|---|---|---:|---:|---:|---:|");
    for b in &report.backends {
        let mut rows = vec![("limit", &b.limit.0, &b.limit.1)];
        if let Some((name, cell)) = &b.peer {
            rows.push(("peer", name, cell));
        }
        for (kind, name, cell) in rows {
            let ratio = match (b.uncontended.rate(), cell.rate()) {
                (Some(ours), Some(theirs)) if theirs > 0.0 => format!("{:.2}×", ours / theirs),
                _ => "—".into(),
            };
            let _ = writeln!(
                out,
                "| {} | {kind} | {name} | {} | {} | {} | {ratio} |",
                row_label(b),
                rate_cell(cell, &mut notes),
                lat_cell(cell, |f| f.p50),
                lat_cell(cell, |f| f.p99),
            );
        }
    }
    notes.render(out);
}

/// Safe = nothing acknowledged was lost and no stale write was accepted.
pub fn verdict(r: &ChaosRow) -> String {
    if let Some(e) = &r.error {
        return format!("did not run to the end: {}", super::one_line(e));
    }
    let mut facts = vec![];
    if r.stale_rejected > 0 {
        facts.push(format!("{} stale write(s) rejected", r.stale_rejected));
    }
    if r.lost_updates > 0 {
        facts.push(format!("{} lost update(s)", r.lost_updates));
    }
    if r.stale_accepted > 0 {
        facts.push(format!("{} stale write(s) accepted", r.stale_accepted));
    }
    if r.double_holders > 0 {
        facts.push(format!("two holders ×{}", r.double_holders));
    }
    let safe = r.lost_updates == 0 && r.stale_accepted == 0;
    let head = if safe { "safe" } else { "UNSAFE" };
    if facts.is_empty() {
        head.to_string()
    } else {
        format!("{head}: {}", facts.join(", "))
    }
}

/// A verdict cut to fit the matrix (the row table below it has it whole).
fn short(verdict: &str) -> String {
    let head = verdict.split("; stderr tail").next().unwrap_or(verdict);
    if head.chars().count() > 140 {
        format!("{}…", head.chars().take(140).collect::<String>())
    } else {
        head.to_string()
    }
}

fn chaos_tables(report: &Report, out: &mut String) {
    let (source, rows) = match &report.chaos {
        ChaosResult::NotMeasured(reason) => {
            let _ = writeln!(out, "Chaos: not measured ({reason}).");
            return;
        }
        ChaosResult::Rows { source, rows } => (source, rows),
    };
    let _ = writeln!(out, "Source: {source}.\n");
    if rows.is_empty() {
        let _ = writeln!(out, "No chaos rows.");
        return;
    }
    let mut scenarios: Vec<&str> = vec![];
    for r in rows {
        if !scenarios.contains(&r.scenario.as_str()) {
            scenarios.push(&r.scenario);
        }
    }
    // The matrix: one cell per backend and scenario, with the fence as the
    // backend runs in production (on, except Redlock which has no token).
    let _ = writeln!(out, "| backend (fence) | {} |", scenarios.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(scenarios.len()));
    for b in &report.backends {
        if b.ensemble {
            // The chaos rows are per backend: one line for ZooKeeper.
            continue;
        }
        let name = b.backend.name();
        let fence = b.backend.mints_tokens();
        let cells: Vec<String> = scenarios
            .iter()
            .map(|s| {
                rows.iter()
                    .find(|r| r.backend == name && r.scenario == *s && r.fencing == fence)
                    .map(|r| short(&verdict(r)))
                    .unwrap_or_else(|| "—".into())
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} ({}) | {} |",
            label(b.backend),
            if fence { "on" } else { "off: no token" },
            cells.join(" | ")
        );
    }
    let _ = writeln!(out, "\nEvery row, as the chaos runner measured it:\n");
    let _ = writeln!(
        out,
        "| scenario | backend | fence | verdict | acked | lost updates | stale rejected | stale accepted | two holders |"
    );
    let _ = writeln!(out, "|---|---|---|---|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.scenario,
            r.backend,
            if r.fencing { "on" } else { "off" },
            verdict(r),
            r.acknowledged,
            r.lost_updates,
            r.stale_rejected,
            r.stale_accepted,
            r.double_holders
        );
    }
}

fn notes(report: &Report, out: &mut String) {
    let all: Vec<String> = report
        .backends
        .iter()
        .flat_map(|b| {
            b.notes
                .iter()
                .map(move |n| format!("{}: {n}", row_label(b)))
        })
        .collect();
    if all.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nNotes from the run:\n");
    for n in all {
        let _ = writeln!(out, "- {n}");
    }
}

fn setup_line(report: &Report) -> String {
    let s = &report.settings;
    let build = if cfg!(debug_assertions) {
        "DEBUG BUILD (no --release): the figures are not representative. "
    } else {
        ""
    };
    format!(
        "{build}{} repeat(s){}; {} s per acquire+release, limit and peer run; {} s per end-to-end run; \
         medians{}.",
        s.repeat,
        if s.quick { " (--quick)" } else { "" },
        s.secs.as_secs(),
        s.e2e_secs.as_secs(),
        if s.repeat > 1 {
            ", with the spread (min–max of the repeats) in brackets"
        } else {
            " of one repeat: no spread"
        }
    )
}

/// The tables as printed to the terminal.
pub fn terminal(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n{}\n", setup_line(report));
    let _ = writeln!(out, "Speed\n");
    speed_table(report, &mut out);
    let _ = writeln!(out, "\nFair and non-fair, uncontended\n");
    fairness_table(report, &mut out);
    let _ = writeln!(
        out,
        "\nHot page: one page, 1 worker alone, then 3 together\n"
    );
    hot_table(report, &mut out);
    let _ = writeln!(out, "\nLimits and peers (same run, same services)\n");
    limits_table(report, &mut out);
    let _ = writeln!(out, "\nChaos\n");
    chaos_tables(report, &mut out);
    notes(report, &mut out);
    out
}

/// `COMPARISON.md`.
pub fn markdown(report: &Report) -> String {
    let m = &report.machine;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# The comparison, measured\n\n\
         <!-- Generated by `{}`; do not edit by hand. -->\n\n\
         The articles argue that ZooKeeper is the more reliable lock, Redis the faster one, and \
         that a lease table in MySQL is a single point under load. This page measures every \
         backend (ZooKeeper both standalone and as a 3-node ensemble, Redis also behind Sentinel) side by side on one machine, in one run: speed beside the limit of the service \
         underneath and beside a peer library, and safety under the chaos scenarios.\n",
        report.command
    );
    let _ = writeln!(out, "![acquire+release per second](comparison.svg)\n");
    let _ = writeln!(out, "## Where and how\n");
    let _ = writeln!(out, "- Date: {}", report.date);
    let _ = writeln!(
        out,
        "- Machine: {} CPU(s) (`nproc`), {}, {} memory, {}",
        m.nproc, m.cpu, m.memory, m.os
    );
    let _ = writeln!(out, "- Command: `{}`", report.command);
    let _ = writeln!(
        out,
        "- Took {:.0} s. {}",
        report.elapsed.as_secs_f64(),
        setup_line(report)
    );
    let _ = writeln!(
        out,
        "- Every service is a private, real process started by the command ({}); Redlock runs \
         on 5 independent redis-servers, Sentinel on a master, one replica and 3 sentinels. \
         All share the machine with the benchmark itself.",
        if m.services.is_empty() {
            "versions unknown".to_string()
        } else {
            m.services.join(", ")
        }
    );
    let _ = writeln!(out, "\n## Speed\n");
    let _ = writeln!(
        out,
        "One operation is an acquire followed by its release, through the worker's lock library \
         (`LockService::acquire_with`, `Lease::release`; TTL 10 s, no renewal). Uncontended: one \
         client, one lock, the client connected anew for each repeat (where the runtime places \
         a connection moves this figure by up to a third; docs/BENCHMARKS.md, \"The uncontended \
         bound\"). Contended: {c} clients, each with its own connection (or session, or \
         pool), on one lock; a waiter's latency includes its wait. The end-to-end column runs \
         {w} of the worker's own edit loops (`worker::run`, each with its own lock connection) on \
         one page through an in-process gateway with the fence enforced, trust on as in the demo \
         (each worker's API key required; for the backends with tokens, each token checked with \
         its issuer before the write): acquire, fenced GET, fenced PUT, release, no simulated \
         work (`--work-ms 0`); it counts acknowledged edits. `bench trust` in \
         docs/BENCHMARKS.md isolates what the issuer check costs.\n\n\
         The speed rows use each lock's default variant: fair, for every lock that has both \
         (Redlock has no fair variant, and its waiters poll). Every grant and release of the \
         ZooKeeper lock is a write that ZooKeeper syncs to its transaction log; concurrent \
         clients probably share those syncs, which would explain a contended rate above the \
         uncontended one.\n",
        c = report.settings.contenders,
        w = report.settings.workers
    );
    speed_table(report, &mut out);
    let _ = writeln!(out, "\n## Fair and non-fair\n");
    let _ = writeln!(
        out,
        "Uncontended acquire+release of each lock's fair variant (the default) beside its \
         non-fair one, measured as above, the two taking turns at going first in the repeats. \
         The fair grant also looks at the queue (Redis: one script that reads the server's \
         clock and the queue; the lease tables, for a lock not refused lately: the lease \
         row's `queued_until`, which the statement that queues (PostgreSQL) or a trigger on the \
         queue (MariaDB) keeps ahead of every place), and the release of a holder that waited \
         names the next waiter (PostgreSQL: hands the lock to it); the issue allows the fair \
         lock 10 % more than the non-fair one.\n"
    );
    fairness_table(report, &mut out);
    let _ = writeln!(out, "\n### The hot page\n");
    let _ = writeln!(
        out,
        "One page, fenced edits through an in-process gateway with trust on (each worker's key \
         required, every token checked with its issuer): each worker acquires the page's lock \
         (TTL 2 s, wait 10 s), reads the page (fenced GET), writes it with one more line (fenced \
         PUT), releases, and again, with no simulated work; each has its own lock connection. \
         One worker alone, then {w} together, {secs} s each, per lock variant. The hand-over is \
         the time from a holder sending its release to the next holder's acquire returning \
         (whoever that is): the time the lock spends idle between holders, plus a round trip \
         (the fair PostgreSQL lock hands over in the release statement itself, and the next \
         holder's acquire returns on the notification). The ceiling is the same {w} workers \
         taking turns on an in-process FIFO mutex, each acquiring the lock (uncontended) only \
         once its turn came: what {w} workers on this machine make of one page when a hand-over \
         costs a task wake-up and the lock service sees no contention; the lock's own cost is \
         the distance from it. \
         \"Extra lock round trips\" counts the round trips to the lock service beyond one try \
         per grant, per second and per worker: retries after a refusal, and MariaDB's waits on \
         the bell (a PostgreSQL notification or a Redis message costs no round trip, and a \
         PostgreSQL waiter handed the lock by a release sends nothing for its grant); not \
         counted for ZooKeeper, whose lock keeps no such counter. The issue's targets: {w} \
         together at least 0.8× the edits/s of one alone, and every worker at least 20 % of the \
         edits. Code: `bench/src/compare/hot.rs`.\n",
        w = super::hot::WORKERS,
        secs = report.settings.hot_secs.as_secs()
    );
    hot_table(report, &mut out);
    let _ = writeln!(out, "\n## Limits and peers\n");
    let _ = writeln!(
        out,
        "Measured in the same run on the same service, one client. A limit is what the service \
         does with the same work and no lock library around it; a peer is another library's lock \
         on the same service. The last column is how far our uncontended rate is from it.\n"
    );
    limits_table(report, &mut out);
    let _ = writeln!(out, "\n## Safety: the chaos scenarios\n");
    let _ = writeln!(
        out,
        "From the chaos runner (crate `chaos`, issue 7): real workers paused with SIGSTOP, \
         killed, delayed by a proxy, clocks jumped, services killed and restarted. \"Safe\" means \
         no acknowledged edit was lost and no stale write was accepted; \"two holders\" counts \
         overlapping lock-holding intervals of different clients (the lock itself failed, the \
         fence may still have saved the data).\n"
    );
    chaos_tables(report, &mut out);
    notes(report, &mut out);
    let _ = writeln!(out, "\n## Exact commands\n");
    let _ = writeln!(out, "- `{}`", report.command);
    for c in &report.commands {
        let _ = writeln!(out, "- `{c}`");
    }
    let _ = writeln!(
        out,
        "\nThe limits repeat the invocations of `bench locks` (redis-benchmark, pgbench, \
         mariadb-slap, Python redis Lock) and `bench redlock` (bare SET NX PX + DEL, rslock) and \
         `bench zookeeper` (raw create + getChildren + delete, kazoo Lock), re-implemented in \
         `bench/src/compare/measure.rs` because those modules keep them private."
    );
    out
}

/// Which cell of a backend a chart series shows.
type Pick = fn(&BackendReport) -> &Cell;

/// Grouped bars per backend, log scale: uncontended, contended, end to end, limit.
pub fn svg(report: &Report, path: &Path) -> anyhow::Result<()> {
    let series: [(&str, RGBColor, Pick); 4] = [
        (
            "uncontended acquire+release/s",
            RGBColor(31, 119, 180),
            |b| &b.uncontended,
        ),
        (
            "16 contenders: acquire+release/s",
            RGBColor(255, 127, 14),
            |b| &b.contended,
        ),
        ("fenced edits/s, 3 workers", RGBColor(44, 160, 44), |b| {
            &b.e2e
        }),
        (
            "limit of the service, ops/s",
            RGBColor(150, 150, 150),
            |b| &b.limit.1,
        ),
    ];
    let n = report.backends.len().max(1);
    let max = report
        .backends
        .iter()
        .flat_map(|b| series.iter().filter_map(|s| (s.2)(b).rate()))
        .fold(10.0f64, f64::max);
    // A decade and more of headroom, so that the legend sits above the bars.
    let top = 10f64.powf(max.log10().ceil() + 1.2);
    let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("draw {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let names: Vec<String> = report.backends.iter().map(row_label).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Locks compared ({}; log scale; n/m = not measured)",
                report.date
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, (1f64..top).log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.01 {
                names.get(i).map(|s| s.to_string()).unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| format!("{v:.0}"))
        .y_desc("per second")
        .draw()
        .map_err(|e| err(&e))?;
    let width = 0.8 / series.len() as f64;
    for (k, (name, color, pick)) in series.iter().enumerate() {
        let bars: Vec<Rectangle<(f64, f64)>> = report
            .backends
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let rate = pick(b).rate()?;
                let x0 = i as f64 + 0.1 + k as f64 * width;
                Some(Rectangle::new(
                    [(x0, 1.0), (x0 + width * 0.9, rate.max(1.0))],
                    color.filled(),
                ))
            })
            .collect();
        let c = *color;
        chart
            .draw_series(bars)
            .map_err(|e| err(&e))?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        let missing: Vec<Text<(f64, f64), String>> = report
            .backends
            .iter()
            .enumerate()
            .filter(|(_, b)| pick(b).rate().is_none())
            .map(|(i, _)| {
                let x0 = i as f64 + 0.1 + k as f64 * width;
                Text::new("n/m".to_string(), (x0, 1.3), ("sans-serif", 10).into_font())
            })
            .collect();
        chart.draw_series(missing).map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> ChaosRow {
        ChaosRow {
            scenario: "gc-pause-writing".into(),
            backend: "redis".into(),
            fencing: true,
            acknowledged: 2,
            lost_updates: 0,
            stale_rejected: 1,
            stale_accepted: 0,
            double_holders: 1,
            error: None,
        }
    }

    #[test]
    fn a_rejected_stale_write_is_safe_and_a_lost_update_is_not() {
        assert_eq!(
            verdict(&row()),
            "safe: 1 stale write(s) rejected, two holders ×1"
        );
        let lost = ChaosRow {
            lost_updates: 1,
            stale_rejected: 0,
            ..row()
        };
        assert_eq!(verdict(&lost), "UNSAFE: 1 lost update(s), two holders ×1");
        let broken = ChaosRow {
            error: Some("worker did not\nstart".into()),
            ..row()
        };
        assert_eq!(
            verdict(&broken),
            "did not run to the end: worker did not start"
        );
    }

    #[test]
    fn the_same_reason_gets_one_footnote() {
        let mut f = Footnotes::default();
        assert_eq!(f.mark("a"), "not measured [1]");
        assert_eq!(f.mark("b"), "not measured [2]");
        assert_eq!(f.mark("a"), "not measured [1]");
    }

    #[test]
    fn utc_now_is_a_date() {
        let now = utc_now();
        assert!(now.starts_with("20") && now.ends_with(" UTC"), "{now}");
        assert_eq!(now.len(), "2026-11-21 19:30 UTC".len());
    }
}
