//! `cargo run --release -p bench -- compare [--quick] [--repeat N] [--out DIR]`:
//! the articles' comparison, measured. Every backend side by side, in one run
//! on this machine: speed (uncontended and contended acquire+release, fenced
//! edits end to end through the gateway), beside the limit of its service and a
//! peer library measured in the same run, and safety (the chaos scenarios).
//!
//! Writes `COMPARISON.md` and `comparison.svg` into `--out` (default `docs/`
//! in full mode, a fresh temp dir with `--quick` so CI does not dirty the
//! tree), and prints the same tables to stdout; the progress bar goes to stderr.
//!
//! Nothing here is estimated: a figure that could not be measured (service did
//! not start, peer not installable, backend refused) is shown as
//! "not measured (reason)".
//!
//! # Layout
//! - this file: the command line, the plan, the run.
//! - `compare/measure.rs`: one function per figure (our locks, the gateway
//!   workload, the external limits and the peers).
//! - `compare/hot.rs`: the hot page (issue 13): one page, one worker alone
//!   and three together, fair and non-fair locks.
//! - `compare/render.rs`: the tables, `COMPARISON.md` and the SVG chart.

mod hot;
mod measure;
mod render;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chaos::{Backend, Plan, Scenario};
use indicatif::{ProgressBar, ProgressStyle};

use crate::stats::{median, spread};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// CI mode: 1 s runs, one repeat, one chaos scenario per backend; writes
    /// to a temp dir unless --out is given.
    #[arg(long)]
    quick: bool,
    /// Repeats of every speed figure (median and min–max are quoted);
    /// default 3, or 1 with --quick.
    #[arg(long)]
    repeat: Option<usize>,
    /// Directory for COMPARISON.md and comparison.svg (default: docs/, or a
    /// temp dir with --quick).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only these backends (repeatable; default: all six).
    #[arg(long, value_enum)]
    backend: Vec<Backend>,
    /// Parts not to measure (repeatable); they are shown as not measured.
    #[arg(long, value_enum)]
    skip: Vec<Part>,
    /// Only these parts (repeatable; default: all), e.g. `--only hot-page`;
    /// the others are shown as not measured.
    #[arg(long, value_enum)]
    only: Vec<Part>,
    /// Take the chaos results from this JSON (written by
    /// `cargo run -p chaos -- --json FILE`) instead of running the scenarios.
    #[arg(long)]
    chaos_json: Option<PathBuf>,
}

/// Parts of the comparison that can be skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// Uncontended (fair and non-fair) and contended acquire+release.
    Speed,
    /// One page, one worker alone and three together, fair and non-fair.
    HotPage,
    /// The 3-worker fenced edits through the gateway.
    E2e,
    /// redis-benchmark, pgbench, mariadb-slap, raw ZooKeeper and Redis ops.
    Limits,
    /// Python redis Lock, kazoo Lock, rslock.
    Peers,
    /// The chaos scenarios.
    Chaos,
}

/// How long and how often.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub quick: bool,
    pub repeat: usize,
    /// Seconds per acquire+release run, per limit and per peer run.
    pub secs: Duration,
    /// Seconds per end-to-end run.
    pub e2e_secs: Duration,
    pub contenders: usize,
    pub workers: usize,
    /// Seconds per hot-page run (one alone, then three together).
    pub hot_secs: Duration,
}

/// One repeat's figure: a rate and, where the tool reports them, latencies.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    pub rate: f64,
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
}

impl From<&crate::stats::Run> for Figure {
    fn from(run: &crate::stats::Run) -> Self {
        let has = !run.latencies.is_empty();
        Figure {
            rate: run.per_sec(),
            p50: has.then(|| run.p50()),
            p99: has.then(|| run.p99()),
        }
    }
}

/// A figure over the repeats, or why there is none.
#[derive(Debug, Clone)]
pub enum Cell {
    Measured(Vec<Figure>),
    NotMeasured(String),
}

impl Cell {
    fn empty() -> Self {
        Cell::Measured(vec![])
    }

