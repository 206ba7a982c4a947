//! A service SIGKILLed (every server of it) and started again: what it
//! forgets without persistence, and what clients see while it is down.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::procs::GatewayProc;
use crate::{MariaDb, Postgres, PostgresPair, Redis, ZooKeeper, ZooKeeperHosts};

/// A service the restart fault can take down and bring back.
pub trait Restartable {
    /// SIGKILL every server of it.
    fn crash(&mut self);
    /// Start every server again on its port and data, and wait until it serves.
    fn recover(&mut self) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Kill `service`.
pub fn kill<S: Restartable>(service: &mut S) -> Down {
    service.crash();
    Down { at: Instant::now() }
}

/// What undoes a kill: start the service again.
#[must_use = "the service stays down until healed"]
pub struct Down {
    /// When it was killed.
    pub at: Instant,
}

impl Down {
    /// Start it again; how long it took to serve.
    pub async fn heal<S: Restartable>(self, service: &mut S) -> anyhow::Result<Duration> {
        let start = Instant::now();
        service.recover().await?;
        Ok(start.elapsed())
    }
}

/// The single-server services: `kill` is their crash, and `start_again`
/// waits until they serve (or panics with their log).
macro_rules! restartable_by_kill_and_start_again {
    ($($service:ty),*) => {$(
        impl Restartable for $service {
            fn crash(&mut self) {
                self.kill();
            }

            async fn recover(&mut self) -> anyhow::Result<()> {
                self.start_again().await;
                Ok(())
            }
        }
    )*};
}

restartable_by_kill_and_start_again!(Redis, ZooKeeper, Postgres, MariaDb);

/// The whole ensemble (one server at a time is the leader kill).
impl Restartable for ZooKeeperHosts {
    fn crash(&mut self) {
        (0..self.len()).for_each(|i| self.kill(i));
    }

    async fn recover(&mut self) -> anyhow::Result<()> {
        for i in 0..self.len() {
            self.process(i).start()?;
        }
        self.wait_all_serving(super::SERVICE_WAIT)
            .await
            .map_err(|e| anyhow::anyhow!("the ensemble after the restart: {e}"))
    }
}

/// The primary only; it keeps its role (a failover is
/// [`super::postgres_failover`]).
impl Restartable for PostgresPair {
    fn crash(&mut self) {
        self.kill_primary();
    }

    async fn recover(&mut self) -> anyhow::Result<()> {
        self.start_primary_again().await;
        Ok(())
    }
}

impl Restartable for GatewayProc {
    fn crash(&mut self) {
        GatewayProc::crash(self);
    }

    async fn recover(&mut self) -> anyhow::Result<()> {
        self.start().await
    }
}
