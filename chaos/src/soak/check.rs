//! The checker over one page: its complete history read from the final
//! primary, and every worker's events.

use std::collections::HashMap;

use harness::procs::Event;

use crate::backends::Services;
use crate::history::{self, Attempt};

use super::report::{PageReport, SoakReport};
use super::stack::Soak;

impl Soak {
    /// Read the complete history of every page and check it.
    pub(super) async fn check(&self) -> anyhow::Result<SoakReport> {
        let url = self.pg.primary_url(&self.db_name);
        let names: Vec<String> = self.pages.iter().map(|p| p.name.clone()).collect();
        let attempts = history::load(&url, &names).await?;
        let mut by_page: HashMap<String, Vec<Attempt>> = HashMap::new();
        for a in attempts {
            by_page.entry(a.page_id.clone()).or_default().push(a);
        }
        let mut report = SoakReport {
            seed: self.config.seed,
            minutes: self.config.duration.as_secs_f64() / 60.0,
            pages: vec![],
            faults: self.faults.clone(),
            worker_errors: 0,
            workers: (self.editors.len() + self.others.len()) as u64,
            violations: vec![],
            wall_s: 0.0,
            zookeeper: if self.locks.iter().any(Services::is_ensemble) {
                "ensemble"
            } else {
                "standalone"
            },
        };
        for page in &self.pages {
            let events = page.log.all();
            report.worker_errors += events.iter().filter(|e| e.kind() == "error").count() as u64;
            let state = history::page_state(&url, &page.name).await?;
            let attempts = by_page.get(&page.name).cloned().unwrap_or_default();
            let (pr, mut violations) = check_page(
                &page.name,
                self.locks[page.lock].backend.name(),
                &attempts,
                &events,
                state.as_ref(),
            );
            report.pages.push(pr);
            report.violations.append(&mut violations);
        }
        Ok(report)
    }
}

