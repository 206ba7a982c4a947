//! The worker's command line: one flag per setting, each with an env fallback
//! (compose and the scripts pass the same variables).

use std::time::Duration;

use clap::{Parser, ValueEnum};
use fencelock::zookeeper::{Access, Credentials, DigestId, Roles};
/// Which lock service guards the page (`--backend`).
pub use fencelock::Backend;

/// Edit one page through the gateway under a lock, over and over, and say what
/// happened at every step.
///
/// `worker lock --help`: take the page's lock from the command line, print
/// its token and hold it (for curl); `worker unlock --help`: end a holder
/// started with `worker lock --detach`.
#[derive(Debug, Clone, Parser)]
#[command(name = "worker", version)]
pub struct Config {
    /// A file of `NAME=VALUE` lines read into the environment before the
    /// other settings (variables already set win): a way to keep the lock
    /// services' passwords off the command line and out of the environment
    /// a container shows (e.g. a compose secret).
    #[arg(long, env = "SECRETS_FILE", value_name = "FILE")]
    pub secrets_file: Option<std::path::PathBuf>,

    /// Which lock service guards the page.
    #[arg(long, env = "WORKER_BACKEND", value_enum)]
    pub backend: Backend,

    /// Redis URL for `--backend redis`, e.g. redis://127.0.0.1:6379, or
    /// redis://worker:PASSWORD@127.0.0.1:6379 to log in as an ACL user
    /// (percent-encode special characters; errors never show the password).
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,

    /// Comma-separated `host:port` of the sentinels for `--backend
    /// redis-sentinel`. `user:PASSWORD@` before an entry (e.g.
    /// worker:PASSWORD@s1:26379,s2:26379) logs in to every sentinel and to
    /// the master as that ACL user, which both must know.
    #[arg(long, env = "REDIS_SENTINELS", value_delimiter = ',')]
    pub redis_sentinels: Vec<String>,

    /// The master name the sentinels monitor, for `--backend redis-sentinel`.
    #[arg(long, env = "REDIS_SENTINEL_MASTER", default_value = "mymaster")]
    pub redis_sentinel_master: String,

    /// `--backend redis-sentinel`: after every grant, `WAIT` until this many
    /// replicas acknowledged it; fewer in time and the grant is released and
    /// retried (0: no WAIT).
    #[arg(long, env = "REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub redis_wait_replicas: u32,

    /// The timeout of that `WAIT`, e.g. 100ms.
    #[arg(long, env = "REDIS_WAIT_TIMEOUT", value_parser = humantime::parse_duration, default_value = "100ms")]
    pub redis_wait_timeout: Duration,

    /// Comma-separated URLs of the independent Redis masters for `--backend
    /// redlock`; each may carry an ACL user (redis://worker:PASSWORD@host:port).
    #[arg(long, env = "REDLOCK_URLS", value_delimiter = ',')]
    pub redlock_urls: Vec<String>,

    /// ZooKeeper connect string for `--backend zookeeper`, e.g. 127.0.0.1:2181.
    #[arg(long, env = "ZOOKEEPER_CONNECT")]
    pub zookeeper_connect: Option<String>,

    /// `--backend zookeeper`: this worker's own digest user, `user:password`.
    /// The worker then also authenticates as `--zookeeper-lock-clients-auth`,
    /// and every lock node it creates lets only this user write it (see
    /// fencelock::zookeeper::Access). Needs the other two credentials
    /// settings, and lock roots an operator prepared. Absent: no
    /// credentials, every node open to anyone.
    #[arg(long, env = "ZOOKEEPER_AUTH", hide_env_values = true)]
    pub zookeeper_auth: Option<Credentials>,

    /// The digest user every lock client shares, `lock-clients:password`:
    /// it may create and delete nodes in the locks' queues and read them.
    #[arg(long, env = "ZOOKEEPER_LOCK_CLIENTS_AUTH", hide_env_values = true)]
    pub zookeeper_lock_clients_auth: Option<Credentials>,