    /// Add one repeat; the first failure turns the cell into "not measured".
    fn push(&mut self, result: anyhow::Result<Figure>) {
        match (&mut *self, result) {
            (Cell::Measured(v), Ok(f)) => v.push(f),
            (Cell::Measured(v), Err(e)) => {
                let reason = if v.is_empty() {
                    format!("{e:#}")
                } else {
                    format!("repeat {} failed: {e:#}", v.len() + 1)
                };
                *self = Cell::NotMeasured(one_line(&reason));
            }
            (Cell::NotMeasured(_), _) => {}
        }
    }

    fn figures(&self) -> &[Figure] {
        match self {
            Cell::Measured(v) => v,
            Cell::NotMeasured(_) => &[],
        }
    }

    /// Median rate, when measured.
    pub fn rate(&self) -> Option<f64> {
        let rates: Vec<f64> = self.figures().iter().map(|f| f.rate).collect();
        (!rates.is_empty()).then(|| median(&rates))
    }

    pub fn spread(&self) -> Option<(f64, f64)> {
        let rates: Vec<f64> = self.figures().iter().map(|f| f.rate).collect();
        (!rates.is_empty()).then(|| spread(&rates))
    }

    /// Median over the repeats of a latency quantile.
    pub fn latency(&self, pick: fn(&Figure) -> Option<Duration>) -> Option<Duration> {
        let v: Vec<f64> = self
            .figures()
            .iter()
            .filter_map(pick)
            .map(|d| d.as_secs_f64())
            .collect();
        (!v.is_empty()).then(|| Duration::from_secs_f64(median(&v)))
    }
}

/// A hot-page figure over the repeats, or why there is none.
#[derive(Debug, Clone)]
pub enum HotCell {
    Measured(Vec<hot::Hot>),
    NotMeasured(String),
}

impl HotCell {
    fn push(&mut self, result: anyhow::Result<hot::Hot>) {
        match (&mut *self, result) {
            (HotCell::Measured(v), Ok(h)) => v.push(h),
            (HotCell::Measured(v), Err(e)) => {
                let reason = if v.is_empty() {
                    format!("{e:#}")
                } else {
                    format!("repeat {} failed: {e:#}", v.len() + 1)
                };
                *self = HotCell::NotMeasured(one_line(&reason));
            }
            (HotCell::NotMeasured(_), _) => {}
        }
    }

    /// The medians over the repeats, when measured.
    pub fn medians(&self) -> Option<hot::Hot> {
        match self {
            HotCell::Measured(v) => hot::medians(v),
            HotCell::NotMeasured(_) => None,
        }
    }
}

/// The hot page of one backend: the fair variant, then the non-fair one.
#[derive(Debug, Clone)]
pub struct HotReport {
    pub fair: HotCell,
    pub non_fair: HotCell,
}

/// Everything measured for one backend.
#[derive(Debug, Clone)]
pub struct BackendReport {
    pub backend: Backend,
    /// The default variant: fair, for the locks that have both.
    pub uncontended: Cell,
    /// The non-fair variant, beside it (`None`: Redlock has only one).
    pub uncontended_non_fair: Option<Cell>,
    /// The hot page (`None`: not a row the hot page is measured on).
    pub hot: Option<HotReport>,
    pub contended: Cell,
    pub e2e: Cell,
    /// What the limit is (e.g. "redis-benchmark EVALSHA grant+release") and its figure.
    pub limit: (String, Cell),
    /// The peer library and its figure (uncontended), if the issue names one.
    pub peer: Option<(String, Cell)>,
    pub notes: Vec<String>,
    /// Measured on the three-node ZooKeeper ensemble (the second ZooKeeper row).
    pub ensemble: bool,
}

impl BackendReport {
    fn new(backend: Backend) -> Self {
        BackendReport {
            backend,
            uncontended: Cell::empty(),
            uncontended_non_fair: (backend != Backend::Redlock).then(Cell::empty),
            hot: None,
            contended: Cell::empty(),
            e2e: Cell::empty(),
            limit: (measure::limit_name(backend).to_string(), Cell::empty()),
            peer: measure::peer_name(backend).map(|p| (p.to_string(), Cell::empty())),
            notes: vec![],
            ensemble: false,
        }
    }

