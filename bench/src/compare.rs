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
//! - `compare/report.rs`: what is found: figures over the repeats, a
//!   backend's row, the chaos rows, the report.
//! - `compare/services.rs`: the real services of each backend, started
//!   here, and the lock clients on them.
//! - `compare/measure.rs`: one function per figure (our locks, the gateway
//!   workload, the external limits and the peers).
//! - `compare/hot.rs`: the hot page: one page, one worker alone and three
//!   together, fair and non-fair locks.
//! - `compare/scenarios.rs`: the chaos part, run now or read from JSON.
//! - `compare/render/`: the tables, `COMPARISON.md` and the SVG chart.

mod hot;
mod measure;
mod render;
mod report;
mod scenarios;
mod services;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use chaos::Backend;
use indicatif::{ProgressBar, ProgressStyle};

use report::{
    one_line, BackendReport, Cell, ChaosResult, Commands, HotCell, HotReport, Report, Settings,
};
use services::Services;

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
        scenarios::chaos_plan(&settings, &backends)
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
        let limit = measure::limit_name(backend);
        let mut report = BackendReport::new(backend, limit, measure::peer_name(backend));
        report.ensemble = ensemble;
        if report.has_hot_page() {
            report.hot = Some(HotReport {
                fair: HotCell::empty(),
                non_fair: HotCell::empty(),
            });
        }
        bar.set_message(format!("{backend}: starting its services ..."));
        let started = if ensemble {
            Services::start_zookeeper_ensemble().await
        } else {
            Services::start(backend).await
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
        scenarios::read_chaos_json(path)
    } else {
        scenarios::run_chaos(&settings, &backends, &bar).await
    };
    bar.finish_and_clear();

    let report = Report {
        settings,
        backends: reports,
        chaos,
        machine: crate::machine::Machine::probe(),
        date: crate::machine::utc_now(),
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
    services: &Services,
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
