//! What the tables share: the rows' names and the cells' formats, and the
//! line printed per backend as it finishes.

use std::fmt::Write as _;
use std::time::Duration;

use crate::compare::report::{BackendReport, Cell, Figure, HotCell};
use crate::stats::ms;

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
pub struct Footnotes(Vec<String>);

impl Footnotes {
    pub fn mark(&mut self, reason: &str) -> String {
        let i = match self.0.iter().position(|r| r == reason) {
            Some(i) => i,
            None => {
                self.0.push(reason.to_string());
                self.0.len() - 1
            }
        };
        format!("not measured [{}]", i + 1)
    }

    pub fn render(&self, out: &mut String) {
        if self.0.is_empty() {
            return;
        }
        out.push('\n');
        for (i, r) in self.0.iter().enumerate() {
            let _ = writeln!(out, "[{}] not measured: {r}  ", i + 1);
        }
    }
}

pub fn num(rate: f64) -> String {
    if rate >= 100.0 {
        format!("{rate:.0}")
    } else {
        format!("{rate:.1}")
    }
}

/// "median (min–max)" of a cell's rates, or its not-measured mark.
pub fn rate_cell(cell: &Cell, notes: &mut Footnotes) -> String {
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

pub fn lat_cell(cell: &Cell, pick: fn(&Figure) -> Option<Duration>) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_reason_gets_one_footnote() {
        let mut f = Footnotes::default();
        assert_eq!(f.mark("a"), "not measured [1]");
        assert_eq!(f.mark("b"), "not measured [2]");
        assert_eq!(f.mark("a"), "not measured [1]");
    }
}