    /// The admin's digest id, `admin:base64(sha1(admin:password))` (no
    /// password): every lock node grants it every right.
    #[arg(long, env = "ZOOKEEPER_ADMIN_ID")]
    pub zookeeper_admin_id: Option<DigestId>,

    /// Digest ids that may read every lock node, comma-separated: the
    /// gateway's (`gateway:base64(sha1(gateway:password))`), so that it can
    /// check a token with ZooKeeper.
    #[arg(long, env = "ZOOKEEPER_READER_IDS", value_delimiter = ',')]
    pub zookeeper_reader_ids: Vec<DigestId>,

    /// PostgreSQL URL of the lease table for `--backend lease-postgres`.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,

    /// MySQL/MariaDB URL of the lease table for `--backend lease-mysql`.
    #[arg(long, env = "MYSQL_URL")]
    pub mysql_url: Option<String>,

    /// `true` (the default): the fair variant of the lock (first come, first
    /// served: a holder that asks again right after its release queues behind
    /// the waiters, so workers on one page take turns); `false`: the non-fair
    /// one (whoever asks first when it is free wins, usually the worker that
    /// just released). For redis, redis-sentinel, zookeeper, lease-postgres
    /// and lease-mysql; Redlock has no fair variant and ignores it.
    #[arg(long, env = "WORKER_FAIR", default_value_t = true, action = clap::ArgAction::Set)]
    pub fair: bool,

    /// Base URL of the gateway, e.g. http://127.0.0.1:8080 (plain HTTP: the
    /// worker has no TLS stack, and refuses https://).
    #[arg(long, env = "WORKER_GATEWAY")]
    pub gateway: String,

    /// Id of the page to edit; the lock is named `page:<id>`.
    #[arg(long, env = "WORKER_PAGE", default_value = "demo")]
    pub page: String,

    /// Name written into every edit line and sent as Client-Id (default: hostname-pid).
    #[arg(long, env = "WORKER_CLIENT_ID")]
    pub client_id: Option<String>,

    /// API key sent as `Authorization: Bearer` (the gateway's demo keys are in
    /// demo/api-keys). It must be the key of `--client-id`: the lock service
    /// records that client as the holder, and the gateway compares the two.
    #[arg(long, env = "WORKER_API_KEY", hide_env_values = true)]
    pub api_key: Option<crate::client::ApiKey>,

    /// Stop after this many edit attempts (0 or absent: unbounded unless --duration).
    #[arg(long, env = "WORKER_EDITS")]
    pub edits: Option<u64>,

    /// Stop starting new edits after this long, e.g. 30s.
    #[arg(long, env = "WORKER_DURATION", value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,

    /// Lifetime of a grant when nobody renews it (ZooKeeper: the session timeout).
    #[arg(long, env = "WORKER_TTL", value_parser = humantime::parse_duration, default_value = "2s")]
    pub ttl: Duration,

    /// How long one acquire waits for the lock before trying again.
    #[arg(long, env = "WORKER_WAIT", value_parser = humantime::parse_duration, default_value = "30s")]
    pub wait: Duration,

    /// Milliseconds spent between the read and the write (the "work").
    #[arg(long, env = "WORKER_WORK_MS", default_value_t = 100)]
    pub work_ms: u64,

    /// `on`: send the lease's token with every read and write; `off`: send none
    /// (the demonstration of what goes wrong without fencing).
    #[arg(long, env = "WORKER_FENCING", value_enum, default_value_t = SendTokens::On)]
    pub fencing: SendTokens,

    /// Also send If-Match with the version read (optimistic concurrency). Off by
    /// default so that the fencing demo is not silently rescued by version checks.
    #[arg(long, env = "WORKER_IF_MATCH")]
    pub if_match: bool,

    /// `jsonl`: one JSON object per step on stdout; `none`: only the logs on stderr.
    #[arg(long, env = "WORKER_EVENTS", value_enum, default_value_t = EventsMode::None)]
    pub events: EventsMode,

