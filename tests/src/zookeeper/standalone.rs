//! One standalone ZooKeeper server.

use std::path::Path;
use std::time::Duration;

use super::node::{mode, NodeConfig};
use crate::process::Recipe;
use crate::service::{Server, Service};

/// A standalone ZooKeeper server: what is its own (its `zoo.cfg`, a mode
/// from `srvr` as readiness). The rest is [`Server`]'s.
#[derive(Debug, Clone, Default)]
pub struct ZooKeeperService {
    /// See [`ZooKeeperService::with_super_digest`].
    super_digest: Option<String>,
}

impl ZooKeeperService {
    /// A server where the digest user `id` (`user:base64(sha1(user:password))`)
    /// passes every ACL (ZooKeeper's superDigest): an admin.
    pub fn with_super_digest(id: impl Into<String>) -> Self {
        Self {
            super_digest: Some(id.into()),
        }
    }
}

/// A standalone ZooKeeper server on a free port with its data in a temp dir.
pub type ZooKeeper = Server<ZooKeeperService>;

impl Service for ZooKeeperService {
    const NAME: &'static str = "zookeeper";
    const READY_WITHIN: Duration = Duration::from_secs(30);

    async fn prepare(&self, dir: &Path, port: u16) -> Recipe {
        NodeConfig {
            client_address: "127.0.0.1",
            client_port: port,
            ensemble: None,
            super_digest: self.super_digest.as_deref(),
        }
        .write(dir)
    }

    async fn probe(&self, port: u16) -> anyhow::Result<()> {
        mode(port).await?;
        Ok(())
    }
}

impl Server<ZooKeeperService> {
    /// A standalone server whose superuser is the digest user `id` (see
    /// [`ZooKeeperService::with_super_digest`]).
    pub async fn start_with_super_digest(id: impl Into<String>) -> Self {
        Self::launch(ZooKeeperService::with_super_digest(id)).await
    }

    /// The connect string the client takes: `127.0.0.1:PORT`.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }
}