    /// Mark every cell still empty as not measured, with `reason`.
    fn fail_all(&mut self, reason: &str) {
        for cell in self.cells_mut() {
            if cell.figures().is_empty() {
                *cell = Cell::NotMeasured(reason.to_string());
            }
        }
        if let Some(hot) = &mut self.hot {
            for cell in [&mut hot.fair, &mut hot.non_fair] {
                if matches!(cell, HotCell::Measured(v) if v.is_empty()) {
                    *cell = HotCell::NotMeasured(reason.to_string());
                }
            }
        }
    }

    fn cells_mut(&mut self) -> Vec<&mut Cell> {
        let mut v = vec![
            &mut self.uncontended,
            &mut self.contended,
            &mut self.e2e,
            &mut self.limit.1,
        ];
        if let Some(c) = &mut self.uncontended_non_fair {
            v.push(c);
        }
        if let Some((_, c)) = &mut self.peer {
            v.push(c);
        }
        v
    }

    /// Whether the hot page is measured on this row: Redis, ZooKeeper on
    /// the ensemble, the two lease tables.
    fn has_hot_page(&self) -> bool {
        match self.backend {
            Backend::Redis | Backend::LeasePostgres | Backend::LeaseMysql => true,
            Backend::Zookeeper => self.ensemble,
            Backend::Redlock | Backend::RedisSentinel => false,
        }
    }
}

/// One chaos row as the comparison shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChaosRow {
    pub scenario: String,
    pub backend: String,
    pub fencing: bool,
    pub acknowledged: u64,
    pub lost_updates: u64,
    pub stale_rejected: u64,
    pub stale_accepted: u64,
    pub double_holders: u64,
    pub error: Option<String>,
}

impl From<&chaos::Row> for ChaosRow {
    fn from(r: &chaos::Row) -> Self {
        ChaosRow {
            scenario: r.scenario.clone(),
            backend: r.backend.clone(),
            fencing: r.fencing,
            acknowledged: r.acknowledged,
            lost_updates: r.lost_updates,
            stale_rejected: r.stale_rejected,
            stale_accepted: r.stale_accepted,
            double_holders: r.double_holders,
            error: r.error.clone(),
        }
    }
}

/// The chaos part: where the rows came from, and the rows.
#[derive(Debug, Clone)]
pub enum ChaosResult {
    Rows { source: String, rows: Vec<ChaosRow> },
    NotMeasured(String),
}

/// The whole report.
pub struct Report {
    pub settings: Settings,
    pub backends: Vec<BackendReport>,
    pub chaos: ChaosResult,
    pub machine: render::Machine,
    pub date: String,
    pub command: String,
    /// The external tool invocations, as run (deduplicated, in order).
    pub commands: Vec<String>,
    pub elapsed: Duration,
}

/// Collects the external commands run, for the report.
#[derive(Default, Clone)]
pub struct Commands(Arc<std::sync::Mutex<Vec<String>>>);

impl Commands {
    pub fn record(&self, cmd: impl Into<String>) {
        let cmd = cmd.into();
        let mut v = self.0.lock().expect("commands mutex");
        if !v.contains(&cmd) {
            v.push(cmd);
        }
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().expect("commands mutex").clone()
    }
}

/// Progress steps per backend and repeat.
const STEPS: u64 = 7;