    /// Raise SIGSTOP on this very process once, right after emitting this event
    /// (`read` or `writing`), for deterministic pause demos. SIGCONT resumes it.
    #[arg(long, env = "WORKER_STOP_SELF_AT", value_enum)]
    pub stop_self_at: Option<StopAt>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SendTokens {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EventsMode {
    Jsonl,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StopAt {
    Read,
    Writing,
}

/// A configuration the worker refuses before touching any service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "Redlock cannot be used with --fencing on: it has no safe fencing token. Its N \
         independent masters share no counter, so no number minted at grant time is \
         guaranteed to grow across grants (a master that restarts or a clock that jumps \
         lets two clients hold the lock with no order between them). Run it with \
         --fencing off (against a gateway with GATEWAY_FENCING=off) to see what it does \
         without fencing, or pick redis, zookeeper, lease-postgres or lease-mysql"
    )]
    RedlockNeedsFencingOff,

    #[error("--backend {backend} needs {setting}")]
    Missing {
        backend: &'static str,
        setting: &'static str,
    },

    #[error("invalid {what}: {detail}")]
    Invalid { what: &'static str, detail: String },

    #[error(
        "--gateway {0}: this worker speaks plain HTTP only (it is built without a TLS \
         stack), so it cannot reach an https:// gateway; use the gateway's http:// address, \
         or a TLS-terminating proxy next to the worker"
    )]
    HttpsUnsupported(String),
}

impl Config {
    /// Check what clap cannot: the settings each backend needs, and Redlock's
    /// refusal of fencing.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let backend = self.backend.name();
        let missing = |setting| ConfigError::Missing { backend, setting };
        match self.backend {
            Backend::Redis if self.redis_url.is_none() => {
                return Err(missing("--redis-url / REDIS_URL"))
            }
            Backend::RedisSentinel if self.redis_sentinels.iter().all(|s| s.trim().is_empty()) => {
                return Err(missing("--redis-sentinels / REDIS_SENTINELS"))
            }
            Backend::Redlock if self.fencing == SendTokens::On => {
                return Err(ConfigError::RedlockNeedsFencingOff)
            }
            Backend::Redlock if self.redlock_urls.iter().all(|u| u.trim().is_empty()) => {
                return Err(missing("--redlock-urls / REDLOCK_URLS"))
            }
            Backend::Zookeeper if self.zookeeper_connect.is_none() => {
                return Err(missing("--zookeeper-connect / ZOOKEEPER_CONNECT"))
            }
            Backend::Zookeeper => {
                self.zookeeper_access()?;
            }
            Backend::LeasePostgres if self.database_url.is_none() => {
                return Err(missing("--database-url / DATABASE_URL"))
            }
            Backend::LeaseMysql if self.mysql_url.is_none() => {
                return Err(missing("--mysql-url / MYSQL_URL"))
            }
            _ => {}
        }
        if self.gateway.starts_with("https://") {
            return Err(ConfigError::HttpsUnsupported(self.gateway.clone()));
        }
        if !self.gateway.starts_with("http://") {
            return Err(ConfigError::Invalid {
                what: "--gateway",
                detail: format!("{:?} is not an http:// URL", self.gateway),
            });
        }
        let page_ok = !self.page.is_empty()
            && self.page.len() <= 128
            && self
                .page
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !page_ok {
            return Err(ConfigError::Invalid {
                what: "--page",
                detail: format!("{:?} is not 1 to 128 of [A-Za-z0-9_-]", self.page),
            });
        }
        if self.ttl.is_zero() {
            return Err(ConfigError::Invalid {
                what: "--ttl",
                detail: "zero".into(),
            });
        }
        Ok(())
    }

    /// How the ZooKeeper session authenticates and which ACLs its nodes
    /// get: with credentials, all three credentials settings; without,
    /// none of them (open nodes).
    pub fn zookeeper_access(&self) -> Result<Access, ConfigError> {
        let missing = |setting| ConfigError::Missing {
            backend: self.backend.name(),
            setting,
        };
        let (own, lock_clients, admin) = match (
            &self.zookeeper_auth,
            &self.zookeeper_lock_clients_auth,
            &self.zookeeper_admin_id,
        ) {
            (None, None, None) if self.zookeeper_reader_ids.is_empty() => return Ok(Access::open()),
            (Some(own), Some(lock_clients), Some(admin)) => (own, lock_clients, admin),
            (None, ..) => return Err(missing("--zookeeper-auth / ZOOKEEPER_AUTH")),
            (_, None, _) => {
                return Err(missing(
                    "--zookeeper-lock-clients-auth / ZOOKEEPER_LOCK_CLIENTS_AUTH",
                ))
            }
            (.., None) => return Err(missing("--zookeeper-admin-id / ZOOKEEPER_ADMIN_ID")),
        };
        let roles = Roles::new(admin.clone(), lock_clients.id())
            .readers(self.zookeeper_reader_ids.iter().cloned());
        Access::lock_client(own.clone(), lock_clients.clone(), &roles).map_err(|e| {
            ConfigError::Invalid {
                what: "--zookeeper-auth",
                detail: e.to_string(),
            }
        })
    }

    /// The client id: the flag, or `<hostname>-<pid>`.
    pub fn client_id(&self) -> String {
        self.client_id
            .clone()
            .unwrap_or_else(fencelock::default_client_id)
    }

    /// The lock guarding the page.
    pub fn lock_name(&self) -> String {
        format!("page:{}", self.page)
    }

    pub fn fenced(&self) -> bool {
        self.fencing == SendTokens::On
    }

    /// How many edits to attempt; `None` = unbounded.
    pub fn edit_limit(&self) -> Option<u64> {
        self.edits.filter(|&n| n > 0)
    }
}

