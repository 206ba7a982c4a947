//! A private redis-server from Debian's `redis-server` package.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::process::{find_binary, Recipe};
use crate::service::{Server, Service};

/// How the server keeps its data across a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Persistence {
    /// `--save "" --appendonly no`: a restart forgets everything (the articles' default case).
    #[default]
    None,
    /// `--appendonly yes --appendfsync always`: every write is on disk before the reply.
    AofAlways,
}

/// A redis-server: what is its own (its arguments, PING as readiness). The
/// rest is [`Server`]'s.
#[derive(Debug, Clone, Copy, Default)]
pub struct RedisService {
    pub persistence: Persistence,
}

/// A redis-server on a free port with its dir in a temp dir. Killed on drop.
pub type Redis = Server<RedisService>;

impl Service for RedisService {
    const NAME: &'static str = "redis";
    const READY_WITHIN: Duration = Duration::from_secs(15);

    async fn prepare(&self, dir: &Path, port: u16) -> Recipe {
        let mut args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir.to_string_lossy().into_owned(),
            "--save".into(),
            "".into(),
            "--daemonize".into(),
            "no".into(),
        ];
        match self.persistence {
            Persistence::None => args.extend(["--appendonly".into(), "no".into()]),
            Persistence::AofAlways => args.extend([
                "--appendonly".into(),
                "yes".into(),
                "--appendfsync".into(),
                "always".into(),
            ]),
        }
        Recipe::new(
            find_binary("redis-server", &["/usr/bin", "/usr/local/bin"]),
            args,
            dir.join("redis.log"),
        )
    }

    async fn probe(&self, port: u16) -> anyhow::Result<()> {
        Ok(ping(port).await?)
    }
}

impl Server<RedisService> {
    pub async fn start_with(persistence: Persistence) -> Self {
        Self::launch(RedisService { persistence }).await
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port())
    }
}

async fn ping(port: u16) -> std::io::Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(b"PING\r\n").await?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).await?;
    // While loading an AOF the server answers -LOADING.
    if buf[..n].starts_with(b"+PONG") {
        Ok(())
    } else {
        Err(std::io::Error::other(
            String::from_utf8_lossy(&buf[..n]).into_owned(),
        ))
    }
}
