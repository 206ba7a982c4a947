//! Who holds a lock, as a storage asks it ([`HolderLookup`]): one `HMGET
//! lock:{N} token owner`, read the same way on a fixed server and on the
//! master Sentinel names.

use futures::future::BoxFuture;
use futures::FutureExt;

use super::connection::RESPONSE_TIMEOUT;
use super::keys::lock_key;
use super::lock::RedisLock;
use crate::{Holder, HolderLookup, LockError};

/// The holder named by the `token` and `owner` fields of `lock:{N}`
/// (`owner` is `<id> <client id>`).
pub fn parse_holder(token: &str, owner: &str) -> Option<Holder> {
    let token = token.parse().ok()?;
    let (_id, client_id) = owner.split_once(' ')?;
    (!client_id.is_empty()).then(|| Holder {
        client_id: client_id.to_string(),
        token,
    })
}

/// The answer to `HMGET lock:{N} token owner`.
pub(super) type HolderFields = (Option<String>, Option<String>);

/// The answer to `HMGET lock:{N} token owner`, as a holder (`None`: free).
pub(super) fn holder_from_fields(
    issuer: &str,
    fields: HolderFields,
) -> Result<Option<Holder>, LockError> {
    match fields {
        (None, None) => Ok(None),
        (Some(token), Some(owner)) => parse_holder(&token, &owner).map(Some).ok_or_else(|| {
            LockError::protocol(
                issuer,
                format!("lock hash {token:?} {owner:?} names no holder"),
            )
        }),
        other => Err(LockError::protocol(
            issuer,
            format!("lock hash incomplete: {other:?}"),
        )),
    }
}

/// `HMGET lock:{N} token owner`: the holder lookup's one read.
pub(super) fn holder_command(name: &str) -> redis::Cmd {
    redis::cmd("HMGET")
        .arg(lock_key(name))
        .arg("token")
        .arg("owner")
        .to_owned()
}

impl HolderLookup for RedisLock {
    fn issuer(&self) -> &str {
        self.server.issuer
    }

    /// One `HMGET lock:{N} token owner`: the hash exists exactly while the
    /// lock is held (Redis expires it), whatever the variant that holds it
    /// (fair, non-fair, reentrant), and names the holder and its token.
    fn current_holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Holder>, LockError>> {
        async move {
            let server = &self.server;
            let get = holder_command(name);
            let mut asked_again = false;
            loop {
                let mut conn = server.connection().await?;
                match server
                    .answer("HMGET", RESPONSE_TIMEOUT, get.query_async(&mut conn))
                    .await?
                {
                    Ok(fields) => return holder_from_fields(server.issuer, fields),
                    // A connection kept from before a server restart (or a
                    // dropped link) fails on its first use. The read changes
                    // nothing, so ask once more on a fresh connection instead
                    // of making the caller (the gateway) refuse a write with
                    // 503 that the server could have checked. A second
                    // failure is the answer: the server is really away.
                    Err(e) if !asked_again && (e.is_connection_dropped() || e.is_io_error()) => {
                        server.forget();
                        asked_again = true;
                    }
                    Err(e) => return Err(server.failed(e)),
                }
            }
        }
        .boxed()
    }
}
