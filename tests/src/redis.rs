//! A private redis-server from Debian's `redis-server` package, open to
//! anybody (the default) or with ACL users ([`crate::redis_acl`]).

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::process::{find_binary, Recipe};
use crate::redis_acl::{self, DATA_NODE_USERS};
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
    /// With the users of [`redis_acl::DATA_NODE_USERS`] and `default` off;
    /// otherwise anybody may do anything.
    pub acl: bool,
}

/// A redis-server on a free port with its dir in a temp dir. Killed on drop.
pub type Redis = Server<RedisService>;

impl Service for RedisService {
    const NAME: &'static str = "redis";
    const READY_WITHIN: Duration = Duration::from_secs(15);

    async fn prepare(&self, dir: &Path, port: u16) -> Recipe {
        let mut args: Vec<String> = vec![];
        if self.acl {
            // The users go in a config file: the first argument, before
            // the options.
            let users = dir.join("users.conf");
            std::fs::write(&users, redis_acl::user_lines(&DATA_NODE_USERS))
                .expect("write users.conf");
            args.push(users.to_string_lossy().into_owned());
        }
        args.extend([
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
        ]);
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
        let admin = self.acl.then_some(redis_acl::ADMIN.name);
        Ok(ping(port, admin).await?)
    }
}

impl Server<RedisService> {
    pub async fn start_with(persistence: Persistence) -> Self {
        Self::launch(RedisService {
            persistence,
            acl: false,
        })
        .await
    }

    /// A server with ACL users ([`redis_acl::DATA_NODE_USERS`]), `default` off.
    pub async fn start_with_acl(persistence: Persistence) -> Self {
        Self::launch(RedisService {
            persistence,
            acl: true,
        })
        .await
    }

    /// `redis://127.0.0.1:PORT/`: anonymous (the `default` user).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port())
    }

    /// `redis://user:password@127.0.0.1:PORT/`: as ACL user `name`.
    pub fn url_as(&self, name: &str) -> String {
        redis_acl::url_as(name, self.port())
    }
}

/// `PING` (after `AUTH user`, with the user's test password) answers
/// `PONG`.
pub(crate) async fn ping(port: u16, user: Option<&str>) -> std::io::Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    let mut request = String::new();
    if let Some(user) = user {
        request.push_str(&format!("AUTH {user} {}\r\n", redis_acl::password(user)));
    }
    request.push_str("PING\r\n");
    s.write_all(request.as_bytes()).await?;
    let expected: &[u8] = if user.is_some() {
        b"+OK\r\n+PONG\r\n"
    } else {
        b"+PONG\r\n"
    };
    let mut got = Vec::new();
    let mut buf = [0u8; 128];
    // One reply line per command, whatever it says.
    let lines = |b: &[u8]| b.windows(2).filter(|w| w == b"\r\n").count();
    while lines(&got) < lines(expected) {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    // While loading an AOF the server answers -LOADING.
    if got.starts_with(expected) {
        Ok(())
    } else {
        Err(std::io::Error::other(
            String::from_utf8_lossy(&got).into_owned(),
        ))
    }
}
