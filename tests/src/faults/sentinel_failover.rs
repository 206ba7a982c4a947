//! A Redis Sentinel failover that loses a grant: the replica is cut off
//! from its master just before the grant, the master freezes, the sentinels
//! promote the replica, which never saw the grant. Healed by thawing the old
//! master, which the sentinels turn into a replica of the new one.

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::SentinelGroup;

/// The group's two servers, by the role they have before the fault.
#[derive(Debug, Clone, Copy)]
pub struct SentinelFailover {
    pub master: usize,
    pub replica: usize,
}

impl SentinelFailover {
    /// The master the sentinels name now, and its replica, once in sync.
    pub async fn find(group: &SentinelGroup) -> anyhow::Result<Self> {
        let master = group
            .named_master()
            .await
            .context("the sentinels name no master")?;
        let me = Self {
            master,
            replica: 1 - master,
        };
        me.wait_in_sync(group).await?;
        Ok(me)
    }

    /// Wait until the replica has all of the master's writes.
    pub async fn wait_in_sync(&self, group: &SentinelGroup) -> anyhow::Result<()> {
        group
            .wait_in_sync(self.master, self.replica, super::SERVICE_WAIT)
            .await
            .map_err(anyhow::Error::msg)
    }

    /// Cut the replica off its master: what the master grants from now on
    /// never reaches it.
    pub async fn detach(&self, group: &mut SentinelGroup) -> anyhow::Result<()> {
        group
            .detach_replica(self.replica, self.master)
            .await
            .map_err(anyhow::Error::msg)
    }

    /// Freeze the master, thaw the detached replica, and wait until the
    /// sentinels promote it.
    pub async fn inject(&self, group: &mut SentinelGroup) -> anyhow::Result<Promoted> {
        group.freeze(self.master);
        let frozen = Instant::now();
        group.thaw(self.replica);
        group
            .wait_master(self.replica, super::SERVICE_WAIT)
            .await
            .map_err(anyhow::Error::msg)?;
        Ok(Promoted {
            took: frozen.elapsed(),
            old: self.master,
            new: self.replica,
        })
    }
}

/// What undoes the failover: the old master back, as a replica.
#[must_use = "the group has no replica until healed"]
pub struct Promoted {
    /// From the freeze to the promotion.
    pub took: Duration,
    old: usize,
    new: usize,
}

impl Promoted {
    /// Thaw the old master (the sentinels turn it into a replica of the new
    /// one) and wait until it is in sync, so the group is whole again.
    pub async fn heal(self, group: &mut SentinelGroup) -> anyhow::Result<()> {
        group.thaw(self.old);
        group
            .wait_in_sync(self.new, self.old, super::SERVICE_WAIT)
            .await
            .map_err(|e| anyhow::anyhow!("the old master did not rejoin as a replica: {e}"))
    }

    /// The old master, to thaw early (it rejoins by itself).
    pub fn old(&self) -> usize {
        self.old
    }
}
