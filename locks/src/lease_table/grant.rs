//! A lease's grant, on either database: the timeout of a renewal, the
//! answer of a release whose row was no longer ours. What differs is the
//! statements each database runs for it ([`Held`]).

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

use super::{with_reconnect, Attempt, LeaseTable};
use crate::{validity_for, Grant, LockError, Token};

/// What a grant of either database knows: the service, the lock, the
/// grant's holder id and token.
pub(super) struct Granted {
    pub(super) table: LeaseTable,
    pub(super) name: String,
    pub(super) holder: String,
    pub(super) token: Token,
}

/// What each database does with a lease's row.
pub(super) trait Held: Send + Sync + 'static {
    /// One renewal statement: true when our row matched.
    fn renew(&self, granted: &Granted, ttl: Duration)
        -> impl Future<Output = Attempt<bool>> + Send;

    /// Expire our row now (keeping it and its token) and wake the next
    /// waiter: true when our row matched.
    fn release(&self, granted: &Granted) -> impl Future<Output = Result<bool, LockError>> + Send;
}

/// A lease's grant, on either database.
pub(super) struct LeaseGrant<H> {
    pub(super) granted: Granted,
    pub(super) held: H,
}

impl<H> LeaseGrant<H> {
    fn not_held(&self, when: &str) -> LockError {
        LockError::NotHeld {
            name: self.granted.name.clone(),
            reason: format!(
                "{when}: lease row no longer ours (lapsed, or token {} superseded)",
                self.granted.token
            ),
        }
    }
}

impl<H: Held> Grant for LeaseGrant<H> {
    fn renew(&self, ttl: Duration) -> BoxFuture<'_, Result<Duration, LockError>> {
        async move {
            // A reply later than the TTL is useless; give the watchdog control back.
            let limit = ttl.max(Duration::from_millis(100));
            let renewed = with_reconnect(|| self.held.renew(&self.granted, ttl));
            match tokio::time::timeout(limit, renewed).await {
                Err(_) => Err(LockError::unavailable(
                    self.granted.table.issuer_name(),
                    format!("renewal got no reply within {limit:?}"),
                )),
                Ok(Ok(true)) => Ok(validity_for(ttl)),
                Ok(Ok(false)) => Err(self.not_held("renew")),
                Ok(Err(e)) => Err(e),
            }
        }
        .boxed()
    }

    /// When the row is no longer ours, nothing is touched and the answer is
    /// `NotHeld`: the caller learns its critical section outlived its
    /// lease. A late release does not cancel a lock-delay.
    fn release(&self) -> BoxFuture<'_, Result<(), LockError>> {
        async move {
            if self.held.release(&self.granted).await? {
                Ok(())
            } else {
                Err(self.not_held("release"))
            }
        }
        .boxed()
    }
}
