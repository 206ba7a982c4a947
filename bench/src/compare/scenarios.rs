//! The safety part of the comparison: the chaos scenarios, run now or read
//! from the JSON the chaos runner wrote.

use std::path::Path;

use anyhow::Context;
use chaos::{Backend, Plan, Scenario};
use indicatif::ProgressBar;

use super::report::{one_line, ChaosResult, ChaosRow, Settings};

/// The chaos plan: (plan, number of rows). Quick: the paused writer (1a) on
/// every backend, fence on where the backend mints tokens, off for Redlock.
/// Full: every scenario with the chaos runner's default fence mix.
pub fn chaos_plan(settings: &Settings, backends: &[Backend]) -> Vec<(Plan, usize)> {
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

pub async fn run_chaos(
    settings: &Settings,
    backends: &[Backend],
    bar: &ProgressBar,
) -> ChaosResult {
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

pub fn read_chaos_json(path: &Path) -> ChaosResult {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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
