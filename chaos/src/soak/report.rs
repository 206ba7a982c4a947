//! What a soak measured: the faults injected, and per page what the checker
//! found; the tables of docs/CHAOS.md.

use std::collections::BTreeMap;

use serde::Serialize;

use super::config::Fault;

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub fault: Fault,
    /// Seconds since the soak started.
    pub at_s: f64,
    pub target: String,
    pub detail: String,
    /// Set when the fault could not be carried out to the end (a straggler
    /// that never got the lock, say). Not a safety violation by itself.
    pub error: Option<String>,
}

/// What the checker found on one page.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PageReport {
    pub page: String,
    pub backend: String,
    /// `wrote` events: edits the gateway acknowledged.
    pub acknowledged: u64,
    /// Rows of `page_history` (every fenced access and write attempt).
    pub attempts: u64,
    pub accepted_writes: u64,
    /// Attempts refused with `stale_token` (the storage's fence).
    pub stale_refused: u64,
    /// Attempts refused with `token_not_current` (the issuer check: the lock
    /// service no longer grants that token), before the fence was asked.
    pub not_current_refused: u64,
    /// Accepted writes whose token is lower than one accepted before.
    pub stale_accepted: u64,
    /// Accepted accesses whose token is lower than the previous accepted one.
    pub token_decreases: u64,
    /// Acknowledged lines missing from the final body.
    pub lost: u64,
    /// Acknowledged lines present more than once.
    pub duplicated: u64,
    /// Acknowledged edits with no accepted PUT of that client, token and version.
    pub acked_not_in_history: u64,
    /// Lines in the body that no worker was told about (a PUT that landed
    /// but whose answer was lost, e.g. to a killed gateway). Allowed.
    pub unacknowledged_lines: u64,
    pub final_version: i64,
}

/// Everything a soak measured.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    pub seed: u64,
    pub minutes: f64,
    pub pages: Vec<PageReport>,
    pub faults: Vec<FaultRecord>,
    /// Error events of the workers (failed requests and lock calls, retried).
    pub worker_errors: u64,
    /// Workers started, including stragglers and replacements.
    pub workers: u64,
    pub violations: Vec<String>,
    pub wall_s: f64,
    /// `ensemble` (three servers in network namespaces) or `standalone`.
    pub zookeeper: &'static str,
}

impl SoakReport {
    pub fn faults_by_kind(&self) -> BTreeMap<Fault, (u64, u64)> {
        let mut out: BTreeMap<Fault, (u64, u64)> = BTreeMap::new();
        for f in &self.faults {
            let e = out.entry(f.fault).or_default();
            e.0 += 1;
            if f.error.is_some() {
                e.1 += 1;
            }
        }
        out
    }

    pub fn total(&self, f: impl Fn(&PageReport) -> u64) -> u64 {
        self.pages.iter().map(f).sum()
    }

    /// The Markdown tables for docs/CHAOS.md.
    pub fn table(&self) -> String {
        let mut by_backend: BTreeMap<&str, PageReport> = BTreeMap::new();
        for p in &self.pages {
            let b = by_backend.entry(&p.backend).or_default();
            b.backend = p.backend.clone();
            b.acknowledged += p.acknowledged;
            b.attempts += p.attempts;
            b.accepted_writes += p.accepted_writes;
            b.stale_refused += p.stale_refused;
            b.not_current_refused += p.not_current_refused;
            b.stale_accepted += p.stale_accepted;
            b.token_decreases += p.token_decreases;
            b.lost += p.lost;
            b.duplicated += p.duplicated;
            b.acked_not_in_history += p.acked_not_in_history;
            b.unacknowledged_lines += p.unacknowledged_lines;
        }
        let mut t = String::from(
            "| backend | edits acknowledged | attempts in history | accepted writes | stale refused (fence) | refused (issuer check) | stale accepted | tokens decreasing | lost | duplicated | acked, not in history | unacknowledged lines |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let mut all = PageReport {
            backend: "**all**".into(),
            ..Default::default()
        };
        for b in by_backend.values() {
            t.push_str(&row_of(b));
            all.acknowledged += b.acknowledged;
            all.attempts += b.attempts;
            all.accepted_writes += b.accepted_writes;
            all.stale_refused += b.stale_refused;
            all.not_current_refused += b.not_current_refused;
            all.stale_accepted += b.stale_accepted;
            all.token_decreases += b.token_decreases;
            all.lost += b.lost;
            all.duplicated += b.duplicated;
            all.acked_not_in_history += b.acked_not_in_history;
            all.unacknowledged_lines += b.unacknowledged_lines;
        }
        t.push_str(&row_of(&all));
        t.push_str("\n| fault | injected | could not complete |\n|---|---:|---:|\n");
        let mut n = 0;
        for (f, (count, failed)) in self.faults_by_kind() {
            t.push_str(&format!("| {} | {count} | {failed} |\n", f.name()));
            n += count;
        }
        t.push_str(&format!("| **all** | {n} | |\n"));
        t
    }
}

fn row_of(b: &PageReport) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        b.backend,
        b.acknowledged,
        b.attempts,
        b.accepted_writes,
        b.stale_refused,
        b.not_current_refused,
        b.stale_accepted,
        b.token_decreases,
        b.lost,
        b.duplicated,
        b.acked_not_in_history,
        b.unacknowledged_lines
    )
}
