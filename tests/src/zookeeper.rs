//! A private ZooKeeper 3.8 from Debian's `zookeeper` package: standalone
//! ([`ZooKeeper`]) or a three-node ensemble ([`ZooKeeperEnsemble`]).

use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::process::{find_binary, free_port, wait_until, Recipe, ServiceProcess};

/// A standalone ZooKeeper server on a free port with its data in a temp dir.
pub struct ZooKeeper {
    process: ServiceProcess,
    port: u16,
    _dir: TempDir,
}

impl ZooKeeper {
    pub async fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("harness-zk-")
            .tempdir_in(crate::process::scratch_dir())
            .expect("temp dir");
        let port = free_port();
        std::fs::create_dir_all(dir.path().join("data")).expect("zk data dir");
        let cfg = dir.path().join("zoo.cfg");
        std::fs::write(
            &cfg,
            format!(
                "tickTime=500\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=*\n\
                 minSessionTimeout=1000\nmaxSessionTimeout=60000\n",
                dir.path().join("data").display()
            ),
        )
        .expect("write zoo.cfg");
        let recipe = Recipe {
            program: find_binary("java", &["/usr/bin"]),
            args: java_args("org.apache.zookeeper.server.ZooKeeperServerMain", &cfg),
            env: vec![],
            user: None,
            log: dir.path().join("zookeeper.log"),
        };
        let process = ServiceProcess::spawn("zookeeper", recipe).expect("spawn zookeeper");
        let mut me = Self {
            process,
            port,
            _dir: dir,
        };
        me.wait_ready().await;
        me
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connect string the client takes: `127.0.0.1:PORT`.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn process(&mut self) -> &mut ServiceProcess {
        &mut self.process
    }

    pub fn kill(&mut self) {
        self.process.kill();
    }

    pub async fn start_again(&mut self) {
        self.process.start().expect("restart zookeeper");
        self.wait_ready().await;
    }

    async fn wait_ready(&mut self) {
        let port = self.port;
        // `ruok` answers `imok` as soon as the process runs, before it serves
        // sessions; `srvr` reports a mode only once it does.
        let serving = || async move {
            let answer = four_letter(port, "srvr").await?;
            if answer.contains("Mode: ") {
                Ok(())
            } else {
                Err(std::io::Error::other(format!(
                    "not serving yet: {answer:?}"
                )))
            }
        };
        if let Err(e) = wait_until(Duration::from_secs(30), serving).await {
            panic!(
                "zookeeper did not serve on port {port}: {e}\n--- log ---\n{}",
                self.process.log_tail(40)
            );
        }
    }
}

/// The JVM arguments that run a ZooKeeper main class with Debian's jars.
pub fn java_args(main_class: &str, cfg: &std::path::Path) -> Vec<String> {
    vec![
        "-Xmx256m".into(),
        "-XX:+UseSerialGC".into(),
        "-Dzookeeper.log.dir=.".into(),
        "-Dzookeeper.root.logger=INFO,CONSOLE".into(),
        "-cp".into(),
        "/usr/share/java/*:/etc/zookeeper/conf".into(),
        main_class.into(),
        cfg.to_string_lossy().into_owned(),
    ]
}

/// Send a four-letter word (`ruok`, `srvr`, `stat`...) and return the answer.
/// `ruok` succeeds only on `imok`.
///
/// Bounded at two seconds: a server that is still starting can accept the
/// connection and then neither answer nor close it (seen once under load:
/// the probe, and the test awaiting it, hung for good).
pub async fn four_letter(port: u16, word: &str) -> std::io::Result<String> {
    const LIMIT: std::time::Duration = std::time::Duration::from_secs(2);
    let exchange = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(word.as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    let out = tokio::time::timeout(LIMIT, exchange).await.map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{word} on port {port}: no answer within {LIMIT:?}"),
        )
    })??;
    if word == "ruok" && out != "imok" {
        return Err(std::io::Error::other(format!("ruok answered {out:?}")));
    }
    Ok(out)
}

/// Three ZooKeeper servers on one machine forming one ensemble (quorum 2),
/// each with its own ports and data dir, for failover tests.
pub struct ZooKeeperEnsemble {
    nodes: Vec<EnsembleNode>,
    _dir: TempDir,
}

