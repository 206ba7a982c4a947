//! The tail's position in `page_history`: the highest id seen, the ids below
//! it not seen yet (gaps), and the counters of every page, so that each row
//! is counted exactly once (see the module's doc, "Reading the tail without
//! missing a row").

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

/// How long an id below the highest seen is waited for before it is taken for
/// one that will never commit. A statement commits milliseconds after taking
/// its id; this is far longer than any commit that succeeds.
pub const GAP_GRACE: Duration = Duration::from_secs(30);
/// How far below the highest id the snapshot looks for uncommitted ids, and
/// most gaps opened by one jump of the sequence.
pub const GAP_WINDOW: i64 = 1024;

/// One attempt on a page: a row of `page_history`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Attempt {
    pub seq: i64,
    #[serde(skip)]
    pub page_id: String,
    pub at: DateTime<Utc>,
    pub method: String,
    pub outcome: String,
    #[schema(required = true)]
    pub token: Option<i64>,
    #[schema(required = true)]
    pub issuer: Option<String>,
    #[schema(required = true)]
    pub client_id: Option<String>,
    /// The page's version after the attempt.
    pub version: i64,
    /// The page's fence token after the attempt.
    #[schema(required = true)]
    pub fence_token: Option<i64>,
}

/// A page's line in the page list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PageCounters {
    pub id: String,
    /// PUTs that landed (`accepted` or `stale`).
    pub writes: i64,
    /// Fenced GETs that were answered (`accepted` or `stale`).
    pub reads: i64,
    /// Attempts refused, whatever the reason.
    pub refused: i64,
    /// PUTs that landed with a token older than the fence (fencing off): lost updates.
    pub lost_updates: i64,
    /// The newest attempt's id.
    pub last_seq: i64,
}

impl PageCounters {
    fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            writes: 0,
            reads: 0,
            refused: 0,
            lost_updates: 0,
            last_seq: 0,
        }
    }

    fn count(&mut self, a: &Attempt) {
        let landed = matches!(a.outcome.as_str(), "accepted" | "stale");
        match (landed, a.method.as_str()) {
            (false, _) => self.refused += 1,
            (true, "PUT") => {
                self.writes += 1;
                if a.outcome == "stale" {
                    self.lost_updates += 1;
                }
            }
            (true, _) => self.reads += 1,
        }
        self.last_seq = self.last_seq.max(a.seq);
    }
}

/// The position in `page_history` of the gateway's one tail, and the
/// counters it keeps.
#[derive(Debug)]
pub struct Tail {
    /// The highest id seen.
    pub high: i64,
    /// Ids below `high` not seen yet, with when they were first missed.
    gaps: BTreeMap<i64, Instant>,
    pub(super) counters: HashMap<String, PageCounters>,
}

/// What one poll brought.
#[derive(Debug, Default, PartialEq)]
pub struct Absorbed {
    /// Pages whose counters changed, by id.
    pub pages: Vec<String>,
    /// The new attempts, of every page, oldest first.
    pub attempts: Vec<Attempt>,
}

impl Tail {
    /// A tail positioned after `high`, with `gaps` still to come.
    pub fn new(high: i64, gaps: &[i64], now: Instant) -> Self {
        Self {
            high,
            gaps: gaps.iter().map(|&id| (id, now)).collect(),
            counters: HashMap::new(),
        }
    }

    /// The ids waited for, for the next poll.
    pub fn gaps(&self) -> Vec<i64> {
        self.gaps.keys().copied().collect()
    }

    pub fn counters(&self, id: &str) -> Option<&PageCounters> {
        self.counters.get(id)
    }

