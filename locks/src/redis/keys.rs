//! The names of a lock's keys and channel (see the module docs, "Keys").
//! The braces are Redis Cluster hash tags: every key of a lock hashes to
//! the same slot.

/// The hash holding lock `name`'s holder while it is held.
pub fn lock_key(name: &str) -> String {
    format!("lock:{{{name}}}")
}

/// The key holding lock `name`'s fencing counter (never expires).
pub fn fence_key(name: &str) -> String {
    format!("fence:{{{name}}}")
}

/// The list of fair waiters of lock `name`, first in line first.
pub fn queue_key(name: &str) -> String {
    format!("queue:{{{name}}}")
}

/// The sorted set of fair waiters' place deadlines (server ms).
pub fn deadlines_key(name: &str) -> String {
    format!("deadlines:{{{name}}}")
}

/// The channel a release of lock `name` publishes on.
pub fn channel(name: &str) -> String {
    format!("released:{{{name}}}")
}
