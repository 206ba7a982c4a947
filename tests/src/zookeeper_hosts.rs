//! A three-node ZooKeeper ensemble whose servers each run on their own
//! "host": a network namespace of their own, linked to a router namespace
//! (the hub) by a veth pair. That makes a real network partition possible:
//! iptables rules in the hub drop the traffic between one server and the
//! other two, while the server itself keeps running and keeps its clients.
//!
//! ```text
//!   test process (workers, 127.0.0.1) ── Forwarder ports ──┐
//!                                                          hub (router, NsConnector)
//!        10.77.1.2 zk1 ── h1 ─┤    10.77.2.2 zk2 ── h2 ─┤    10.77.3.2 zk3 ── h3 ─┘
//! ```
//!
//! Clients in the test's own namespace reach each server through a
//! [`Forwarder`] on 127.0.0.1, whose connections are opened from the hub; a
//! partition ([`ZooKeeperHosts::partition`]) drops only the forwarded traffic
//! between the server's link and the other servers' links, so a client of
//! the cut-off server stays connected to it (the minority side of the
//! partition) unless it moves to another server itself. The 10.77.0.0/16
//! addresses exist only inside these namespaces, which vanish with the test
//! (see [`crate::netns`]). Needs root.

use std::net::SocketAddr;
use std::time::Duration;

use tempfile::TempDir;

use crate::netns::{Forwarder, NetNs, NsConnector};
use crate::process::{find_binary, wait_until, Recipe, ServiceProcess};
use crate::zookeeper::{four_letter, java_args};

const CLIENT_PORT: u16 = 2181;

struct Host {
    ns: NetNs,
    process: ServiceProcess,
    forwarder: Forwarder,
}

/// Three ZooKeeper servers on three namespaces behind one router namespace.
pub struct ZooKeeperHosts {
    hosts: Vec<Host>,
    hub: NetNs,
    cut: Option<usize>,
    _dir: TempDir,
}

/// The address of server `i` (0-based) inside the namespaces.
fn server_ip(i: usize) -> String {
    format!("10.77.{}.2", i + 1)
}

