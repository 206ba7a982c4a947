//! A private redis-server from Debian's `redis-server` package.

use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::process::{find_binary, free_port, wait_until, Recipe, ServiceProcess};

/// How the server keeps its data across a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Persistence {
    /// `--save "" --appendonly no`: a restart forgets everything (the articles' default case).
    #[default]
    None,
    /// `--appendonly yes --appendfsync always`: every write is on disk before the reply.
    AofAlways,
}

/// A redis-server on a free port with its dir in a temp dir. Killed on drop.
pub struct Redis {
    process: ServiceProcess,
    port: u16,
    _dir: TempDir,
}

impl Redis {
    pub async fn start() -> Self {
        Self::start_with(Persistence::None).await
    }

    pub async fn start_with(persistence: Persistence) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("harness-redis-")
            .tempdir_in(crate::process::scratch_dir())
            .expect("temp dir");
        let port = free_port();
        let mut args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir.path().to_string_lossy().into_owned(),
            "--save".into(),
            "".into(),
            "--daemonize".into(),
            "no".into(),
        ];
        match persistence {
            Persistence::None => args.extend(["--appendonly".into(), "no".into()]),
            Persistence::AofAlways => args.extend([
                "--appendonly".into(),
                "yes".into(),
                "--appendfsync".into(),
                "always".into(),
            ]),
        }
        let recipe = Recipe {
            program: find_binary("redis-server", &["/usr/bin", "/usr/local/bin"]),
            args,
            env: vec![],
            user: None,
            log: dir.path().join("redis.log"),
        };
        let process = ServiceProcess::spawn("redis", recipe).expect("spawn redis-server");
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

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn process(&mut self) -> &mut ServiceProcess {
        &mut self.process
    }

    /// Crash: SIGKILL. Without persistence, every key is gone at the next start.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Start again on the same port and dir, and wait until it answers PING.
    pub async fn start_again(&mut self) {
        self.process.start().expect("restart redis-server");
        self.wait_ready().await;
    }

    /// Kill and start again at once.
    pub async fn restart(&mut self) {
        self.kill();
        self.start_again().await;
    }

    async fn wait_ready(&mut self) {
        let port = self.port;
        let ready = wait_until(Duration::from_secs(15), || ping(port)).await;
        if let Err(e) = ready {
            panic!(
                "redis-server did not answer PING on port {port}: {e}\n--- log ---\n{}",
                self.process.log_tail(40)
            );
        }
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
