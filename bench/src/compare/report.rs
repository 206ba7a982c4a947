//! What the comparison found: a figure per repeat, the figures of one
//! backend, the chaos rows, and the whole report the tables are made from.

use std::sync::Arc;
use std::time::Duration;

use chaos::Backend;

use super::hot::{self, Hot};
use crate::machine::Machine;
use crate::stats::{median, spread};

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
pub enum Repeats<T> {
    Measured(Vec<T>),
    NotMeasured(String),
}

/// A speed figure over the repeats.
pub type Cell = Repeats<Figure>;
/// A hot-page figure over the repeats.
pub type HotCell = Repeats<Hot>;

impl<T> Repeats<T> {
    pub fn empty() -> Self {
        Repeats::Measured(vec![])
    }

    /// Add one repeat; the first failure turns the figure into "not measured".
    pub fn push(&mut self, result: anyhow::Result<T>) {
        match (&mut *self, result) {
            (Repeats::Measured(v), Ok(f)) => v.push(f),
            (Repeats::Measured(v), Err(e)) => {
                let reason = if v.is_empty() {
                    format!("{e:#}")
                } else {
                    format!("repeat {} failed: {e:#}", v.len() + 1)
                };
                *self = Repeats::NotMeasured(one_line(&reason));
            }
            (Repeats::NotMeasured(_), _) => {}
        }
    }

    /// The repeats measured so far (none when not measured).
    pub fn repeats(&self) -> &[T] {
        match self {
            Repeats::Measured(v) => v,
            Repeats::NotMeasured(_) => &[],
        }
    }

    /// Not measured, with `reason`, unless a repeat was.
    pub fn fail_if_empty(&mut self, reason: &str) {
        if self.repeats().is_empty() {
            *self = Repeats::NotMeasured(reason.to_string());
        }
    }
}

impl Cell {
    /// Median rate, when measured.
    pub fn rate(&self) -> Option<f64> {
        let rates: Vec<f64> = self.repeats().iter().map(|f| f.rate).collect();
        (!rates.is_empty()).then(|| median(&rates))
    }

    pub fn spread(&self) -> Option<(f64, f64)> {
        let rates: Vec<f64> = self.repeats().iter().map(|f| f.rate).collect();
        (!rates.is_empty()).then(|| spread(&rates))
    }

    /// Median over the repeats of a latency quantile.
    pub fn latency(&self, pick: fn(&Figure) -> Option<Duration>) -> Option<Duration> {
        let v: Vec<f64> = self
            .repeats()
            .iter()
            .filter_map(pick)
            .map(|d| d.as_secs_f64())
            .collect();
        (!v.is_empty()).then(|| Duration::from_secs_f64(median(&v)))
    }
}

impl HotCell {
    /// The medians over the repeats, when measured.
    pub fn medians(&self) -> Option<Hot> {
        hot::medians(self.repeats())
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
    /// The peer library and its figure (uncontended), where there is one.
    pub peer: Option<(String, Cell)>,
    pub notes: Vec<String>,
    /// Measured on the three-node ZooKeeper ensemble (the second ZooKeeper row).
    pub ensemble: bool,
}

impl BackendReport {
    /// Nothing measured yet; `limit` and `peer` name what stands beside it.
    pub fn new(backend: Backend, limit: &str, peer: Option<&str>) -> Self {
        BackendReport {
            backend,
            uncontended: Cell::empty(),
            uncontended_non_fair: (backend != Backend::Redlock).then(Cell::empty),
            hot: None,
            contended: Cell::empty(),
            e2e: Cell::empty(),
            limit: (limit.to_string(), Cell::empty()),
            peer: peer.map(|p| (p.to_string(), Cell::empty())),
            notes: vec![],
            ensemble: false,
        }
    }

    /// Mark every figure still empty as not measured, with `reason`.
    pub fn fail_all(&mut self, reason: &str) {
        for cell in self.cells_mut() {
            cell.fail_if_empty(reason);
        }
        if let Some(hot) = &mut self.hot {
            hot.fair.fail_if_empty(reason);
            hot.non_fair.fail_if_empty(reason);
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
    pub fn has_hot_page(&self) -> bool {
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
    pub machine: Machine,
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

    pub fn all(&self) -> Vec<String> {
        self.0.lock().expect("commands mutex").clone()
    }
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
}
