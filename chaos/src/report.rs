//! What one scenario run measured, how it is computed from the evidence, and
//! how the table and its JSON look.
//!
//! The evidence is real: the workers' JSONL events, the gateway's
//! `/pages/{id}/history` and the final page body. Nothing is inferred from the
//! scenario's intent.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use crate::procs::Event;

/// One row of the table: one scenario on one backend with fencing on or off.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    pub scenario: String,
    pub backend: String,
    /// The gateway's fence: `true` = enforce, `false` = off (stale writes are
    /// accepted and only marked `stale` in the history).
    pub fencing: bool,
    pub seed: u64,
    /// `wrote` events: edits the gateway acknowledged to a worker.
    pub acknowledged: u64,
    /// Acknowledged edits whose line is missing from the final page body.
    pub lost_updates: u64,
    /// Stale accesses the gateway refused: `stale_token` (the fence) plus
    /// `token_not_current` (the issuer check: the lock service no longer
    /// named this client as the holder of that token).
    pub stale_rejected: u64,
    /// Of those, refused by the fence (`stale_token`).
    pub stale_token: u64,
    /// Of those, refused by the issuer check (`token_not_current`).
    pub token_not_current: u64,
    /// Accepted writes whose token is lower than an earlier accepted one.
    pub stale_accepted: u64,
    /// Pairs of lock-holding intervals (from `acquired` to `released`/`lost`/death)
    /// of different clients that overlap in time.
    pub double_holders: u64,
    /// What else happened that a reader should know (503s seen, stuck, abandoned edits...).
    pub notes: Vec<String>,
    /// Set when the scenario itself could not be run to the end.
    pub error: Option<String>,
    pub duration_ms: u64,
}

impl Row {
    pub fn new(scenario: &str, backend: &str, fencing: bool, seed: u64) -> Self {
        Self {
            scenario: scenario.to_string(),
            backend: backend.to_string(),
            fencing,
            seed,
            acknowledged: 0,
            lost_updates: 0,
            stale_rejected: 0,
            stale_token: 0,
            token_not_current: 0,
            stale_accepted: 0,
            double_holders: 0,
            notes: vec![],
            error: None,
            duration_ms: 0,
        }
    }

    pub fn note(&mut self, n: impl Into<String>) {
        self.notes.push(n.into());
    }
}

/// One entry of the gateway's page history, as far as the runner needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntry {
    pub outcome: String,
    pub method: String,
    pub token: Option<u64>,
    pub issuer: Option<String>,
    pub client: Option<String>,
    /// Sort key: an id/seq if the gateway gives one, else the time string.
    order: (i64, String),
}

/// Parse `/pages/{id}/history` leniently (a bare array or an object holding
/// one), oldest first.
pub fn parse_history(v: &Value) -> Vec<HistoryEntry> {
    let items = match v {
        Value::Array(a) => a.clone(),
        Value::Object(o) => ["history", "entries", "items", "writes"]
            .iter()
            .find_map(|k| o.get(*k).and_then(Value::as_array).cloned())
            .unwrap_or_default(),
        _ => vec![],
    };
    let s = |e: &Value, keys: &[&str]| -> Option<String> {
        keys.iter()
            .find_map(|k| e.get(*k).and_then(Value::as_str).map(str::to_string))
    };
    let mut out: Vec<HistoryEntry> = items
        .iter()
        .map(|e| HistoryEntry {
            outcome: s(e, &["outcome", "result"]).unwrap_or_default(),
            method: s(e, &["method"]).unwrap_or_else(|| "PUT".into()),
            token: ["token", "fencing_token"]
                .iter()
                .find_map(|k| e.get(*k).and_then(Value::as_u64)),
            issuer: s(e, &["issuer", "fencing_issuer"]),
            client: s(e, &["client_id", "client"]),
            order: (
                ["id", "seq", "event_id"]
                    .iter()
                    .find_map(|k| e.get(*k).and_then(Value::as_i64))
                    .unwrap_or(0),
                s(e, &["time", "at", "created_at", "ts"]).unwrap_or_default(),
            ),
        })
        .collect();
    out.sort_by(|a, b| a.order.cmp(&b.order));
    out
}

/// Accesses refused as stale: (by the fence, `stale_token`; by the issuer
/// check, `token_not_current`).
pub fn stale_rejected(history: &[HistoryEntry]) -> (u64, u64) {
    let count = |outcome: &str| history.iter().filter(|e| e.outcome == outcome).count() as u64;
    (count("stale_token"), count("token_not_current"))
}

