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

use crate::netns::{Forwarder, NetNs, NsConnector};
use crate::process::{temp_dir, ServiceProcess};
use crate::service::Member;
use crate::zookeeper::node::NodeConfig;
use crate::zookeeper::Ensemble;

const CLIENT_PORT: u16 = 2181;

/// Where each server runs: its own namespace behind the hub, reached from
/// 127.0.0.1 through a forwarder.
pub struct Namespaces {
    hub: NetNs,
    /// Per server: its namespace, and its forwarder (the port of its [`Member`]).
    hosts: Vec<(NetNs, Forwarder)>,
    cut: Option<usize>,
}

/// Three ZooKeeper servers on three namespaces behind one router namespace.
pub type ZooKeeperHosts = Ensemble<Namespaces>;

/// The address of server `i` (0-based) inside the namespaces.
fn server_ip(i: usize) -> String {
    format!("10.77.{}.2", i + 1)
}

impl Ensemble<Namespaces> {
    /// Build the namespaces and links, start the three servers, and wait
    /// until one leads and another follows.
    pub async fn start() -> Self {
        let dir = temp_dir("zk-hosts");
        let hub = NetNs::new("zk-hub").expect("hub namespace");
        hub.run("sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"])
            .expect("ip_forward in the hub");
        let connector = NsConnector::new(&hub).expect("connector into the hub");
        let servers: String = (0..3)
            .map(|i| format!("server.{}={}:2888:3888\n", i + 1, server_ip(i)))
            .collect();
        let mut nodes = vec![];
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
            let recipe = ns.wrap(
                NodeConfig {
                    client_address: &server_ip(i),
                    client_port: CLIENT_PORT,
                    ensemble: Some((n, &servers)),
                    super_digest: None,
                }
                .write(&dir.path().join(format!("zk{n}"))),
            );
            let process = ServiceProcess::spawn(format!("zk{n}"), recipe).expect("spawn zookeeper");
            let target: SocketAddr = format!("{}:{CLIENT_PORT}", server_ip(i))
                .parse()
                .expect("server address");
            let forwarder = Forwarder::start(connector.clone(), target)
                .await
                .expect("forwarder");
            nodes.push(Member {
                process,
                port: forwarder.port(),
            });
            hosts.push((ns, forwarder));
        }
        let place = Namespaces {
            hub,
            hosts,
            cut: None,
        };
        Self::assemble(nodes, place, dir, Duration::from_secs(90)).await
    }

    /// Cut server `i` off from the other two: the hub drops every packet it
    /// would route between `i`'s link and theirs, both ways. Clients keep
    /// reaching every server through their forwarders (that traffic starts in
    /// the hub and is not routed). One partition at a time.
    pub fn partition(&mut self, i: usize) -> std::io::Result<()> {
        let place = self.place_mut();
        assert!(place.cut.is_none(), "already partitioned");
        place.forward_rules("-I", i)?;
        place.cut = Some(i);
        Ok(())
    }

    /// Undo [`ZooKeeperHosts::partition`].
    pub fn heal(&mut self) -> std::io::Result<()> {
        let place = self.place_mut();
        if let Some(i) = place.cut.take() {
            place.forward_rules("-D", i)?;
        }
        Ok(())
    }

    /// The namespace of server `i` (for `ip`/`iptables` there).
    pub fn namespace(&self, i: usize) -> &NetNs {
        &self.place().hosts[i].0
    }
}

impl Namespaces {
    /// Insert (`-I`) or delete (`-D`) the hub's rules that drop what it
    /// routes to and from server `i`'s link.
    fn forward_rules(&self, action: &str, i: usize) -> std::io::Result<()> {
        let dev = format!("h{}", i + 1);
        for direction in ["-i", "-o"] {
            self.hub
                .iptables(&[action, "FORWARD", direction, &dev, "-j", "DROP"])?;
        }
        Ok(())
    }
}