/// Load the secrets file that `--secrets-file FILE` or `SECRETS_FILE` names
/// (see [`Config::secrets_file`]) before clap reads the settings.
pub fn load_secrets_file() -> Result<(), String> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let flag = args.iter().enumerate().find_map(|(i, a)| {
        let a = a.to_str()?;
        match a.strip_prefix("--secrets-file") {
            Some("") => args.get(i + 1).cloned(),
            Some(rest) => rest.strip_prefix('=').map(Into::into),
            None => None,
        }
    });
    match flag.or_else(|| std::env::var_os("SECRETS_FILE")) {
        Some(path) => dotenvy::from_path(&path).map_err(|e| {
            format!(
                "secrets file {}: {e}",
                std::path::Path::new(&path).display()
            )
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn try_parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(std::iter::once("worker").chain(args.iter().copied()))
    }

    fn parse(args: &[&str]) -> Config {
        try_parse(args).expect("parse")
    }

    /// A Redis worker's lock settings.
    const REDIS: [&str; 4] = ["--backend", "redis", "--redis-url", "redis://r"];

    /// A Redis worker writing through `http://g`, with `more` flags.
    fn redis_via_g(more: &[&str]) -> Result<Config, clap::Error> {
        try_parse(&[&REDIS[..], &["--gateway", "http://g"], more].concat())
    }

    #[test]
    fn redlock_with_fencing_on_is_refused_with_the_reason() {
        let c = parse(&[
            "--backend",
            "redlock",
            "--redlock-urls",
            "redis://a,redis://b,redis://c",
            "--gateway",
            "http://g",
        ]);
        assert_eq!(c.validate(), Err(ConfigError::RedlockNeedsFencingOff));
        let c = Config {
            fencing: SendTokens::Off,
            ..c
        };
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.redlock_urls.len(), 3);
    }

    #[test]
    fn each_backend_needs_its_connection_setting() {
        let c = Config {
            // Whatever the environment says.
            mysql_url: None,
            ..parse(&["--backend", "lease-mysql", "--gateway", "http://g"])
        };
        assert_eq!(
            c.validate(),
            Err(ConfigError::Missing {
                backend: "lease-mysql",
                setting: "--mysql-url / MYSQL_URL"
            })
        );
    }

    #[test]
    fn bad_page_ids_and_gateway_urls_are_refused() {
        let bad_page = redis_via_g(&["--page", "a/b"]).unwrap();
        assert!(matches!(
            bad_page.validate(),
            Err(ConfigError::Invalid { what: "--page", .. })
        ));
        let bad_url = parse(&[&REDIS[..], &["--gateway", "g:8080"]].concat());
        assert!(matches!(
            bad_url.validate(),
            Err(ConfigError::Invalid {
                what: "--gateway",
                ..
            })
        ));
    }

    #[test]
    fn https_gateways_are_refused_because_the_worker_has_no_tls() {
        let https = parse(&[&REDIS[..], &["--gateway", "https://g:8443"]].concat());
        let err = https.validate().unwrap_err();
        assert_eq!(err, ConfigError::HttpsUnsupported("https://g:8443".into()));
        assert!(err.to_string().contains("plain HTTP only"), "{err}");
        let http = parse(&[&REDIS[..], &["--gateway", "http://g:8080"]].concat());
        assert_eq!(http.validate(), Ok(()));
    }

    #[test]
    fn defaults_match_the_agreed_interface() {
        let c = redis_via_g(&[]).unwrap();
        assert_eq!(c.page, "demo");
        assert_eq!(c.ttl, Duration::from_secs(2));
        assert_eq!(c.wait, Duration::from_secs(30));
        assert_eq!(c.work_ms, 100);
        assert_eq!(c.fencing, SendTokens::On);
        assert_eq!(c.events, EventsMode::None);
        assert!(!c.if_match);
        assert_eq!(c.edit_limit(), None);
        assert_eq!(c.lock_name(), "page:demo");
        assert!(c.fair, "fair by default");
    }

    #[test]
    fn zookeeper_credentials_come_all_together_and_never_show() {
        const ZK: [&str; 6] = [
            "--backend",
            "zookeeper",
            "--zookeeper-connect",
            "zk:2181",
            "--gateway",
            "http://g",
        ];
        let open = parse(&ZK);
        assert_eq!(open.validate(), Ok(()));
        assert_eq!(
            format!("{:?}", open.zookeeper_access().unwrap()),
            format!("{:?}", Access::open())
        );
        let admin_id = "admin:fvr2cB/fjGeAiX8g1aGhUm3ZICk=";
        let full = parse(
            &[
                &ZK[..],
                &[
                    "--zookeeper-auth",
                    "worker-1:hunter2",
                    "--zookeeper-lock-clients-auth",
                    "lock-clients:lc-secret",
                    "--zookeeper-admin-id",
                    admin_id,
                    "--zookeeper-reader-ids",
                    &format!("gateway:{},other:{}", &admin_id[6..], &admin_id[6..]),
                ],
            ]
            .concat(),
        );
        assert_eq!(full.validate(), Ok(()));
        let access = full.zookeeper_access().unwrap();
        assert_eq!(
            access.users().collect::<Vec<_>>(),
            ["worker-1", "lock-clients"]
        );
        assert_eq!(full.zookeeper_reader_ids.len(), 2);
        assert!(!format!("{full:?}").contains("hunter2"));
        let partial = parse(&[&ZK[..], &["--zookeeper-auth", "worker-1:hunter2"]].concat());
        assert!(matches!(
            partial.validate(),
            Err(ConfigError::Missing { .. })
        ));
        assert!(try_parse(&[&ZK[..], &["--zookeeper-admin-id", "admin:secret"]].concat()).is_err());
    }

    #[test]
    fn fair_takes_true_or_false() {
        assert!(!redis_via_g(&["--fair", "false"]).unwrap().fair);
        assert!(redis_via_g(&["--fair", "true"]).unwrap().fair);
        assert!(redis_via_g(&["--fair", "maybe"]).is_err());
    }
}
