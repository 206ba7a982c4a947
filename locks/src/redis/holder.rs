//! Who holds a lock, as a storage asks it ([`HolderLookup`]): `HMGET
//! lock:{N} token owner`, and for [`HolderLookup::state`] `GET fence:{N}`
//! after it in the same round trip, read the same way on a fixed server and
//! on the master Sentinel names.
//!
//! [`HolderLookup`]: crate::HolderLookup
//! [`HolderLookup::state`]: crate::HolderLookup::state

use futures::future::BoxFuture;
use futures::FutureExt;
use redis::{Cmd, Value};

use super::connection::RESPONSE_TIMEOUT;
use super::keys::{fence_key, lock_key};
use super::lock::RedisLock;
use crate::{Holder, LockError, LockState, Token};

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
type HolderFields = (Option<String>, Option<String>);

/// The answer to `HMGET lock:{N} token owner`, as a holder (`None`: free).
fn holder_from_fields(issuer: &str, fields: HolderFields) -> Result<Option<Holder>, LockError> {
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

/// The answer to `GET fence:{N}`: the highest token minted; 0 when there
/// is no counter (nothing minted, or it was deleted).
fn minted_from_counter(issuer: &str, counter: Option<String>) -> Result<Token, LockError> {
    let Some(counter) = counter else {
        return Ok(Token::MIN);
    };
    counter
        .parse::<i64>()
        .ok()
        .and_then(|n| Token::try_from(n).ok())
        .ok_or_else(|| LockError::protocol(issuer, format!("fence counter {counter:?}")))
}

/// What one lookup reads of a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lookup {
    /// The holder (`HMGET lock:{N} token owner`).
    Holder,
    /// The holder, then the counter (`GET fence:{N}`), in one round trip.
    /// Read in this order, the counter is at least the holder's token
    /// unless somebody wrote the keys by hand: a grant increments the
    /// counter in the same step as it writes the hash, and the counter
    /// only grows.
    State,
    /// The counter alone.
    Minted,
}

impl Lookup {
    /// The commands to send, in this order, for lock `name`.
    pub(super) fn commands(self, name: &str) -> Vec<Cmd> {
        let holder = || {
            redis::cmd("HMGET")
                .arg(lock_key(name))
                .arg("token")
                .arg("owner")
                .to_owned()
        };
        let counter = || redis::cmd("GET").arg(fence_key(name)).to_owned();
        match self {
            Lookup::Holder => vec![holder()],
            Lookup::State => vec![holder(), counter()],
            Lookup::Minted => vec![counter()],
        }
    }

    /// The answers to [`Lookup::commands`], one value each.
    pub(super) fn answer(self, issuer: &str, values: &[Value]) -> Result<LockState, LockError> {
        let malformed = |e: redis::RedisError| LockError::protocol(issuer, e);
        let holder = |v: &Value| {
            let fields = redis::from_redis_value::<HolderFields>(v).map_err(malformed)?;
            holder_from_fields(issuer, fields)
        };
        let minted = |v: &Value| {
            let counter = redis::from_redis_value::<Option<String>>(v).map_err(malformed)?;
            minted_from_counter(issuer, counter).map(Some)
        };
        match (self, values) {
            (Lookup::Holder, [h]) => Ok(LockState {
                holder: holder(h)?,
                minted: None,
            }),
            (Lookup::State, [h, m]) => Ok(LockState {
                holder: holder(h)?,
                minted: minted(m)?,
            }),
            (Lookup::Minted, [m]) => Ok(LockState {
                holder: None,
                minted: minted(m)?,
            }),
            _ => Err(LockError::protocol(
                issuer,
                format!("{self:?} lookup answered {values:?}"),
            )),
        }
    }
}

/// [`HolderLookup`] for a type whose `lookup_lock(name, Lookup)` answers
/// each kind of lookup, and whose issuer is `$issuer`.
macro_rules! holder_lookup {
    ($ty:ty) => {
        impl $crate::HolderLookup for $ty {
            fn issuer(&self) -> &str {
                $crate::LockService::issuer(self)
            }

            fn current_holder<'a>(
                &'a self,
                name: &'a str,
            ) -> futures::future::BoxFuture<'a, Result<Option<$crate::Holder>, $crate::LockError>>
            {
                Box::pin(async move {
                    let state = self.lookup_lock(name, $crate::redis::holder::Lookup::Holder);
                    Ok(state.await?.holder)
                })
            }

            /// The holder and the lock's counter, `HMGET` and `GET` in one
            /// round trip.
            fn state<'a>(
                &'a self,
                name: &'a str,
            ) -> futures::future::BoxFuture<'a, Result<$crate::LockState, $crate::LockError>> {
                Box::pin(self.lookup_lock(name, $crate::redis::holder::Lookup::State))
            }

            /// `GET fence:{N}` (0 when there is none).
            fn minted<'a>(
                &'a self,
                name: &'a str,
            ) -> futures::future::BoxFuture<'a, Result<Option<$crate::Token>, $crate::LockError>>
            {
                Box::pin(async move {
                    let state = self.lookup_lock(name, $crate::redis::holder::Lookup::Minted);
                    Ok(state.await?.minted)
                })
            }
        }
    };
}
// Sentinel implements the lookup with it too.
#[cfg_attr(not(feature = "redis-sentinel"), allow(unused_imports))]
pub(super) use holder_lookup;

holder_lookup!(RedisLock);

impl RedisLock {
    /// One lookup on the kept connection. The hash exists exactly while the
    /// lock is held (Redis expires it), whatever the variant that holds it
    /// (fair, non-fair, reentrant), and names the holder and its token.
    fn lookup_lock<'a>(
        &'a self,
        name: &'a str,
        what: Lookup,
    ) -> BoxFuture<'a, Result<LockState, LockError>> {
        async move {
            let server = &self.server;
            let mut pipe = redis::pipe();
            for cmd in what.commands(name) {
                pipe.add_command(cmd);
            }
            let mut asked_again = false;
            loop {
                let mut conn = server.connection().await?;
                let sent = pipe.query_async::<Vec<Value>>(&mut conn);
                match server.answer("lookup", RESPONSE_TIMEOUT, sent).await? {
                    Ok(values) => return what.answer(server.issuer, &values),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_state_is_the_holder_and_the_counter_and_no_counter_is_zero() {
        let hash = Value::Array(vec![bulk("7"), bulk("abc alice")]);
        let alice = Holder {
            client_id: "alice".into(),
            token: Token::new(7).unwrap(),
        };
        let state = Lookup::State.answer("redis", &[hash.clone(), bulk("9")]);
        assert_eq!(
            state,
            Ok(LockState {
                holder: Some(alice),
                minted: Token::new(9)
            })
        );
        let free = Value::Array(vec![Value::Nil, Value::Nil]);
        let state = Lookup::State.answer("redis", &[free, Value::Nil]).unwrap();
        assert_eq!((state.holder, state.minted), (None, Some(Token::MIN)));
        for counter in ["x", "-1"] {
            let e = Lookup::Minted
                .answer("redis", &[bulk(counter)])
                .unwrap_err();
            assert!(matches!(e, LockError::Protocol { .. }), "{e:?}");
        }
        assert!(Lookup::Holder
            .answer("redis", &[hash.clone(), hash])
            .is_err());
    }
}