/// The "stale rejected" cell: the total, and which check refused them.
pub fn stale_rejected_cell(r: &Row) -> String {
    let mut parts = vec![];
    if r.stale_token > 0 {
        parts.push(format!("{} stale_token", r.stale_token));
    }
    if r.token_not_current > 0 {
        parts.push(format!("{} token_not_current", r.token_not_current));
    }
    if parts.is_empty() {
        r.stale_rejected.to_string()
    } else {
        format!("{} ({})", r.stale_rejected, parts.join(", "))
    }
}

/// Accepted writes (outcome `accepted`, or `stale` with the fence off) whose
/// token is lower than an earlier accepted write's token of the same issuer.
pub fn stale_accepted(history: &[HistoryEntry]) -> u64 {
    let mut highest: HashMap<Option<String>, u64> = HashMap::new();
    let mut count = 0;
    for e in history {
        if e.method != "PUT" || !(e.outcome == "accepted" || e.outcome == "stale") {
            continue;
        }
        let Some(t) = e.token else {
            // An unfenced write cannot be judged by token; the fence-off gateway
            // still marks it if it knows better.
            if e.outcome == "stale" {
                count += 1;
            }
            continue;
        };
        let max = highest.entry(e.issuer.clone()).or_insert(0);
        if t < *max || e.outcome == "stale" {
            count += 1;
        }
        *max = (*max).max(t);
    }
    count
}

/// The line an acknowledged edit appended to the page body.
pub fn edit_line(e: &Event) -> Option<String> {
    let n = e.u64("edit")?;
    let token = match e.json.get("token").and_then(Value::as_u64) {
        Some(t) => t.to_string(),
        None => "none".into(),
    };
    Some(format!("{} #{n} token={token}", e.client))
}

/// Acknowledged edits and how many of them the final body misses.
pub fn lost_updates(events: &[Event], body: &str) -> (u64, u64, Vec<String>) {
    let lines: Vec<&str> = body.lines().map(str::trim).collect();
    let mut acked = 0;
    let mut missing = vec![];
    for e in events.iter().filter(|e| e.kind() == "wrote") {
        acked += 1;
        if let Some(line) = edit_line(e) {
            if !lines.contains(&line.as_str()) {
                missing.push(line);
            }
        }
    }
    (acked, missing.len() as u64, missing)
}

/// Count pairs of overlapping holding intervals of different clients.
///
/// An interval runs from `acquired` to the client's next `released` or `lost`;
/// one that never ends runs to `ends_at[client]` (the kill time, or the last
/// event of that client).
pub fn double_holders(events: &[Event], ends_at: &HashMap<String, i64>) -> u64 {
    let mut intervals: Vec<(String, i64, i64)> = vec![];
    let mut open: HashMap<String, i64> = HashMap::new();
    let mut last_seen: HashMap<String, i64> = HashMap::new();
    for e in events {
        match e.kind() {
            "acquired" => {
                open.insert(e.client.clone(), e.ts());
            }
            // `released` is emitted once the release call returned, which can be
            // after the next holder was already told the lock is free; the worker
            // stopped acting under the lock at its previous step (its write).
            "released" => {
                if let Some(start) = open.remove(&e.client) {
                    let end = last_seen.get(&e.client).copied().unwrap_or(e.ts());
                    intervals.push((e.client.clone(), start, end.max(start)));
                }
            }
            "lost" => {
                if let Some(start) = open.remove(&e.client) {
                    intervals.push((e.client.clone(), start, e.ts()));
                }
            }
            _ => {}
        }
        last_seen.insert(e.client.clone(), e.ts());
    }
    for (client, start) in open {
        let end = ends_at
            .get(&client)
            .or(last_seen.get(&client))
            .copied()
            .unwrap_or(start);
        intervals.push((client, start, end));
    }
    let mut count = 0;
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            if a.0 != b.0 && a.1 < b.2 && b.1 < a.2 {
                count += 1;
            }
        }
    }
    count
}