pub async fn run(args: Args) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let settings = Settings {
        quick: args.quick,
        repeat: args.repeat.unwrap_or(if args.quick { 1 } else { 3 }).max(1),
        secs: Duration::from_secs(if args.quick { 1 } else { 3 }),
        e2e_secs: Duration::from_secs(if args.quick { 2 } else { 5 }),
        contenders: 16,
        workers: 3,
        hot_secs: Duration::from_secs(if args.quick { 1 } else { 8 }),
    };
    let out = match &args.out {
        Some(dir) => dir.clone(),
        None if args.quick => {
            std::env::temp_dir().join(format!("bench-compare-{}", std::process::id()))
        }
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs"),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let backends: Vec<Backend> = if args.backend.is_empty() {
        Backend::ALL.to_vec()
    } else {
        Backend::ALL
            .iter()
            .copied()
            .filter(|b| args.backend.contains(b))
            .collect()
    };
    let skipped = |p: Part| -> Option<String> {
        let name = clap::ValueEnum::to_possible_value(&p)
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        if args.skip.contains(&p) {
            Some(format!("skipped with --skip {name}"))
        } else if !args.only.is_empty() && !args.only.contains(&p) {
            Some("skipped: not among --only".to_string())
        } else {
            None
        }
    };
    let skip = |p: Part| skipped(p).is_some();
    let commands = Commands::default();

    // Steps: per backend and repeat: uncontended (fair, non-fair),
    // contended, e2e, hot page, limit, peer; then chaos.
    let chaos_steps = if skip(Part::Chaos) || args.chaos_json.is_some() {
        0
    } else {
        chaos_plan(&settings, &backends)
            .iter()
            .map(|p| p.1)
            .sum::<usize>() as u64
    };
    // ZooKeeper is measured twice: standalone, then on the 3-node ensemble.
    let rows = backends.len() as u64 + u64::from(backends.contains(&Backend::Zookeeper));
    let total = rows * (1 + settings.repeat as u64 * STEPS) + chaos_steps;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("progress template")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(500));

    let python = if skip(Part::Peers) {
        Err(anyhow::anyhow!(skipped(Part::Peers).unwrap_or_default()))
    } else {
        bar.set_message("python venv for the peers (redis, kazoo) ...");
        measure::python_venv(&commands).await
    };

    let mut reports = vec![];
    let mut plan: Vec<(Backend, bool)> = vec![];
    for &backend in &backends {
        plan.push((backend, false));
        if backend == Backend::Zookeeper {
            plan.push((backend, true));
        }
    }
    for (backend, ensemble) in plan {
        let mut report = BackendReport::new(backend);
        report.ensemble = ensemble;
        if report.has_hot_page() {
            report.hot = Some(HotReport {
                fair: HotCell::Measured(vec![]),
                non_fair: HotCell::Measured(vec![]),
            });
        }
        bar.set_message(format!("{backend}: starting its services ..."));
        let started = if ensemble {
            measure::Services::start_zookeeper_ensemble().await
        } else {
            measure::Services::start(backend).await
        };
        match started {
            Err(e) => {
                let reason = one_line(&format!("services did not start: {e:#}"));
                report.fail_all(&reason);
                bar.inc(settings.repeat as u64 * STEPS);
            }
            Ok(services) => {
                let ctx = measure::Ctx {
                    settings,
                    commands: commands.clone(),
                    python: python.as_ref().ok().cloned(),
                    python_error: python.as_ref().err().map(|e| one_line(&format!("{e:#}"))),
                };
                measure_backend(&ctx, &services, &mut report, &bar, &skipped).await;
            }
        }
        bar.inc(1);
        // A hidden bar (stderr not a terminal, as in CI) prints nothing.
        if bar.is_hidden() {
            eprintln!("{}", render::backend_line(&report));
        } else {
            bar.println(render::backend_line(&report));
        }
        reports.push(report);
    }

    let chaos = if skip(Part::Chaos) {
        ChaosResult::NotMeasured(skipped(Part::Chaos).unwrap_or_default())
    } else if let Some(path) = &args.chaos_json {
        read_chaos_json(path)
    } else {
        run_chaos(&settings, &backends, &bar).await
    };
    bar.finish_and_clear();

    let report = Report {
        settings,
        backends: reports,
        chaos,
        machine: render::Machine::probe(),
        date: render::utc_now(),
        command: std::iter::once("cargo run --release -p bench --".to_string())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" "),
        commands: commands.all(),
        elapsed: started.elapsed(),
    };
    let md = render::markdown(&report);
    println!("{}", render::terminal(&report));
    let md_path = out.join("COMPARISON.md");
    std::fs::write(&md_path, md).with_context(|| format!("write {}", md_path.display()))?;
    let svg_path = out.join("comparison.svg");
    render::svg(&report, &svg_path)?;
    println!(
        "wrote {} and {} in {:.0} s",
        md_path.display(),
        svg_path.display(),
        report.elapsed.as_secs_f64()
    );
    Ok(())
}