impl ZooKeeperHosts {
    /// Build the namespaces and links, start the three servers, and wait
    /// until one leads and the other two follow.
    pub async fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("harness-zk-hosts-")
            .tempdir()
            .expect("temp dir");
        let hub = NetNs::new("zk-hub").expect("hub namespace");
        hub.run("sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"])
            .expect("ip_forward in the hub");
        let connector = NsConnector::new(&hub).expect("connector into the hub");
        let servers: String = (0..3)
            .map(|i| format!("server.{}={}:2888:3888\n", i + 1, server_ip(i)))
            .collect();
        let mut hosts = vec![];
        for i in 0..3 {
            let ns = NetNs::new(&format!("zk{}", i + 1)).expect("server namespace");
            let n = i + 1;
            hub.link_to(
                &ns,
                (&format!("h{n}"), &format!("10.77.{n}.1/24")),
                ("eth0", &format!("{}/24", server_ip(i))),
            )
            .expect("veth to the hub");
            ns.ip(&["route", "add", "default", "via", &format!("10.77.{n}.1")])
                .expect("default route via the hub");
            let node_dir = dir.path().join(format!("zk{n}"));
            let data = node_dir.join("data");
            std::fs::create_dir_all(&data).expect("zk data dir");
            std::fs::write(data.join("myid"), format!("{n}\n")).expect("write myid");
            let cfg = node_dir.join("zoo.cfg");
            std::fs::write(
                &cfg,
                format!(
                    "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={}\n\
                     clientPort={CLIENT_PORT}\nclientPortAddress={}\n\
                     admin.enableServer=false\n4lw.commands.whitelist=*\n\
                     minSessionTimeout=1000\nmaxSessionTimeout=60000\n{servers}",
                    data.display(),
                    server_ip(i)
                ),
            )
            .expect("write zoo.cfg");
            let recipe = ns.wrap(Recipe {
                program: find_binary("java", &["/usr/bin"]),
                args: java_args("org.apache.zookeeper.server.quorum.QuorumPeerMain", &cfg),
                env: vec![],
                user: None,
                log: node_dir.join("zookeeper.log"),
            });
            let process = ServiceProcess::spawn(format!("zk{n}"), recipe).expect("spawn zookeeper");
            let target: SocketAddr = format!("{}:{CLIENT_PORT}", server_ip(i))
                .parse()
                .expect("server address");
            let forwarder = Forwarder::start(connector.clone(), target)
                .await
                .expect("forwarder");
            hosts.push(Host {
                ns,
                process,
                forwarder,
            });
        }
        let me = Self {
            hosts,
            hub,
            cut: None,
            _dir: dir,
        };
        me.wait_serving(Duration::from_secs(90)).await;
        me
    }

    /// Every server, through its forwarder: what a client's connect string takes.
    pub fn connect_string(&self) -> String {
        (0..self.hosts.len())
            .map(|i| self.connect_string_to(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Server `i` alone: a client that can only ever talk to that server.
    pub fn connect_string_to(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.hosts[i].forwarder.port())
    }

    /// The forwarder port of server `i` (on 127.0.0.1).
    pub fn port(&self, i: usize) -> u16 {
        self.hosts[i].forwarder.port()
    }

    pub fn ports(&self) -> Vec<u16> {
        self.hosts.iter().map(|h| h.forwarder.port()).collect()
    }

    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    pub fn process(&mut self, i: usize) -> &mut ServiceProcess {
        &mut self.hosts[i].process
    }

    /// What server `i` says about itself (`srvr`): `leader`, `follower`, or
    /// `None` when it does not serve (no quorum, down, cut off).
    pub async fn mode(&self, i: usize) -> Option<String> {
        let answer = four_letter(self.port(i), "srvr").await.ok()?;
        answer
            .lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_string())
    }

    /// The index of the server that leads now, found with `srvr`.
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.hosts.len() {
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
            for i in 0..self.hosts.len() {
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
        match wait_until(timeout, probe).await {
            Ok(l) => l,
            Err(e) => panic!(
                "zookeeper hosts not serving after {timeout:?}: {e}\n{}",
                self.logs(30)
            ),
        }
    }

    /// Wait until all three serve again (after a heal or a restart).
    pub async fn wait_all_serving(&self, timeout: Duration) -> Result<(), String> {
        wait_until(timeout, || async {
            for i in 0..self.hosts.len() {
                match self.mode(i).await.as_deref() {
                    Some("leader" | "follower") => {}
                    other => return Err(format!("zk{} is {other:?}", i + 1)),
                }
            }
            Ok(())
        })
        .await
    }

    /// Cut server `i` off from the other two: the hub drops every packet it
    /// would route between `i`'s link and theirs, both ways. Clients keep
    /// reaching every server through their forwarders (that traffic starts in
    /// the hub and is not routed). One partition at a time.
    pub fn partition(&mut self, i: usize) -> std::io::Result<()> {
        assert!(self.cut.is_none(), "already partitioned");
        let dev = format!("h{}", i + 1);
        for rule in [["-i", &dev], ["-o", &dev]] {
            self.hub
                .iptables(&["-I", "FORWARD", rule[0], rule[1], "-j", "DROP"])?;
        }
        self.cut = Some(i);
        Ok(())
    }

    /// Undo [`ZooKeeperHosts::partition`].
    pub fn heal(&mut self) -> std::io::Result<()> {
        if let Some(i) = self.cut.take() {
            let dev = format!("h{}", i + 1);
            for rule in [["-i", &dev], ["-o", &dev]] {
                self.hub
                    .iptables(&["-D", "FORWARD", rule[0], rule[1], "-j", "DROP"])?;
            }
        }
        Ok(())
    }

    /// SIGKILL server `i`.
    pub fn kill(&mut self, i: usize) {
        self.hosts[i].process.kill();
    }

    /// Start server `i` again (same namespace, config and data) and wait
    /// until it serves.
    pub async fn start_again(&mut self, i: usize) {
        self.hosts[i]
            .process
            .start()
            .expect("restart zookeeper server");
        let probe = || async {
            match self.mode(i).await.as_deref() {
                Some("leader" | "follower") => Ok(()),
                other => Err(format!("zk{}: {other:?}", i + 1)),
            }
        };
        if let Err(e) = wait_until(Duration::from_secs(60), probe).await {
            panic!("{e}\n{}", self.logs(30));
        }
    }

    /// The namespace of server `i` (for `ip`/`iptables` there).
    pub fn namespace(&self, i: usize) -> &NetNs {
        &self.hosts[i].ns
    }

    pub fn logs(&self, n: usize) -> String {
        self.hosts
            .iter()
            .map(|h| {
                format!(
                    "--- {} log ---\n{}",
                    h.process.name(),
                    h.process.log_tail(n)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for ZooKeeperHosts {
    fn drop(&mut self) {
        // The servers go first (ServiceProcess drop), then the namespaces with
        // their links and rules; nothing outside them was touched.
        for h in &mut self.hosts {
            h.process.kill();
        }
    }
}
