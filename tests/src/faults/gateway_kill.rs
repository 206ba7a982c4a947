//! One of the gateways behind HAProxy SIGKILLed; healed by starting it again
//! on its port, once the balancer counts it up again.

use std::time::{Duration, Instant};

use crate::procs::{now_ms, GatewayProc};
use crate::Haproxy;

use super::restart::{self, Down};

/// How long the balancer's health check may take to mark a gateway down.
const MARK_DOWN_WAIT: Duration = Duration::from_secs(15);
/// How long the balancer may take to count every gateway up again.
const UP_WAIT: Duration = Duration::from_secs(30);

/// Kill `gateway`, the balancer's `gw{index + 1}`, and wait until the
/// balancer marks it down.
pub async fn inject(gateway: &mut GatewayProc, balancer: &Haproxy, index: usize) -> GatewayDown {
    let down = restart::kill(gateway);
    let killed_at = now_ms();
    let marked = balancer
        .wait_down(&format!("gw{}", index + 1), MARK_DOWN_WAIT)
        .await;
    GatewayDown {
        killed_at,
        marked_down: marked.map(|()| down.at.elapsed()),
        down,
    }
}

/// What undoes a gateway kill: start it again.
#[must_use = "the gateway stays down until healed"]
pub struct GatewayDown {
    /// Unix ms of the kill.
    pub killed_at: i64,
    /// How long after the kill the balancer marked it down, or why it never did.
    pub marked_down: Result<Duration, String>,
    down: Down,
}

impl GatewayDown {
    /// When it was killed.
    pub fn at(&self) -> Instant {
        self.down.at
    }

    /// Start it again and wait until the balancer counts `gateways` up.
    pub async fn heal(
        self,
        gateway: &mut GatewayProc,
        balancer: &Haproxy,
        gateways: usize,
    ) -> anyhow::Result<()> {
        self.down.heal(gateway).await?;
        balancer
            .wait_up(gateways, UP_WAIT)
            .await
            .map_err(|e| anyhow::anyhow!("balancer: {e}"))
    }
}