async fn measure_backend(
    ctx: &measure::Ctx,
    services: &measure::Services,
    report: &mut BackendReport,
    bar: &ProgressBar,
    skipped: &dyn Fn(Part) -> Option<String>,
) {
    let skip = |p: Part| skipped(p).is_some();
    let b = report.backend;
    let s = ctx.settings;
    // One lock service per contender (each its own connection or session, as
    // separate processes would have), connected once and reused.
    let n = if skip(Part::Speed) { 1 } else { s.contenders };
    bar.set_message(format!("{b}: connecting {n} clients ..."));
    let clients = match services.lock_clients(n).await {
        Ok(c) => c,
        Err(e) => {
            report.fail_all(&one_line(&format!("lock service refused: {e:#}")));
            bar.inc(s.repeat as u64 * STEPS);
            return;
        }
    };
    if let Err(e) = measure::warm_up(&clients[0]).await {
        report
            .notes
            .push(one_line(&format!("warm-up failed: {e:#}")));
    }
    for r in 0..s.repeat {
        let of = format!("{b} {}/{}", r + 1, s.repeat);
        if skip(Part::Speed) {
            let reason = skipped(Part::Speed).unwrap_or_default();
            report.uncontended = Cell::NotMeasured(reason.clone());
            report.contended = Cell::NotMeasured(reason.clone());
            if let Some(c) = &mut report.uncontended_non_fair {
                *c = Cell::NotMeasured(reason);
            }
            bar.inc(3);
        } else {
            // The fair and the non-fair variant take turns at going first:
            // whichever runs right after the previous repeat's contended
            // burst shares the machine with the databases' cleanup of it
            // (autovacuum, the queue's dead rows), which cost the one that
            // always went first up to a tenth of its rate.
            let fair_first = r % 2 == 0;
            for fair in [fair_first, !fair_first] {
                if fair {
                    bar.set_message(format!("{of}: uncontended acquire+release"));
                    let lock = format!("cmp-u{r}");
                    let figure = measure::uncontended(services, true, &lock, s.secs).await;
                    report.uncontended.push(figure);
                    bar.inc(1);
                } else {
                    if let Some(cell) = &mut report.uncontended_non_fair {
                        bar.set_message(format!("{of}: uncontended acquire+release, non-fair"));
                        let lock = format!("cmp-un{r}");
                        let figure = measure::uncontended(services, false, &lock, s.secs).await;
                        cell.push(figure);
                    }
                    bar.inc(1);
                }
            }

            bar.set_message(format!("{of}: {} contenders on one lock", s.contenders));
            report
                .contended
                .push(measure::ours(&clients, &format!("cmp-c{r}"), s.secs).await);
            bar.inc(1);
        }

        if let Some(hot) = &mut report.hot {
            if skip(Part::HotPage) {
                let reason = skipped(Part::HotPage).unwrap_or_default();
                hot.fair = HotCell::NotMeasured(reason.clone());
                hot.non_fair = HotCell::NotMeasured(reason);
            } else {
                for (fair, cell) in [(true, &mut hot.fair), (false, &mut hot.non_fair)] {
                    let variant = if fair { "fair" } else { "non-fair" };
                    bar.set_message(format!(
                        "{of}: hot page, {variant}: 1 worker, then {}",
                        hot::WORKERS
                    ));
                    let page = format!("cmp-hot-{variant}-{r}");
                    cell.push(hot::measure(services, &page, fair, s.hot_secs).await);
                }
            }
        }
        bar.inc(1);

        bar.set_message(format!("{of}: {} workers through the gateway", s.workers));
        if skip(Part::E2e) {
            report.e2e = Cell::NotMeasured(skipped(Part::E2e).unwrap_or_default());
        } else {
            let result = measure::e2e(services, &format!("cmp-e2e-{r}"), s).await;
            if let Ok((_, note)) = &result {
                if !note.is_empty() {
                    report
                        .notes
                        .push(format!("end to end, repeat {}: {note}", r + 1));
                }
            }
            report.e2e.push(result.map(|(f, _)| f));
        }
        bar.inc(1);

        bar.set_message(format!("{of}: limit: {}", report.limit.0));
        if skip(Part::Limits) {
            report.limit.1 = Cell::NotMeasured(skipped(Part::Limits).unwrap_or_default());
        } else {
            report.limit.1.push(measure::limit(ctx, services, r).await);
        }
        bar.inc(1);

        if let Some((name, cell)) = &mut report.peer {
            if skip(Part::Peers) {
                *cell = Cell::NotMeasured(skipped(Part::Peers).unwrap_or_default());
            } else {
                bar.set_message(format!("{of}: peer: {name}"));
                cell.push(measure::peer(ctx, services, r).await);
            }
        }
        bar.inc(1);
    }
}

