//! Proxies that stand between a client and a real server and misbehave on
//! purpose: the network faults that tc netem would make, in user space.
//!
//! - [`delay`]: any TCP stream, client→server bytes passed, delayed or held
//!   ([`DelayProxy`]).
//! - [`zookeeper`]: ZooKeeper's framing, one reply lost or one request sent
//!   twice ([`ZooKeeperProxy`]).

pub mod delay;
pub mod zookeeper;

pub use delay::{via_proxy, DelayProxy, Mode};
pub use zookeeper::{Op, ZooKeeperProxy};
