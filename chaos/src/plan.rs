//! Which rows to run (the plan), the seed of each, and the runner: per
//! backend, its services started once and its rows run in order.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Instant;

use harness::procs::GatewayProc;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::backends::{Backend, Services};
use crate::ctx::{Ctx, RowInput, Timing};
use crate::failover;
use crate::report::{self, Row};
use crate::scenarios::{self, Scenario};

/// Which rows to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `None`: every scenario.
    pub scenarios: Option<Vec<Scenario>>,
    /// `None`: every backend.
    pub backends: Option<Vec<Backend>>,
    /// `None`: the default mix (fence on everywhere it applies, fence off for
    /// the demonstrations); `Some(x)`: only rows with that fence.
    pub fencing: Option<bool>,
    pub seed: u64,
    /// Repeat every row with wider random timing and bystander workers.
    pub soak: bool,
    /// Rounds in soak mode.
    pub soak_rounds: u32,
    /// One ZooKeeper server instead of the three-node ensemble.
    pub zookeeper_standalone: bool,
}

impl Plan {
    pub fn new(seed: u64) -> Self {
        Self {
            scenarios: None,
            backends: None,
            fencing: None,
            seed,
            soak: false,
            soak_rounds: 5,
            zookeeper_standalone: false,
        }
    }

    pub fn scenarios(mut self, s: &[Scenario]) -> Self {
        self.scenarios = Some(s.to_vec());
        self
    }

    pub fn backends(mut self, b: &[Backend]) -> Self {
        self.backends = Some(b.to_vec());
        self
    }

    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = Some(on);
        self
    }

    /// The (scenario, fencing) rows of one backend, in run order.
    pub fn rows_for(&self, backend: Backend) -> Vec<(Scenario, bool)> {
        let scenarios = self
            .scenarios
            .clone()
            .unwrap_or_else(|| Scenario::ALL.to_vec());
        let mut rows = vec![];
        // Keep the restarts (they kill the shared services) last.
        let mut ordered: Vec<Scenario> = Scenario::ALL
            .iter()
            .copied()
            .filter(|s| scenarios.contains(s))
            .collect();
        ordered.dedup();
        for s in ordered {
            if !s.applies_to(backend) {
                continue;
            }
            let fences: Vec<bool> = match self.fencing {
                // Redlock grants carry no token: with the fence on every write
                // would be refused, so it appears only with the fence off.
                Some(true) if !backend.mints_tokens() => vec![],
                Some(f) => vec![f],
                None if !backend.mints_tokens() => vec![false],
                // The default run shows the fence off only where it demonstrates
                // something: the paused and the delayed writer.
                None if matches!(s, Scenario::GcPauseWriting | Scenario::DelayedWrite)
                    || s.is_replication() =>
                {
                    vec![true, false]
                }
                None => vec![true],
            };
            rows.extend(fences.into_iter().map(|f| (s, f)));
        }
        rows
    }
}

/// The seed of one row, derived from the run's seed: any row replays alone with
/// `--seed N --scenario S --backend B --fencing F`.
pub fn row_seed(seed: u64, scenario: Scenario, backend: Backend, fencing: bool, round: u32) -> u64 {
    let mut h = DefaultHasher::new();
    (seed, scenario.name(), backend.name(), fencing, round).hash(&mut h);
    h.finish()
}

/// Run the plan: per backend, start its services once and run its rows in order.
pub async fn run(plan: &Plan) -> Vec<Row> {
    let backends = plan
        .backends
        .clone()
        .unwrap_or_else(|| Backend::ALL.to_vec());
    let rounds = if plan.soak {
        plan.soak_rounds.max(1)
    } else {
        1
    };
    let mut rows = vec![];
    for backend in backends {
        let wanted = plan.rows_for(backend);
        if wanted.is_empty() {
            continue;
        }
        let mut services = Services::start_with(backend, plan.zookeeper_standalone).await;
        let mut gateways: Vec<(bool, GatewayProc)> = vec![];
        for round in 0..rounds {
            for &(scenario, fencing) in &wanted {
                let mut row = Row::new(scenario.name(), backend.name(), fencing, plan.seed);
                let started = Instant::now();
                let result = run_row(
                    plan,
                    &mut services,
                    &mut gateways,
                    scenario,
                    fencing,
                    round,
                    &mut row,
                )
                .await;
                if let Err(e) = result {
                    row.error = Some(format!("{e:#}"));
                }
                row.duration_ms = started.elapsed().as_millis() as u64;
                eprintln!(
                    "{}",
                    report::table(std::slice::from_ref(&row))
                        .lines()
                        .last()
                        .unwrap_or("")
                );
                rows.push(row);
            }
        }
    }
    rows
}

async fn run_row(
    plan: &Plan,
    services: &mut Services,
    gateways: &mut Vec<(bool, GatewayProc)>,
    scenario: Scenario,
    fencing: bool,
    round: u32,
    row: &mut Row,
) -> anyhow::Result<()> {
    let backend = services.backend;
    let mut rng = StdRng::seed_from_u64(row_seed(plan.seed, scenario, backend, fencing, round));
    let input = RowInput {
        fencing,
        timing: Timing::draw(&mut rng, plan.soak),
        page: format!(
            "{}-{}-{}-r{round}-{:x}",
            scenario.name(),
            backend.name(),
            if fencing { "on" } else { "off" },
            plan.seed & 0xffff
        ),
    };

    if failover::owns_its_stack(scenario) {
        return failover::run(scenario, services, input, row).await;
    }

    if scenario == Scenario::PostgresRestart {
        // Its own PostgreSQL and gateway: this one gets killed.
        let mut pg = harness::Postgres::start().await;
        let db = pg.create_database().await;
        let gateway = GatewayProc::spawn(&db, fencing, services.issuer().as_ref()).await?;
        let mut ctx = Ctx::new(services, &gateway, input);
        let outcome = scenarios::postgres_restart(&mut ctx, row, &mut pg).await;
        return ctx.finish(row, outcome, &gateway.url()).await;
    }

    if !gateways.iter().any(|(f, _)| *f == fencing) {
        let db = harness::fresh_database().await;
        let gateway = GatewayProc::spawn(&db, fencing, services.issuer().as_ref()).await?;
        gateways.push((fencing, gateway));
    }
    let gateway = &gateways
        .iter()
        .find(|(f, _)| *f == fencing)
        .expect("gateway")
        .1;
    let mut ctx = Ctx::new(services, gateway, input);
    let outcome = scenarios::run(scenario, &mut ctx, row).await;
    ctx.finish(row, outcome, &gateway.url()).await
}
