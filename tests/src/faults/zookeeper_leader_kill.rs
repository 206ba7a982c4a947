//! The ZooKeeper ensemble's leader (found with `srvr`) SIGKILLed: the other
//! two elect a new one. Healed by starting the old leader again.

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::procs::now_ms;
use crate::ZooKeeperHosts;

/// Kill the leader and wait for the election.
pub async fn inject(zk: &mut ZooKeeperHosts) -> anyhow::Result<LeaderKilled> {
    let leader = zk.leader().await.context("no server says it leads")?;
    let at = Instant::now();
    let at_ms = now_ms();
    zk.kill(leader);
    let zk: &ZooKeeperHosts = zk;
    let elected = crate::wait_until(super::SERVICE_WAIT, || async move {
        match zk.leader().await {
            Some(l) if l != leader => Ok(l),
            other => Err(format!("leader {other:?}")),
        }
    })
    .await
    .map(|l| (l, at.elapsed()))
    .map_err(|e| format!("no new leader after the kill: {e}\n{}", zk.logs(20)));
    Ok(LeaderKilled {
        leader,
        at,
        at_ms,
        elected,
    })
}

/// What undoes a leader kill: start it again.
#[must_use = "the old leader stays down until healed"]
pub struct LeaderKilled {
    pub leader: usize,
    pub at: Instant,
    /// Unix ms of the kill.
    pub at_ms: i64,
    /// The new leader and how long after the kill it led.
    pub elected: Result<(usize, Duration), String>,
}

impl LeaderKilled {
    /// Start the old leader again; how long until all three served.
    pub async fn heal(self, zk: &mut ZooKeeperHosts) -> anyhow::Result<Duration> {
        zk.process(self.leader).start()?;
        let started = Instant::now();
        zk.wait_all_serving(super::SERVICE_WAIT)
            .await
            .map_err(|e| anyhow::anyhow!("after the restart: {e}"))?;
        Ok(started.elapsed())
    }
}