/// The chaos plan: (plan, number of rows). Quick: the paused writer (1a) on
/// every backend, fence on where the backend mints tokens, off for Redlock.
/// Full: every scenario with the chaos runner's default fence mix.
fn chaos_plan(settings: &Settings, backends: &[Backend]) -> Vec<(Plan, usize)> {
    let seed: u64 = 0x00c0_ffee;
    let mut plans = vec![];
    if settings.quick {
        let fenced: Vec<Backend> = backends
            .iter()
            .copied()
            .filter(|b| b.mints_tokens())
            .collect();
        if !fenced.is_empty() {
            plans.push(
                Plan::new(seed)
                    .scenarios(&[Scenario::GcPauseWriting])
                    .backends(&fenced)
                    .fencing(true),
            );
        }
        if backends.contains(&Backend::Redlock) {
            plans.push(
                Plan::new(seed)
                    .scenarios(&[Scenario::GcPauseWriting])
                    .backends(&[Backend::Redlock])
                    .fencing(false),
            );
        }
    } else {
        plans.push(Plan::new(seed).backends(backends));
    }
    plans
        .into_iter()
        .map(|p| {
            let n = backends
                .iter()
                .filter(|b| p.backends.as_ref().is_none_or(|only| only.contains(b)))
                .map(|&b| p.rows_for(b).len())
                .sum();
            (p, n)
        })
        .collect()
}

async fn run_chaos(settings: &Settings, backends: &[Backend], bar: &ProgressBar) -> ChaosResult {
    // The runner spawns the worker and gateway binaries next to this one.
    for bin in ["worker", "gateway"] {
        if let Err(e) = chaos::procs::binary(bin) {
            return ChaosResult::NotMeasured(one_line(&format!("{e:#}")));
        }
    }
    let mut rows = vec![];
    let mut described = vec![];
    for (plan, n) in chaos_plan(settings, backends) {
        bar.set_message(format!(
            "chaos: {n} scenario row(s), seed {} ...",
            plan.seed
        ));
        // In a task, so that a panic in the runner costs the chaos rows only.
        let result = match tokio::spawn({
            let plan = plan.clone();
            async move { chaos::run(&plan).await }
        })
        .await
        {
            Ok(rows) => rows,
            Err(e) => {
                return ChaosResult::NotMeasured(one_line(&format!("the chaos runner failed: {e}")))
            }
        };
        bar.inc(n as u64);
        described.push(format!(
            "chaos::run with seed {} ({}{})",
            plan.seed,
            plan.scenarios
                .as_ref()
                .map(|s| s.iter().map(|x| x.name()).collect::<Vec<_>>().join(", "))
                .unwrap_or_else(|| "all scenarios".into()),
            match plan.fencing {
                Some(true) => ", fence on",
                Some(false) => ", fence off",
                None => ", default fence mix",
            }
        ));
        rows.extend(result.iter().map(ChaosRow::from));
    }
    ChaosResult::Rows {
        source: format!("run now: {}", described.join("; ")),
        rows,
    }
}

fn read_chaos_json(path: &Path) -> ChaosResult {
    let parsed = std::fs::read_to_string(path)
        .with_context(|| format!("read {}", path.display()))
        .and_then(|text| parse_chaos_json(&text));
    match parsed {
        Ok((seed, rows)) => ChaosResult::Rows {
            source: format!(
                "read from {} (written by the chaos runner, seed {seed})",
                path.display()
            ),
            rows,
        },
        Err(e) => ChaosResult::NotMeasured(one_line(&format!("{e:#}"))),
    }
}

