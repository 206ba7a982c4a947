//! `cargo run -p chaos -- [--scenario X] [--backend Y] [--fencing on|off] [--seed N] [--soak] [--json out.json]`
//! `cargo run -p chaos -- --soak --minutes 30 [--seed N] [--backend Y] [--json out.json]`

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use chaos::{report, Backend, Plan, Scenario};
use clap::{Parser, ValueEnum};

/// Run the chaos scenarios against real processes and print what happened.
#[derive(Debug, Parser)]
#[command(name = "chaos", about)]
struct Config {
    /// Only these scenarios (repeatable; default: all).
    #[arg(long, value_enum)]
    scenario: Vec<Scenario>,
    /// Only these backends (repeatable; default: all).
    #[arg(long, value_enum)]
    backend: Vec<Backend>,
    /// Only rows with the gateway's fence on or off (default: fence on everywhere,
    /// off for the paused and delayed writers and for Redlock).
    #[arg(long, value_enum)]
    fencing: Option<OnOff>,
    /// Seed of the randomized timing; printed, so a run can be replayed.
    #[arg(long, env = "CHAOS_SEED")]
    seed: Option<u64>,
    /// Repeat every row with wider random schedules and bystander workers.
    #[arg(long)]
    soak: bool,
    /// Rounds of --soak.
    #[arg(long, default_value_t = 5)]
    soak_rounds: u32,
    /// With --soak: instead of repeating rows, run every fenced backend at
    /// once, on its own pages, for this many minutes under random faults from
    /// the whole catalogue, then check the complete history (docs/CHAOS.md, "Soak").
    #[arg(long, requires = "soak")]
    minutes: Option<f64>,
    /// Also write the rows as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// One ZooKeeper server instead of the three-node ensemble (whose servers
    /// run in network namespaces; the partition row needs the ensemble).
    #[arg(long)]
    zookeeper_standalone: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    let seed = config.seed.unwrap_or_else(rand::random);
    let mut plan = Plan::new(seed);
    if !config.scenario.is_empty() {
        plan = plan.scenarios(&config.scenario);
    }
    if !config.backend.is_empty() {
        plan = plan.backends(&config.backend);
    }
    plan.fencing = config.fencing.map(|f| matches!(f, OnOff::On));
    plan.soak = config.soak;
    plan.soak_rounds = config.soak_rounds;
    plan.zookeeper_standalone = config.zookeeper_standalone;
    eprintln!("chaos: seed {seed} (replay with --seed {seed})");
    if let Some(minutes) = config.minutes {
        return soak(seed, minutes, &config).await;
    }

    let started = Instant::now();
    let rows = chaos::run(&plan).await;
    println!("{}", report::table(&rows));
    println!(
        "seed {seed}; {} rows in {:.0} s",
        rows.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &config.json {
        let json = serde_json::json!({ "seed": seed, "soak": plan.soak, "rows": rows });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    let violations = chaos::violations(&rows);
    if violations.is_empty() {
        println!("every assertion of the chaos table holds: nothing acknowledged lost, no stale write accepted with fencing on");
        Ok(())
    } else {
        for v in &violations {
            println!("VIOLATION: {v}");
        }
        anyhow::bail!(
            "{} violation(s); replay with --seed {seed}",
            violations.len()
        )
    }
}

async fn soak(seed: u64, minutes: f64, config: &Config) -> anyhow::Result<()> {
    let mut soak =
        chaos::soak::SoakConfig::new(seed, std::time::Duration::from_secs_f64(minutes * 60.0));
    if !config.backend.is_empty() {
        soak.backends = config
            .backend
            .iter()
            .copied()
            .filter(|b| b.mints_tokens())
            .collect();
    }
    soak.zookeeper_standalone = config.zookeeper_standalone;
    let report = chaos::soak::run(soak).await?;
    println!("{}", report.table());
    println!(
        "seed {seed}; {:.1} minutes of faults, {} workers, {} worker errors (retried), {:.0} s in all",
        report.minutes, report.workers, report.worker_errors, report.wall_s
    );
    if let Some(path) = &config.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    if report.violations.is_empty() {
        println!("the checker found nothing over the complete history");
        Ok(())
    } else {
        for v in &report.violations {
            println!("VIOLATION: {v}");
        }
        anyhow::bail!(
            "{} violation(s); replay with --seed {seed} --soak --minutes {minutes}",
            report.violations.len()
        )
    }
}
