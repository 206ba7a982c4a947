//! One grant of the lock: renewed and released by the owner and token that
//! prove it is ours, and, when asked for, checked to have reached enough
//! replicas before anybody acts on it.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

use super::connection::{Server, RESPONSE_TIMEOUT};
use super::scripts;
use crate::{validity_for, Grant, LockError, Token};

/// After a grant, wait until this many replicas acknowledged it (`WAIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    pub replicas: u32,
    pub timeout: Duration,
}

/// One grant: the owner and token that prove it is ours.
pub(super) struct RedisGrant {
    pub(super) server: Arc<Server>,
    pub(super) name: String,
    pub(super) owner: String,
    pub(super) token: Token,
}

impl RedisGrant {
    fn not_held(&self, reason: &str) -> LockError {
        LockError::NotHeld {
            name: self.name.clone(),
            reason: reason.into(),
        }
    }

    /// `WAIT replicas timeout` on the connection that carried the grant (it
    /// counts the replicas that acknowledged every write of this connection
    /// so far). Too few: release the grant and refuse it, so that nobody acts
    /// on a grant that a failover would lose.
    pub(super) async fn wait_for_replicas(&self, wait: ReplicaWait) -> Result<(), LockError> {
        let server = &self.server;
        let mut conn = server.connection().await?;
        let cmd = redis::cmd("WAIT")
            .arg(wait.replicas)
            .arg(wait.timeout.as_millis() as u64)
            .to_owned();
        let limit = wait.timeout + RESPONSE_TIMEOUT;
        let acked: Result<u32, LockError> = server
            .answer("WAIT", limit, cmd.query_async(&mut conn))
            .await
            .and_then(|answer| answer.map_err(|e| server.failed(e)));
        let acked = match acked {
            Ok(n) if n >= wait.replicas => return Ok(()),
            Ok(n) => n,
            Err(e) => {
                let _ = self.release().await;
                return Err(e);
            }
        };
        let released = match self.release().await {
            Ok(()) => "released".to_string(),
            Err(e) => format!("release failed ({e}); it expires with its TTL"),
        };
        tracing::warn!(lock = %self.name, acked, wanted = wait.replicas, "grant not replicated in time");
        Err(LockError::unavailable(
            server.issuer,
            format!(
                "the grant of {:?} reached {acked} of {} replica(s) within {:?} (WAIT); {released}",
                self.name, wait.replicas, wait.timeout
            ),
        ))
    }
}

impl Grant for RedisGrant {
    fn renew(&self, ttl: Duration) -> BoxFuture<'_, Result<Duration, LockError>> {
        async move {
            let renew = scripts::renew(&self.name, &self.owner, self.token, ttl);
            let extended: i64 = self.server.run(ttl, renew).await?;
            if extended == 1 {
                Ok(validity_for(ttl))
            } else {
                Err(self.not_held("redis key expired or taken by another holder"))
            }
        }
        .boxed()
    }

    /// Deletes the hash only if it still holds our owner and token (and, for
    /// a reentrant owner, only at the last release), and in the same step
    /// tells the channel who is next. When it does not hold ours (our grant
    /// expired, maybe somebody else holds it now) nothing is touched and the
    /// answer is `NotHeld`, so the caller learns that its critical section
    /// outlived its lease.
    fn release(&self) -> BoxFuture<'_, Result<(), LockError>> {
        async move {
            let release = scripts::release(&self.name, &self.owner, self.token);
            let released: i64 = self.server.run(RESPONSE_TIMEOUT, release).await?;
            if released >= 1 {
                Ok(())
            } else {
                Err(self.not_held("redis key had already expired or been taken over at release"))
            }
        }
        .boxed()
    }
}