/// The chaos runner's `--json` output: `{"seed": S, "rows": [Row...]}`.
fn parse_chaos_json(text: &str) -> anyhow::Result<(u64, Vec<ChaosRow>)> {
    let v: serde_json::Value = serde_json::from_str(text).context("chaos JSON")?;
    let seed = v["seed"].as_u64().unwrap_or(0);
    let rows = v["rows"]
        .as_array()
        .context("chaos JSON has no \"rows\" array")?;
    let n = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap_or(0);
    rows.iter()
        .map(|r| {
            Ok(ChaosRow {
                scenario: r["scenario"]
                    .as_str()
                    .context("row without scenario")?
                    .into(),
                backend: r["backend"].as_str().context("row without backend")?.into(),
                fencing: r["fencing"].as_bool().unwrap_or(true),
                acknowledged: n(r, "acknowledged"),
                lost_updates: n(r, "lost_updates"),
                stale_rejected: n(r, "stale_rejected"),
                stale_accepted: n(r, "stale_accepted"),
                double_holders: n(r, "double_holders"),
                error: r["error"].as_str().map(str::to_string),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map(|rows| (seed, rows))
}

/// Collapse whitespace so a reason fits one table cell.
pub fn one_line(s: &str) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let s = s.replace('|', "/");
    if s.chars().count() > 500 {
        format!("{}…", s.chars().take(500).collect::<String>())
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(rate: f64) -> Figure {
        Figure {
            rate,
            p50: Some(Duration::from_millis(1)),
            p99: Some(Duration::from_millis(3)),
        }
    }

    #[test]
    fn a_failed_repeat_makes_the_cell_not_measured_with_the_reason() {
        let mut c = Cell::empty();
        c.push(Ok(fig(10.0)));
        c.push(Err(anyhow::anyhow!("connection refused")));
        c.push(Ok(fig(12.0)));
        match c {
            Cell::NotMeasured(r) => assert_eq!(r, "repeat 2 failed: connection refused"),
            Cell::Measured(_) => panic!("a failed repeat must not be hidden"),
        }
    }

    #[test]
    fn the_median_and_spread_come_from_the_repeats() {
        let mut c = Cell::empty();
        for r in [30.0, 10.0, 20.0] {
            c.push(Ok(fig(r)));
        }
        assert_eq!(c.rate(), Some(20.0));
        assert_eq!(c.spread(), Some((10.0, 30.0)));
        assert_eq!(c.latency(|f| f.p99), Some(Duration::from_millis(3)));
        assert_eq!(Cell::NotMeasured("x".into()).rate(), None);
    }

    #[test]
    fn chaos_json_of_the_runner_is_read_row_by_row() {
        let text = r#"{"seed": 7, "soak": false, "rows": [
            {"scenario": "gc-pause-writing", "backend": "redis", "fencing": true, "seed": 7,
             "acknowledged": 3, "lost_updates": 0, "stale_rejected": 1, "stale_accepted": 0,
             "double_holders": 1, "notes": [], "error": null, "duration_ms": 10}]}"#;
        let (seed, rows) = parse_chaos_json(text).unwrap();
        assert_eq!(seed, 7);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].stale_rejected, 1);
        assert_eq!(rows[0].error, None);
        assert!(parse_chaos_json("{}").is_err());
    }

    #[test]
    fn quick_chaos_runs_one_row_per_backend() {
        let s = Settings {
            quick: true,
            repeat: 1,
            secs: Duration::from_secs(1),
            e2e_secs: Duration::from_secs(1),
            contenders: 16,
            workers: 3,
            hot_secs: Duration::from_secs(1),
        };
        let plans = chaos_plan(&s, &Backend::ALL);
        let rows: usize = plans.iter().map(|p| p.1).sum();
        // The paused writer on every backend, Redis with Sentinel included.
        assert_eq!(rows, 6);
    }
}
