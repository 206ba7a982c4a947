//! What a soak runs, and the kinds of fault it draws from.

use std::time::Duration;

use serde::Serialize;

use crate::backends::Backend;

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    pub seed: u64,
    /// Faults are injected until then; the workers stop starting edits then.
    pub duration: Duration,
    /// Fenced backends only (Redlock has no token to check).
    pub backends: Vec<Backend>,
    pub pages_per_backend: usize,
    pub workers_per_page: usize,
    /// One ZooKeeper server instead of the three-node ensemble: then the
    /// ensemble's faults (`zookeeper-partition`, `zookeeper-leader-kill`)
    /// are not in the catalogue.
    pub zookeeper_standalone: bool,
}

impl SoakConfig {
    pub fn new(seed: u64, duration: Duration) -> Self {
        Self {
            seed,
            duration,
            // The Sentinel group is not one server to kill and restart:
            // its failures are the chaos rows `sentinel-failover*`.
            backends: Backend::ALL
                .into_iter()
                .filter(|b| b.mints_tokens() && *b != Backend::RedisSentinel)
                .collect(),
            pages_per_backend: 2,
            workers_per_page: 2,
            zookeeper_standalone: false,
        }
    }
}

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGSTOP a random editing worker for 0.5–4 s (past its 2 s TTL or not).
    PauseWorker,
    /// SIGKILL a random editing worker; a new one takes its place.
    KillWorker,
    /// A worker takes the lock, reads, passes its lost-lock check and freezes
    /// before its PUT until another worker has written the page: only the
    /// fence can refuse its write.
    GcPauseWriting,
    /// A worker whose network (to the balancer and to its lock server) holds
    /// everything it sends from its read on, until another worker has
    /// written the page.
    DelayedWrite,
    /// A worker's wall clock (and, half the time, its monotonic clock) jumps
    /// one hour while it holds the lock (libfaketime).
    ClockJump,
    /// A backend's lock service is SIGKILLed and started again 0.5–2 s
    /// later: for ZooKeeper the whole ensemble (all three servers; one
    /// server at a time is `ZookeeperLeaderKill`).
    LockRestart,
    /// The PostgreSQL primary is SIGKILLed and started again 0.5–2 s later.
    PostgresRestart,
    /// The replication link is cut for 0–0.8 s, the primary SIGKILLed, the
    /// standby promoted, and a new standby built from it.
    PostgresFailover,
    /// One of the two gateways is SIGKILLed, and started again 0.5–3 s after
    /// the balancer marked it down.
    GatewayKill,
    /// One ZooKeeper server, the one a random pinned worker talks to (leader
    /// or follower, whichever it is), is cut off from the other two right
    /// after that worker's next grant (or after 10 s without one) for 0.5–4 s
    /// (the session timeout is 2 s), then healed; the next fault waits until
    /// all three serve again. Ensemble only.
    ZookeeperPartition,
    /// The ensemble's leader (found with `srvr`) is SIGKILLed and started
    /// again 0.5–3 s after the kill, once the other two have elected a new
    /// leader. Ensemble only.
    ZookeeperLeaderKill,
}

impl Fault {
    pub const ALL: [Fault; 11] = [
        Fault::PauseWorker,
        Fault::KillWorker,
        Fault::GcPauseWriting,
        Fault::DelayedWrite,
        Fault::ClockJump,
        Fault::LockRestart,
        Fault::PostgresRestart,
        Fault::PostgresFailover,
        Fault::GatewayKill,
        Fault::ZookeeperPartition,
        Fault::ZookeeperLeaderKill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::PauseWorker => "pause-worker",
            Fault::KillWorker => "kill-worker",
            Fault::GcPauseWriting => "gc-pause-writing",
            Fault::DelayedWrite => "delayed-write",
            Fault::ClockJump => "clock-jump",
            Fault::LockRestart => "lock-restart",
            Fault::PostgresRestart => "postgres-restart",
            Fault::PostgresFailover => "postgres-failover",
            Fault::GatewayKill => "gateway-kill",
            Fault::ZookeeperPartition => "zookeeper-partition",
            Fault::ZookeeperLeaderKill => "zookeeper-leader-kill",
        }
    }

    /// Whether the fault needs the ZooKeeper ensemble.
    pub fn needs_ensemble(self) -> bool {
        matches!(self, Fault::ZookeeperPartition | Fault::ZookeeperLeaderKill)
    }
}
