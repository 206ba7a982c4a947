//! The lock's Lua scripts, and the keys and arguments each is called with.
//! Redis runs a script without interleaving any other command: each one is
//! an atomic step. The scripts live in `lua/`; the ones that grant, renew or
//! release start with `lua/common.lua`, the steps they share.

use std::sync::OnceLock;
use std::time::Duration;

use redis::{Script, ScriptInvocation};

use super::keys::{channel, deadlines_key, fence_key, lock_key, queue_key};
use crate::Token;

/// A script that starts with the shared steps of `lua/common.lua`.
macro_rules! with_common {
    ($body:literal) => {
        concat!(include_str!("lua/common.lua"), include_str!($body))
    };
}

/// `KEYS[1]` lock, `KEYS[2]` fence; `ARGV[1]` owner (`<id> <client id>`),
/// `ARGV[2]` TTL in ms. The non-fair grant: `{1, token}` when granted (or
/// re-entered by the same owner, with the same token), `{0, pttl}` when
/// somebody else holds the lock.
pub const GRANT_SCRIPT: &str = with_common!("lua/grant.lua");

/// `KEYS[1]` lock, `KEYS[2]` fence, `KEYS[3]` queue, `KEYS[4]` deadlines;
/// `ARGV[1]` owner, `ARGV[2]` TTL in ms, `ARGV[3]` waiter id, `ARGV[4]` how
/// long the waiter's place lasts in ms (0: do not queue, a try-lock). The
/// fair grant: re-entry by the owner first (no queueing); a free lock with no
/// queue is granted at once (the uncontended path: one `EXISTS` more than the
/// non-fair grant); else drop the waiters whose place lapsed (server clock),
/// then grant only if the lock is free and the caller is the first waiter.
/// Refused: the caller takes (or renews) its place at the tail, and the
/// answer is `{0, ms}`: the holder's `PTTL`, or, when the lock is free but
/// another waiter is first, how long that waiter's place still lasts.
pub const FAIR_GRANT_SCRIPT: &str = with_common!("lua/fair_grant.lua");

/// `KEYS[1]` lock; `ARGV[1]` owner, `ARGV[2]` token, `ARGV[3]` TTL in ms.
/// Returns 1 when extended (never shortened), 0 when the hash is gone or
/// belongs to another grant.
pub const RENEW_SCRIPT: &str = with_common!("lua/renew.lua");

/// `KEYS[1]` lock, `KEYS[2]` queue, `KEYS[3]` deadlines; `ARGV[1]` owner,
/// `ARGV[2]` token, `ARGV[3]` the channel. Returns 0 when the hash is gone or
/// belongs to another grant (nothing is touched), 2 when the owner still
/// holds it (a reentrant count went down), 1 when released: the hash is
/// deleted and the channel told, in the same step, who is first in the queue
/// (`*` when nobody waits there).
pub const RELEASE_SCRIPT: &str = with_common!("lua/release.lua");

/// `KEYS[1]` lock, `KEYS[2]` queue, `KEYS[3]` deadlines; `ARGV[1]` waiter
/// id, `ARGV[2]` channel. A fair waiter that gives up leaves the queue; if it
/// was first and the lock is free, the next waiter is told.
pub const LEAVE_SCRIPT: &str = include_str!("lua/leave.lua");

struct Scripts {
    grant: Script,
    fair_grant: Script,
    renew: Script,
    release: Script,
    leave: Script,
}

/// Hashed once per process: every call goes out as `EVALSHA`.
fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        grant: Script::new(GRANT_SCRIPT),
        fair_grant: Script::new(FAIR_GRANT_SCRIPT),
        renew: Script::new(RENEW_SCRIPT),
        release: Script::new(RELEASE_SCRIPT),
        leave: Script::new(LEAVE_SCRIPT),
    })
}

/// `script` on the keys `keys` make of lock `name`, with `args`.
fn invoke(
    script: &'static Script,
    name: &str,
    keys: &[fn(&str) -> String],
    args: &[&str],
) -> ScriptInvocation<'static> {
    let mut inv = script.prepare_invoke();
    for key in keys {
        inv.key(key(name));
    }
    for arg in args {
        inv.arg(*arg);
    }
    inv
}

fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

/// [`GRANT_SCRIPT`] for lock `name`.
pub(super) fn grant(name: &str, owner: &str, ttl: Duration) -> ScriptInvocation<'static> {
    let keys = [lock_key, fence_key];
    invoke(&scripts().grant, name, &keys, &[owner, &ms(ttl)])
}

/// [`FAIR_GRANT_SCRIPT`] for lock `name`; `place` zero for a try-lock.
pub(super) fn fair_grant(
    name: &str,
    owner: &str,
    ttl: Duration,
    waiter: &str,
    place: Duration,
) -> ScriptInvocation<'static> {
    let keys = [lock_key, fence_key, queue_key, deadlines_key];
    let args = [owner, &ms(ttl), waiter, &ms(place)];
    invoke(&scripts().fair_grant, name, &keys, &args)
}

/// [`RENEW_SCRIPT`] for the grant of `token` to `owner`.
pub(super) fn renew(
    name: &str,
    owner: &str,
    token: Token,
    ttl: Duration,
) -> ScriptInvocation<'static> {
    let args = [owner, &token.get().to_string(), &ms(ttl)];
    invoke(&scripts().renew, name, &[lock_key], &args)
}

/// [`RELEASE_SCRIPT`] for the grant of `token` to `owner`.
pub(super) fn release(name: &str, owner: &str, token: Token) -> ScriptInvocation<'static> {
    let keys = [lock_key, queue_key, deadlines_key];
    let args = [owner, &token.get().to_string(), &channel(name)];
    invoke(&scripts().release, name, &keys, &args)
}

/// [`LEAVE_SCRIPT`] for fair waiter `waiter` of lock `name`.
pub(super) fn leave(name: &str, waiter: &str) -> ScriptInvocation<'static> {
    let keys = [lock_key, queue_key, deadlines_key];
    invoke(&scripts().leave, name, &keys, &[waiter, &channel(name)])
}
