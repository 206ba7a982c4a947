//! PostgreSQL losing its primary: the replication link cut (what it holds
//! never reaches the standby), the primary SIGKILLed, the standby promoted.
//! Healed by building a new standby from the new primary.

use std::time::{Duration, Instant};

use crate::procs::now_ms;
use crate::PostgresPair;

/// Cut the replication link, both ways; clients still reach the primary.
pub fn cut(pair: &PostgresPair) -> LinkCut {
    pair.cut_replication();
    LinkCut { at: Instant::now() }
}

/// The link is cut; the failover comes next.
#[must_use = "a cut link is the first half of a failover"]
pub struct LinkCut {
    pub at: Instant,
}

impl LinkCut {
    /// SIGKILL the primary and promote the standby.
    pub async fn fail_over(self, pair: &mut PostgresPair) -> FailedOver {
        let primary_lsn = pair.primary_lsn().await.ok();
        pair.kill_primary();
        let killed_at = now_ms();
        let standby_lsn = pair.standby_received_lsn().await.ok();
        let promotion = pair.promote().await;
        FailedOver {
            killed_at,
            wal_lost: primary_lsn
                .zip(standby_lsn)
                .map(|(p, s)| p.saturating_sub(s)),
            promotion,
        }
    }
}

/// What undoes a failover: a standby again.
#[must_use = "the new primary runs without a standby until healed"]
pub struct FailedOver {
    /// Unix ms of the kill.
    pub killed_at: i64,
    /// Bytes of WAL the primary had and the standby never received.
    pub wal_lost: Option<u64>,
    /// How long the promotion took.
    pub promotion: Duration,
}

impl FailedOver {
    /// Build a new standby from the new primary; how long that took.
    pub async fn heal(self, pair: &mut PostgresPair) -> Duration {
        let started = Instant::now();
        pair.rebuild_standby().await;
        started.elapsed()
    }
}
