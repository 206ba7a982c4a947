//! Three ZooKeeper servers forming one ensemble (quorum 2), for failover
//! tests: [`Ensemble`] holds what every ensemble does (modes, the leader,
//! waiting for a quorum, kill and start again), whatever the servers run in;
//! [`Loopback`] runs them on 127.0.0.1 ([`ZooKeeperEnsemble`]),
//! [`crate::zookeeper_hosts`] on three network namespaces.

use std::time::Duration;

use tempfile::TempDir;

use super::node::{self, NodeConfig};
use crate::process::{free_port, temp_dir, wait_until, ServiceProcess};
use crate::service::{logs, ready_or_panic, Member};

/// Three servers and what they run in (`P`). Every server is killed on drop,
/// before what they run in goes.
pub struct Ensemble<P> {
    // First: fields drop in order, and the servers go before their network.
    nodes: Vec<Member>,
    place: P,
    _dir: TempDir,
}

impl<P> Ensemble<P> {
    /// The ensemble of `nodes` (just spawned), once a leader serves with a
    /// follower.
    pub(crate) async fn assemble(
        nodes: Vec<Member>,
        place: P,
        dir: TempDir,
        within: Duration,
    ) -> Self {
        let me = Self {
            nodes,
            place,
            _dir: dir,
        };
        me.wait_serving(within).await;
        me
    }

    pub(crate) fn place(&self) -> &P {
        &self.place
    }

    pub(crate) fn place_mut(&mut self) -> &mut P {
        &mut self.place
    }

    /// Every server: `127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn connect_string(&self) -> String {
        (0..self.nodes.len())
            .map(|i| self.connect_string_to(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Server `i` alone: a client that can only ever talk to that server.
    pub fn connect_string_to(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.nodes[i].port)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The port on 127.0.0.1 where clients reach server `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    pub fn process(&mut self, i: usize) -> &mut ServiceProcess {
        &mut self.nodes[i].process
    }

    /// What server `i` says about itself (`srvr`): `leader`, `follower`, or
    /// `None` when it does not serve (no quorum, down, cut off).
    pub async fn mode(&self, i: usize) -> Option<String> {
        node::mode(self.nodes[i].port).await.ok()
    }

    /// The index of the server that leads now, if one does.
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.nodes.len() {
            if self.mode(i).await.as_deref() == Some("leader") {
                return Some(i);
            }
        }
        None
    }

    /// Wait until a leader serves with at least one follower (a quorum);
    /// the leader's index.
    pub async fn wait_serving(&self, timeout: Duration) -> usize {
        let probe = || async {
            let mut leader = None;
            let mut serving = 0;
            for i in 0..self.nodes.len() {
                match self.mode(i).await.as_deref() {
                    Some("leader") => {
                        leader = Some(i);
                        serving += 1;
                    }
                    Some("follower") => serving += 1,
                    _ => {}
                }
            }
            match leader {
                Some(l) if serving >= 2 => Ok(l),
                _ => Err(format!("leader {leader:?}, {serving} serving")),
            }
        };
        ready_or_panic("zookeeper ensemble", timeout, probe, || self.logs(30)).await
    }

    /// Wait until all three serve again (after a heal or a restart).
    pub async fn wait_all_serving(&self, timeout: Duration) -> Result<(), String> {
        wait_until(timeout, || async {
            for i in 0..self.nodes.len() {
                self.serving(i).await?;
            }
            Ok(())
        })
        .await
    }

    /// `Ok` while server `i` leads or follows.
    async fn serving(&self, i: usize) -> Result<(), String> {
        match self.mode(i).await.as_deref() {
            Some("leader" | "follower") => Ok(()),
            other => Err(format!(
                "zk{} (port {}) is {other:?}",
                i + 1,
                self.nodes[i].port
            )),
        }
    }

    /// SIGKILL server `i` (a crash).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].process.kill();
    }

    /// Start server `i` again (same ports, config and data) and wait until
    /// it serves.
    pub async fn start_again(&mut self, i: usize) {
        self.nodes[i]
            .process
            .start()
            .expect("restart zookeeper server");
        let what = format!("zookeeper server {}", i + 1);
        ready_or_panic(
            &what,
            Duration::from_secs(60),
            || self.serving(i),
            || self.logs(30),
        )
        .await;
    }

    /// The last `n` lines of every server's log.
    pub fn logs(&self, n: usize) -> String {
        logs(self.nodes.iter().map(|m| &m.process), n)
    }
}

/// Servers on 127.0.0.1, each with its own client, quorum and election ports.
pub struct Loopback;

/// Three ZooKeeper servers on one machine forming one ensemble (quorum 2),
/// each with its own ports and data dir.
pub type ZooKeeperEnsemble = Ensemble<Loopback>;

impl Ensemble<Loopback> {
    /// Start three servers and wait until one leads and another follows.
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// [`start`](Self::start), every server with the digest user `id` as its
    /// superuser (see [`super::ZooKeeperService::with_super_digest`]).
    pub async fn start_with_super_digest(id: &str) -> Self {
        Self::start_with(Some(id)).await
    }

    async fn start_with(super_digest: Option<&str>) -> Self {
        let dir = temp_dir("zk-ensemble");
        let ports: Vec<(u16, u16, u16)> = (0..3)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer, election))| {
                format!("server.{}=127.0.0.1:{peer}:{election}\n", i + 1)
            })
            .collect();
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, &(client_port, _, _))| {
                let id = i + 1;
                let recipe = NodeConfig {
                    client_address: "127.0.0.1",
                    client_port,
                    ensemble: Some((id, &servers)),
                    super_digest,
                }
                .write(&dir.path().join(format!("zk{id}")));
                Member {
                    process: ServiceProcess::spawn(format!("zookeeper-{id}"), recipe)
                        .expect("spawn zookeeper"),
                    port: client_port,
                }
            })
            .collect();
        Self::assemble(nodes, Loopback, dir, Duration::from_secs(60)).await
    }
}