/// The table as printed by the runner (and pasted into docs/CHAOS.md).
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| scenario | backend | fencing | acked | lost updates | stale rejected | stale accepted | two holders | notes |"
    );
    let _ = writeln!(out, "|---|---|---|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let mut notes = r.notes.join("; ");
        if let Some(e) = &r.error {
            if !notes.is_empty() {
                notes.push_str("; ");
            }
            // The first line only; the JSON keeps the whole error with the logs.
            notes.push_str(&format!("ERROR: {}", e.lines().next().unwrap_or("")));
        }
        // Redlock grants carry no token: the gateway cannot tell stale from fresh.
        let unfenced = r.backend == "redlock";
        let stale = |n: u64| {
            if unfenced {
                "n/a".to_string()
            } else {
                n.to_string()
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.scenario,
            r.backend,
            if r.fencing { "on" } else { "off" },
            r.acknowledged,
            r.lost_updates,
            if unfenced {
                "n/a".to_string()
            } else {
                stale_rejected_cell(r)
            },
            stale(r.stale_accepted),
            r.double_holders,
            notes.replace('|', "/").replace('\n', " ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(client: &str, v: Value) -> Event {
        let ts = v["ts"].as_i64().unwrap_or(0);
        Event {
            client: client.into(),
            json: v,
            received_ms: ts,
        }
    }

    #[test]
    fn a_lower_token_accepted_after_a_higher_one_is_a_stale_accept() {
        let h = parse_history(&json!([
            {"id": 1, "method": "PUT", "outcome": "accepted", "token": 5, "issuer": "redis"},
            {"id": 2, "method": "PUT", "outcome": "accepted", "token": 7, "issuer": "redis"},
            {"id": 3, "method": "PUT", "outcome": "stale", "token": 6, "issuer": "redis"},
            {"id": 4, "method": "PUT", "outcome": "stale_token", "token": 4, "issuer": "redis"},
            {"id": 5, "method": "PUT", "outcome": "token_not_current", "token": 6, "issuer": "redis"},
            {"id": 6, "method": "GET", "outcome": "token_not_current", "token": 6, "issuer": "redis"},
        ]));
        assert_eq!(stale_accepted(&h), 1);
        assert_eq!(stale_rejected(&h), (1, 2));
    }

    #[test]
    fn the_stale_rejected_cell_says_which_check_refused() {
        let mut r = Row::new("gc-pause-writing", "redis", true, 1);
        assert_eq!(stale_rejected_cell(&r), "0");
        (r.stale_token, r.token_not_current, r.stale_rejected) = (1, 2, 3);
        assert_eq!(
            stale_rejected_cell(&r),
            "3 (1 stale_token, 2 token_not_current)"
        );
        (r.stale_token, r.token_not_current, r.stale_rejected) = (0, 1, 1);
        assert_eq!(stale_rejected_cell(&r), "1 (1 token_not_current)");
    }

    #[test]
    fn history_is_read_oldest_first_whatever_order_it_comes_in() {
        let h = parse_history(&json!({"history": [
            {"id": 2, "method": "PUT", "outcome": "accepted", "token": 3},
            {"id": 1, "method": "PUT", "outcome": "accepted", "token": 9},
        ]}));
        assert_eq!(h[0].token, Some(9));
        assert_eq!(stale_accepted(&h), 1);
    }

    #[test]
    fn an_acknowledged_edit_missing_from_the_body_is_lost() {
        let events = vec![
            ev(
                "a",
                json!({"event": "wrote", "edit": 1, "token": 3, "ts": 1}),
            ),
            ev(
                "b",
                json!({"event": "wrote", "edit": 1, "token": 4, "ts": 2}),
            ),
        ];
        let (acked, lost, missing) = lost_updates(&events, "a #1 token=3\n");
        assert_eq!((acked, lost), (2, 1));
        assert_eq!(missing, vec!["b #1 token=4".to_string()]);
    }

    #[test]
    fn overlapping_holds_of_two_clients_count_once() {
        let events = vec![
            ev("a", json!({"event": "acquired", "ts": 0})),
            ev("b", json!({"event": "acquired", "ts": 10})),
            ev("b", json!({"event": "wrote", "ts": 15})),
            ev("b", json!({"event": "released", "ts": 20})),
            ev("a", json!({"event": "wrote", "ts": 25})),
            ev("a", json!({"event": "released", "ts": 30})),
            ev("b", json!({"event": "acquired", "ts": 40})),
            ev("b", json!({"event": "wrote", "ts": 45})),
            ev("b", json!({"event": "released", "ts": 50})),
        ];
        assert_eq!(double_holders(&events, &HashMap::new()), 1);
    }

    #[test]
    fn a_release_reported_after_the_next_grant_is_not_a_double_hold() {
        let events = vec![
            ev("a", json!({"event": "acquired", "ts": 0})),
            ev("a", json!({"event": "wrote", "edit": 1, "ts": 10})),
            ev("b", json!({"event": "acquired", "ts": 11})),
            ev("a", json!({"event": "released", "ts": 12})),
        ];
        assert_eq!(double_holders(&events, &HashMap::new()), 0);
    }

    #[test]
    fn a_killed_holder_holds_until_its_death() {
        let events = vec![
            ev("a", json!({"event": "acquired", "ts": 0})),
            ev("b", json!({"event": "acquired", "ts": 100})),
            ev("b", json!({"event": "released", "ts": 120})),
        ];
        let ends = HashMap::from([("a".to_string(), 50)]);
        assert_eq!(double_holders(&events, &ends), 0);
    }
}
