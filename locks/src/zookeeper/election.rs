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

use super::{czxid_token, escape_name, lookup, ZooKeeperLock, ELECTIONS_ROOT};
use crate::{AcquireOptions, Lease, LockError, LostSignal, Token};

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
    /// The leader's node's creation zxid: its fencing token.
    pub epoch: Token,
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
        self.stand(candidate, None).await
    }

    /// Stand as `candidate`, giving up after `wait` with `LockError::Timeout`.
    pub async fn campaign_for(
        &self,
        candidate: &str,
        wait: Duration,
    ) -> Result<Leadership, LockError> {
        self.stand(candidate, Some(wait)).await
    }

    /// Stand, waiting up to `wait` (`None`: until elected). The leadership
    /// is trusted as a lease of one session timeout.
    async fn stand(
        &self,
        candidate: &str,
        wait: Option<Duration>,
    ) -> Result<Leadership, LockError> {
        let session_timeout = self.lock.session_timeout().await;
        let opts = AcquireOptions::new(session_timeout).wait(wait.unwrap_or_default());
        opts.validate(&self.name)?;
        let lease = self
            .lock
            .acquire_node(ELECTIONS_ROOT, &self.name, opts, wait, candidate)
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
        let seen = lookup::holder(&client, ELECTIONS_ROOT, &parent, false).await?;
        let Some((candidate, czxid)) = seen.holder else {
            return Ok(None);
        };
        Ok(Some(Leader {
            candidate,
            epoch: czxid_token(czxid)?,
        }))
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
    pub fn epoch(&self) -> Token {
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