struct EnsembleNode {
    process: ServiceProcess,
    port: u16,
}

impl ZooKeeperEnsemble {
    /// Start three servers and wait until one leads and the other two follow.
    pub async fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("harness-zk-ensemble-")
            .tempdir_in(crate::process::scratch_dir())
            .expect("temp dir");
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
        let mut nodes = Vec::new();
        for (i, (client_port, _, _)) in ports.iter().enumerate() {
            let id = i + 1;
            let node_dir = dir.path().join(format!("zk{id}"));
            let data = node_dir.join("data");
            std::fs::create_dir_all(&data).expect("zk data dir");
            std::fs::write(data.join("myid"), format!("{id}\n")).expect("write myid");
            let cfg = node_dir.join("zoo.cfg");
            std::fs::write(
                &cfg,
                format!(
                    "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={}\n\
                     clientPort={client_port}\nclientPortAddress=127.0.0.1\n\
                     admin.enableServer=false\n4lw.commands.whitelist=*\n\
                     minSessionTimeout=1000\nmaxSessionTimeout=60000\n{servers}",
                    data.display()
                ),
            )
            .expect("write zoo.cfg");
            let recipe = Recipe {
                program: find_binary("java", &["/usr/bin"]),
                args: java_args("org.apache.zookeeper.server.quorum.QuorumPeerMain", &cfg),
                env: vec![],
                user: None,
                log: node_dir.join("zookeeper.log"),
            };
            let process =
                ServiceProcess::spawn(format!("zookeeper-{id}"), recipe).expect("spawn zookeeper");
            nodes.push(EnsembleNode {
                process,
                port: *client_port,
            });
        }
        let me = Self { nodes, _dir: dir };
        me.wait_serving(Duration::from_secs(60)).await;
        me
    }

    /// All client ports: `127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    pub fn process(&mut self, i: usize) -> &mut ServiceProcess {
        &mut self.nodes[i].process
    }

    /// The mode a node reports through `srvr` (`leader`, `follower`), or
    /// `None` when it does not answer or serves no requests (no quorum).
    pub async fn mode(&self, i: usize) -> Option<String> {
        let answer = four_letter(self.nodes[i].port, "srvr").await.ok()?;
        answer
            .lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_string())
    }

    /// The index of the node that leads now, if one does.
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.nodes.len() {
            if self.mode(i).await.as_deref() == Some("leader") {
                return Some(i);
            }
        }
        None
    }

    /// Wait until a leader is elected among the running nodes and every other
    /// running node follows it. Returns the leader's index.
    pub async fn wait_serving(&self, timeout: Duration) -> usize {
        let running: Vec<usize> = (0..self.nodes.len()).collect();
        let probe = || async {
            let mut leader = None;
            let mut answering = 0;
            for &i in &running {
                match self.mode(i).await.as_deref() {
                    Some("leader") => {
                        leader = Some(i);
                        answering += 1;
                    }
                    Some("follower") => answering += 1,
                    _ => {}
                }
            }
            match leader {
                Some(l) if answering >= 2 => Ok(l),
                _ => Err(format!("leader {leader:?}, {answering} nodes serving")),
            }
        };
        match wait_until(timeout, probe).await {
            Ok(l) => l,
            Err(e) => panic!(
                "zookeeper ensemble not serving after {timeout:?}: {e}\n{}",
                self.logs(30)
            ),
        }
    }

    /// SIGKILL node `i` (a crash).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].process.kill();
    }

    /// Start node `i` again on its ports and data, and wait until it serves.
    pub async fn start_again(&mut self, i: usize) {
        self.nodes[i]
            .process
            .start()
            .expect("restart zookeeper node");
        let port = self.nodes[i].port;
        let probe = || async {
            match self.mode(i).await.as_deref() {
                Some("leader" | "follower") => Ok(()),
                other => Err(format!("node {i} on port {port}: {other:?}")),
            }
        };
        if let Err(e) = wait_until(Duration::from_secs(60), probe).await {
            panic!("{e}\n{}", self.logs(30));
        }
    }

    fn logs(&self, n: usize) -> String {
        self.nodes
            .iter()
            .map(|node| {
                format!(
                    "--- {} log ---\n{}",
                    node.process.name(),
                    node.process.log_tail(n)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