/// The checker over one page: its history in commit order, the workers'
/// events, and the final row `(body, version, fence)`.
pub fn check_page(
    page: &str,
    backend: &str,
    attempts: &[Attempt],
    events: &[Event],
    state: Option<&(Option<String>, i64, Option<i64>)>,
) -> (PageReport, Vec<String>) {
    let mut v = vec![];
    let mut r = PageReport {
        page: page.into(),
        backend: backend.into(),
        attempts: attempts.len() as u64,
        ..Default::default()
    };
    // 1. Accepted tokens never decrease in commit order.
    let mut highest: Option<(i64, i64)> = None;
    for a in attempts {
        match a.outcome.as_str() {
            "stale_token" => r.stale_refused += 1,
            "token_not_current" => r.not_current_refused += 1,
            _ => {}
        }
        if a.accepted() && a.method == "PUT" {
            r.accepted_writes += 1;
        }
        let (true, Some(t)) = (a.accepted(), a.token) else {
            continue;
        };
        if let Some((h, at)) = highest {
            if t < h {
                r.token_decreases += 1;
                v.push(format!(
                    "{page}: token {t} accepted at seq {} after token {h} at seq {at}",
                    a.seq
                ));
            }
        }
        if highest.is_none_or(|(h, _)| t > h) {
            highest = Some((t, a.seq));
        }
    }
    r.stale_accepted = history::stale_writes_accepted(attempts, None);

    // 2. Every acknowledged edit is an accepted PUT of the history.
    let wrote: Vec<&Event> = events.iter().filter(|e| e.kind() == "wrote").collect();
    r.acknowledged = wrote.len() as u64;
    for e in &wrote {
        let token = e.u64("token").map(|t| t as i64);
        let version = e.u64("version").map(|t| t as i64);
        let found = attempts.iter().any(|a| {
            a.method == "PUT"
                && a.accepted()
                && a.client_id.as_deref() == Some(e.client.as_str())
                && a.token == token
                && Some(a.version) == version
        });
        if !found {
            r.acked_not_in_history += 1;
            v.push(format!(
                "{page}: acknowledged edit of {} (token {token:?}, version {version:?}) has no accepted PUT in the history",
                e.client
            ));
        }
    }

    // 3. Every acknowledged line is in the final body exactly once.
    let (body, version, fence) = match state {
        Some((body, version, fence)) => (body.clone().unwrap_or_default(), *version, *fence),
        None => (String::new(), 0, None),
    };
    r.final_version = version;
    let mut counts: HashMap<&str, u64> = HashMap::new();
    for line in body.lines() {
        *counts.entry(line.trim()).or_default() += 1;
    }
    let mut acked_lines = std::collections::HashSet::new();
    for e in &wrote {
        let Some(line) = e.str("line") else { continue };
        acked_lines.insert(line);
        match counts.get(line).copied().unwrap_or(0) {
            0 => {
                r.lost += 1;
                v.push(format!(
                    "{page}: acknowledged line {line:?} is not in the final body"
                ));
            }
            1 => {}
            n => {
                r.duplicated += 1;
                v.push(format!(
                    "{page}: acknowledged line {line:?} is {n} times in the final body"
                ));
            }
        }
    }
    r.unacknowledged_lines = counts
        .keys()
        .filter(|l| !l.is_empty() && !acked_lines.contains(*l))
        .count() as u64;

    // 4. The final body is the last accepted write, and the fence the highest token.
    if let Some(last) = attempts
        .iter()
        .rev()
        .find(|a| a.method == "PUT" && a.accepted())
    {
        if last.version != version {
            v.push(format!(
                "{page}: the last accepted write made version {}, the page is at {version}",
                last.version
            ));
        }
        let last_line = body.lines().last().unwrap_or("").trim();
        let client = last.client_id.as_deref().unwrap_or("");
        let token = last.token.map_or("none".to_string(), |t| t.to_string());
        let acked = wrote.iter().find(|e| {
            e.client == client
                && e.u64("token").map(|t| t as i64) == last.token
                && e.u64("version").map(|t| t as i64) == Some(last.version)
        });
        let matches = match acked.and_then(|e| e.str("line")) {
            Some(line) => last_line == line,
            None => {
                last_line.starts_with(&format!("{client} #"))
                    && last_line.ends_with(&format!(" token={token}"))
            }
        };
        if !matches {
            v.push(format!(
                "{page}: the final body ends with {last_line:?}, not with the last accepted write's line (client {client}, token {token})"
            ));
        }
    }
    let max_token = attempts
        .iter()
        .filter(|a| a.accepted())
        .filter_map(|a| a.token)
        .max();
    if max_token.is_some() && fence != max_token {
        v.push(format!(
            "{page}: the fence is {fence:?}, the highest accepted token {max_token:?}"
        ));
    }
    (r, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(seq: i64, client: &str, token: i64, version: i64, outcome: &str) -> Attempt {
        Attempt {
            seq,
            page_id: "p".into(),
            method: "PUT".into(),
            outcome: outcome.into(),
            token: Some(token),
            client_id: Some(client.into()),
            version,
        }
    }

    fn wrote(client: &str, n: u64, token: u64, version: u64) -> Event {
        Event {
            client: client.into(),
            json: json!({"event": "wrote", "edit": n, "token": token, "version": version,
                         "line": format!("{client} #{n} token={token}")}),
            received_ms: 0,
        }
    }

    fn state(body: &str, version: i64, fence: i64) -> (Option<String>, i64, Option<i64>) {
        (Some(body.to_string()), version, Some(fence))
    }

    #[test]
    fn a_clean_history_passes() {
        let h = [
            put(1, "a", 3, 1, "accepted"),
            put(2, "b", 4, 2, "accepted"),
            put(3, "a", 3, 2, "stale_token"),
        ];
        let e = [wrote("a", 1, 3, 1), wrote("b", 1, 4, 2)];
        let s = state("a #1 token=3\nb #1 token=4\n", 2, 4);
        let (r, v) = check_page("p", "redis", &h, &e, Some(&s));
        assert!(v.is_empty(), "{v:?}");
        assert_eq!((r.acknowledged, r.stale_refused, r.lost), (2, 1, 0));
    }

    #[test]
    fn a_lost_line_a_duplicate_and_a_decreasing_token_are_each_found() {
        let h = [put(1, "a", 5, 1, "accepted"), put(2, "b", 4, 2, "accepted")];
        let e = [wrote("a", 1, 5, 1), wrote("b", 1, 4, 2)];
        let s = state("b #1 token=4\nb #1 token=4\n", 2, 5);
        let (r, v) = check_page("p", "redis", &h, &e, Some(&s));
        assert_eq!(
            (r.lost, r.duplicated, r.token_decreases, r.stale_accepted),
            (1, 1, 1, 1)
        );
        assert_eq!(v.len(), 3, "{v:?}");
    }

    #[test]
    fn an_acknowledged_write_missing_from_the_history_or_a_stale_body_is_found() {
        let h = [put(1, "a", 3, 1, "accepted")];
        let e = [wrote("a", 1, 3, 1), wrote("b", 1, 4, 2)];
        // b's line is there, but the page says version 1 and the history
        // never saw b's PUT: a write acknowledged and then forgotten.
        let s = state("a #1 token=3\nb #1 token=4\n", 1, 3);
        let (r, v) = check_page("p", "redis", &h, &e, Some(&s));
        assert_eq!(r.acked_not_in_history, 1);
        assert!(
            v.iter()
                .any(|m| m.contains("not with the last accepted write")),
            "{v:?}"
        );
    }
}
