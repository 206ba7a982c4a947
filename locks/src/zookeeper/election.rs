//! Leader election on the lock recipe.
//!
//! Fair: every candidate queues an ephemeral-sequential node under
//! `/fencing/elections/<name>`; the lowest leads, each other candidate watches
//! the one just before it, so when the leader goes exactly one candidate wakes
//! up and takes over. Non-fair ([`ZooKeeperLock::non_fair`]): create-or-watch on
//! one ephemeral node; every candidate wakes on every change.
//!
//! The leader's epoch is its node's creation zxid, the same fencing token a
//! lock grant carries: a later leader always has a higher epoch, across
//! sessions and ZooKeeper leader changes, so whatever the leader writes to can
//! refuse a deposed leader's late writes.

use std::time::Duration;

use zookeeper_client as zk;

use super::{
    escape_name, node_name, retry, sequence_of, zk_error, ZooKeeperLock, ELECTIONS_ROOT, FAIR_NODE,
    NON_FAIR_NODE,
};
use crate::lock::{AcquireOptions, Lease, LockError, LostSignal};

/// One election (one name) on a [`ZooKeeperLock`]'s session.
#[derive(Clone)]
pub struct Election {
    lock: ZooKeeperLock,
    name: String,
}

/// The current leader as any observer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub candidate: String,
    pub epoch: u64,
}

impl ZooKeeperLock {
    /// An election named `name`, fair or not like this lock service.
    pub fn election(&self, name: &str) -> Election {
        Election {
            lock: self.clone(),
            name: name.to_string(),
        }
    }
}

impl Election {
    /// Stand as `candidate` and wait until elected. Dropping the future
    /// withdraws the candidacy (its node is deleted, as for a lock acquire).
    pub async fn campaign(&self, candidate: &str) -> Result<Leadership, LockError> {
        let session_timeout = self.lock.session_timeout().await;
        let opts = AcquireOptions::new(session_timeout);
        opts.validate(&self.name)?;
        let lease = self
            .lock
            .acquire_node(ELECTIONS_ROOT, &self.name, opts, None, candidate)
            .await?;
        Ok(Leadership {
            lease,
            candidate: candidate.to_string(),
        })
    }

    /// Stand as `candidate`, giving up after `wait` with `LockError::Timeout`.
    pub async fn campaign_for(
        &self,
        candidate: &str,
        wait: Duration,
    ) -> Result<Leadership, LockError> {
        let session_timeout = self.lock.session_timeout().await;
        let opts = AcquireOptions::new(session_timeout).wait(wait);
        opts.validate(&self.name)?;
        let lease = self
            .lock
            .acquire_node(ELECTIONS_ROOT, &self.name, opts, Some(wait), candidate)
            .await?;
        Ok(Leadership {
            lease,
            candidate: candidate.to_string(),
        })
    }

    /// Who leads now, if anybody: read from ZooKeeper, not from this process.
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        let client = self.lock.client().await?;
        let parent = format!("{ELECTIONS_ROOT}/{}", escape_name(&self.name)?);
        let path = if self.lock.is_fair() {
            let children = match retry(|| client.list_children(&parent)).await {
                Ok(c) => c,
                Err(zk::Error::NoNode) => return Ok(None),
                Err(e) => return Err(zk_error(e)),
            };
            let lowest = children
                .iter()
                .filter(|c| c.starts_with("_c_") && c.contains(FAIR_NODE))
                .filter_map(|c| sequence_of(c).map(|s| (s, c)))
                .min();
            match lowest {
                Some((_, c)) => format!("{parent}/{c}"),
                None => return Ok(None),
            }
        } else {
            format!("{parent}/{NON_FAIR_NODE}")
        };
        match retry(|| client.get_data(&path)).await {
            Ok((data, stat)) => {
                let text = String::from_utf8_lossy(&data);
                // Node data is "<guid>\n<candidate>".
                let candidate = text.split_once('\n').map_or(&*text, |(_, c)| c).to_string();
                Ok(Some(Leader {
                    candidate,
                    epoch: stat.czxid as u64,
                }))
            }
            Err(zk::Error::NoNode) => {
                tracing::debug!(node = node_name(&path), "leader node went while reading it");
                Ok(None)
            }
            Err(e) => Err(zk_error(e)),
        }
    }
}

/// Being the leader. Lost like a lease (session expired, validity passed);
/// given up with [`Leadership::abdicate`], which lets the next candidate in.
#[derive(Debug)]
pub struct Leadership {
    lease: Lease,
    candidate: String,
}

impl Leadership {
    /// The leader's fencing token: its node's creation zxid.
    pub fn epoch(&self) -> u64 {
        self.lease
            .token()
            .expect("zookeeper grants always carry a token")
    }

    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// Fires when this leadership can no longer be trusted.
    pub fn lost_signal(&self) -> LostSignal {
        self.lease.lost_signal()
    }

    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Step down: delete our node so the next candidate takes over.
    pub async fn abdicate(self) -> Result<(), LockError> {
        self.lease.release().await
    }
}