    /// Take in a poll's rows (ordered by id): count them once each, note the
    /// ids skipped over, and forget gaps older than [`GAP_GRACE`].
    pub fn absorb(&mut self, rows: Vec<Attempt>, now: Instant) -> Absorbed {
        let mut out = Absorbed::default();
        for row in rows {
            if row.seq > self.high {
                let from = (self.high + 1).max(row.seq - GAP_WINDOW);
                for id in from..row.seq {
                    self.gaps.insert(id, now);
                }
                self.high = row.seq;
            } else if self.gaps.remove(&row.seq).is_none() {
                continue; // seen before
            }
            self.counters
                .entry(row.page_id.clone())
                .or_insert_with(|| PageCounters::new(&row.page_id))
                .count(&row);
            if !out.pages.contains(&row.page_id) {
                out.pages.push(row.page_id.clone());
            }
            out.attempts.push(row);
        }
        self.gaps
            .retain(|_, since| now.duration_since(*since) < GAP_GRACE);
        // A burst of rollbacks cannot grow the set without bound.
        while self.gaps.len() as i64 > 4 * GAP_WINDOW {
            self.gaps.pop_first();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(seq: i64, page: &str, method: &str, outcome: &str) -> Attempt {
        Attempt {
            seq,
            page_id: page.into(),
            at: Utc::now(),
            method: method.into(),
            outcome: outcome.into(),
            token: Some(seq),
            issuer: Some("default".into()),
            client_id: Some("c".into()),
            version: 1,
            fence_token: Some(seq),
        }
    }

    #[test]
    fn a_row_committed_late_below_the_highest_id_is_still_counted_once() {
        let t0 = Instant::now();
        let mut tail = Tail::new(10, &[], t0);
        // 12 commits before 11.
        let got = tail.absorb(vec![attempt(12, "b", "PUT", "accepted")], t0);
        assert_eq!(got.pages, ["b"]);
        assert_eq!(tail.gaps(), [11]);
        let got = tail.absorb(
            vec![
                attempt(11, "a", "GET", "accepted"),
                attempt(12, "b", "PUT", "accepted"),
            ],
            t0,
        );
        assert_eq!(got.pages, ["a"], "12 is not counted twice");
        assert_eq!(got.attempts.len(), 1);
        assert_eq!(got.attempts[0].seq, 11);
        assert!(tail.gaps().is_empty());
        assert_eq!(tail.counters("b").unwrap().writes, 1);
        assert_eq!(tail.counters("a").unwrap().reads, 1);
    }

    #[test]
    fn a_gap_that_never_commits_is_given_up_after_the_grace() {
        let t0 = Instant::now();
        let mut tail = Tail::new(0, &[], t0);
        tail.absorb(vec![attempt(3, "a", "PUT", "accepted")], t0);
        assert_eq!(tail.gaps(), [1, 2]);
        tail.absorb(vec![], t0 + GAP_GRACE - Duration::from_millis(1));
        assert_eq!(tail.gaps(), [1, 2]);
        tail.absorb(vec![], t0 + GAP_GRACE);
        assert!(tail.gaps().is_empty());
    }

    #[test]
    fn a_jump_of_the_sequence_opens_at_most_a_window_of_gaps() {
        let t0 = Instant::now();
        let mut tail = Tail::new(0, &[], t0);
        tail.absorb(vec![attempt(1_000_000, "a", "PUT", "accepted")], t0);
        assert_eq!(tail.gaps().len() as i64, GAP_WINDOW);
        assert_eq!(tail.gaps()[0], 1_000_000 - GAP_WINDOW);
    }

    #[test]
    fn refusals_of_any_name_count_as_refused_and_stale_puts_as_lost_updates() {
        let mut c = PageCounters::new("a");
        for (method, outcome) in [
            ("PUT", "accepted"),
            ("PUT", "stale"),
            ("GET", "accepted"),
            ("GET", "stale"),
            ("PUT", "stale_token"),
            ("GET", "issuer_mismatch"),
            ("PUT", "token_not_current"),
            ("PUT", "some_future_refusal"),
        ] {
            c.count(&attempt(1, "a", method, outcome));
        }
        assert_eq!((c.writes, c.reads, c.refused, c.lost_updates), (2, 2, 4, 1));
    }
}
