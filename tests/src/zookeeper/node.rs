//! One ZooKeeper server: its `zoo.cfg`, the JVM command that runs it, and
//! the four-letter words that tell whether it serves.

use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::process::{find_binary, Recipe};

/// The main class of a standalone server.
pub const STANDALONE: &str = "org.apache.zookeeper.server.ZooKeeperServerMain";
/// The main class of an ensemble's server.
pub const QUORUM_PEER: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";

/// Where a server listens for clients, and its place in an ensemble.
pub struct NodeConfig<'a> {
    pub client_address: &'a str,
    pub client_port: u16,
    /// `(myid, the server.N lines of every member)`; `None` for a standalone server.
    pub ensemble: Option<(usize, &'a str)>,
    /// The digest id (`user:base64(sha1(user:password))`) of a superuser,
    /// who passes every ACL: ZooKeeper's `superDigest`, the admin's way back
    /// in whatever ACLs the nodes have.
    pub super_digest: Option<&'a str>,
}

impl NodeConfig<'_> {
    /// Write `zoo.cfg` (and, in an ensemble, `data/myid`) into `dir`, and say
    /// how to run the server (`main_class`) on it, its log in `dir`.
    pub fn write(&self, dir: &Path) -> Recipe {
        let data = dir.join("data");
        std::fs::create_dir_all(&data).expect("zk data dir");
        let mut cfg = format!(
            "tickTime=500\ndataDir={}\nclientPort={}\nclientPortAddress={}\n\
             admin.enableServer=false\n4lw.commands.whitelist=*\n\
             minSessionTimeout=1000\nmaxSessionTimeout=60000\n",
            data.display(),
            self.client_port,
            self.client_address
        );
        if let Some(id) = self.super_digest {
            // Keys zoo.cfg does not know become `zookeeper.`-prefixed
            // system properties, which is where the digest provider looks.
            cfg.push_str(&format!("DigestAuthenticationProvider.superDigest={id}\n"));
        }
        let main_class = match self.ensemble {
            None => STANDALONE,
            Some((id, servers)) => {
                std::fs::write(data.join("myid"), format!("{id}\n")).expect("write myid");
                cfg.push_str("initLimit=10\nsyncLimit=5\n");
                cfg.push_str(servers);
                QUORUM_PEER
            }
        };
        let file: PathBuf = dir.join("zoo.cfg");
        std::fs::write(&file, cfg).expect("write zoo.cfg");
        Recipe::new(
            find_binary("java", &["/usr/bin"]),
            java_args(main_class, &file),
            dir.join("zookeeper.log"),
        )
    }
}

/// The JVM arguments that run a ZooKeeper main class with Debian's jars.
pub fn java_args(main_class: &str, cfg: &Path) -> Vec<String> {
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

/// The mode the server on `port` reports through `srvr` (`standalone`,
/// `leader`, `follower`). `ruok` answers `imok` as soon as the process runs,
/// before it serves sessions; `srvr` reports a mode only once it does, so an
/// error here means: not serving (not yet, or no quorum).
pub async fn mode(port: u16) -> std::io::Result<String> {
    let answer = four_letter(port, "srvr").await?;
    answer
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_string())
        .ok_or_else(|| std::io::Error::other(format!("not serving: {answer:?}")))
}
