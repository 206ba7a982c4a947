//! A private ZooKeeper 3.8 (standalone) from Debian's `zookeeper` package.

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
            .tempdir()
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
        if let Err(e) = wait_until(Duration::from_secs(30), || four_letter(port, "ruok")).await {
            panic!(
                "zookeeper did not answer ruok on port {port}: {e}\n--- log ---\n{}",
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
pub async fn four_letter(port: u16, word: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(word.as_bytes()).await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    if word == "ruok" && out != "imok" {
        return Err(std::io::Error::other(format!("ruok answered {out:?}")));
    }
    Ok(out)
}
