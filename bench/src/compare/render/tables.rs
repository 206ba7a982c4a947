//! The tables: speed, fair beside non-fair, the hot page, limits and
//! peers, and the chaos matrix with its rows.

use std::fmt::Write as _;

use super::cells::{label, lat_cell, num, rate_cell, row_label, Footnotes};
use crate::compare::report::{one_line, ChaosResult, ChaosRow, HotCell, Report};
use crate::stats::ms;

/// Uncontended acquire+release of the fair and the non-fair variant, side
/// by side (the target: fair costs at most 10 % more).
pub(super) fn fairness_table(report: &Report, out: &mut String) {
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
pub(super) fn hot_table(report: &Report, out: &mut String) {
    let mut notes = Footnotes::default();
    let _ = writeln!(
        out,
        "| backend | lock | 1 worker: edits/s | {w} workers: edits/s | {w} ÷ 1 | ceiling: {w} taking turns in-process ÷ 1 | shares of the {w} | smallest share | hand-over p50 ms | p99 ms | extra lock round trips/s per worker | targets (≥ 0.8×, every share ≥ 20 %) |",
        w = crate::compare::hot::WORKERS
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

pub(super) fn speed_table(report: &Report, out: &mut String) {
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

pub(super) fn limits_table(report: &Report, out: &mut String) {
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
        return format!("did not run to the end: {}", one_line(e));
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

pub(super) fn chaos_tables(report: &Report, out: &mut String) {
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

pub(super) fn notes(report: &Report, out: &mut String) {
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
}
