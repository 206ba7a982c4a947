//! The fault catalogue: every fault the chaos rows and the soak inject,
//! each in a file of its own, written once.
//!
//! A fault's `inject` does it and returns what undoes it, whose `heal` puts
//! things back (and says how long that took). When is the caller's choice: a
//! chaos row waits on the workers' events between the two, the soak on a
//! random delay. Faults a worker carries itself (its own pause at a step, its
//! clock) are first `arm`ed in its spec. A crash (`WorkerProc::crash`) and a
//! clock step have nothing to undo.
//!
//! | fault | file | on |
//! |---|---|---|
//! | a worker frozen, from outside or by itself at a step | [`pause`] | [`WorkerProc`](crate::procs::WorkerProc) |
//! | a worker's wall clock one hour ahead | [`clock_jump`] | the worker's libfaketime |
//! | everything a worker sends held (a delayed write, a cut from some servers) | [`held_link`] | a proxy per server |
//! | a service killed and started again | [`restart`] | anything [`Restartable`] |
//! | a gateway killed behind the balancer | [`gateway_kill`] | [`GatewayProc`](crate::procs::GatewayProc), [`Haproxy`](crate::Haproxy) |
//! | PostgreSQL failing over, the link cut first | [`postgres_failover`] | [`PostgresPair`](crate::PostgresPair) |
//! | a ZooKeeper server cut off from the other two | [`zookeeper_partition`] | [`ZooKeeperHosts`](crate::ZooKeeperHosts) |
//! | the ZooKeeper leader killed | [`zookeeper_leader_kill`] | [`ZooKeeperHosts`](crate::ZooKeeperHosts) |
//! | a Sentinel failover that loses a grant | [`sentinel_failover`] | [`SentinelGroup`](crate::SentinelGroup) |

use std::time::Duration;

pub mod clock_jump;
pub mod gateway_kill;
pub mod held_link;
pub mod pause;
pub mod postgres_failover;
pub mod restart;
pub mod sentinel_failover;
pub mod zookeeper_leader_kill;
pub mod zookeeper_partition;

pub use clock_jump::ClockJump;
pub use held_link::HeldLink;
pub use pause::{Paused, StopSelf};
pub use restart::Restartable;
pub use sentinel_failover::SentinelFailover;

/// How long a service may take to serve again after a heal, a restart or an
/// election, and a failover to complete.
pub const SERVICE_WAIT: Duration = Duration::from_secs(60);
