//! One ZooKeeper server cut off from the other two (its clients still reach
//! it): a minority that must stop serving, and sessions that expire on the
//! majority's side. Healed by joining it again.

use std::time::{Duration, Instant};

use crate::procs::now_ms;
use crate::ZooKeeperHosts;

/// Cut `server` off from the rest of the ensemble.
pub fn inject(zk: &mut ZooKeeperHosts, server: usize) -> std::io::Result<Partitioned> {
    zk.partition(server)?;
    Ok(Partitioned {
        server,
        at_ms: now_ms(),
    })
}

/// What undoes a partition: the heal.
#[must_use = "the server stays cut off until healed"]
pub struct Partitioned {
    pub server: usize,
    /// Unix ms of the cut.
    pub at_ms: i64,
}

/// When the partition healed, and how long all three took to serve again.
pub struct Healed {
    pub at_ms: i64,
    pub serving_after: Duration,
}

impl Partitioned {
    pub async fn heal(self, zk: &mut ZooKeeperHosts) -> anyhow::Result<Healed> {
        zk.heal()?;
        let at_ms = now_ms();
        let healed = Instant::now();
        zk.wait_all_serving(super::SERVICE_WAIT)
            .await
            .map_err(|e| anyhow::anyhow!("after the heal: {e}\n{}", zk.logs(20)))?;
        Ok(Healed {
            at_ms,
            serving_after: healed.elapsed(),
        })
    }
}
