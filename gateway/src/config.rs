//! The binary's command line ([`Cli`]: `gateway [serve]` with [`Config`], or
//! `gateway setup` with [`crate::setup::SetupConfig`]; every flag with an
//! environment fallback) and the serving settings for a gateway spawned
//! in-process ([`GatewayOptions`]).

use crate::proxy_protocol::TrustedProxies;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::auth::{AuthMode, KeyRing};
use crate::db::PoolOptions;
use crate::http::Deadlines;
use crate::issuers::IssuerSpec;
use crate::page_issuers::{self, PageIssuer};
use crate::server::ServeOptions;
use crate::setup::SetupConfig;
use crate::trust::TrustOptions;
use crate::{FenceCheck, DEFAULT_POOL_SIZE};

/// A flag's value that must never be logged (API keys): `Debug` shows `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// A URL that may carry a password: `Debug` and `Display` show it
/// redacted ([`fencelock::redact_url`]).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&fencelock::redact_url(&self.0))
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&fencelock::redact_url(&self.0))
    }
}

impl FromStr for SecretUrl {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(SecretUrl(s.to_owned()))
    }
}

/// The command line: `gateway` serves (the same as `gateway serve`);
/// `gateway setup` is the operator's one-shot step before it.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "gateway",
    about = "Page storage over HTTP that rejects stale fencing tokens",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `gateway` alone serves with these.
    #[command(flatten)]
    pub serve: Option<Config>,
}

/// What the binary does.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Serve the pages (the default): the schema must be in place (`gateway setup`).
    Serve(Config),
    /// The operator's step, run with the database owner's URL: the
    /// migrations, the roles' grants, the lease tables. Idempotent.
    Setup(SetupConfig),
}

impl Cli {
    /// Parse `args` (the program's name first), exiting with clap's message
    /// on an error. `setup` is parsed on its own: parsed beside the serve
    /// flags, any of their environment variables (a `GATEWAY_MAX_STREAMS`
    /// in the operator's shell) made clap read the whole line as serve
    /// flags and ask for `--database-url`.
    pub fn parse_args(args: Vec<std::ffi::OsString>) -> Command {
        use clap::{CommandFactory, FromArgMatches, Parser};
        if args.get(1).is_some_and(|a| a == "setup") {
            let setup = <Cli as CommandFactory>::command()
                .find_subcommand("setup")
                .expect("the setup subcommand")
                .clone()
                .bin_name("gateway setup");
            let matches = setup.get_matches_from(&args[1..]);
            return Command::Setup(
                SetupConfig::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()),
            );
        }
        Cli::parse_from(args).command()
    }

    /// The command to run: `serve` when none is named.
    pub fn command(self) -> Command {
        match (self.command, self.serve) {
            (Some(command), _) => command,
            (None, Some(serve)) => Command::Serve(serve),
            (None, None) => unreachable!("clap requires the serve flags without a subcommand"),
        }
    }
}

/// The serving gateway's configuration: flags, with environment fallbacks.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "gateway",
    about = "Page storage over HTTP that rejects stale fencing tokens"
)]
pub struct Config {
    /// A file of `NAME=VALUE` lines read into the environment before the
    /// other settings (variables already set win): a way to keep the
    /// database's and the issuers' passwords off the command line and out
    /// of the environment a container shows (e.g. a compose secret).
    #[arg(long, env = "SECRETS_FILE", value_name = "FILE")]
    pub secrets_file: Option<std::path::PathBuf>,
    /// PostgreSQL URL of the gateway's own role (fence_gateway; fence_unfenced
    /// with fencing off), e.g. postgres://fence_gateway:PW@127.0.0.1:5432/pages;
    /// with a standby: postgres://fence_gateway:PW@db1:5432,db2:5432/pages?target_session_attrs=read-write
    /// (requests go to whichever server accepts writes). The schema must be
    /// in place (`gateway setup`): the gateway only checks it.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: SecretUrl,
    /// Address to listen on.
    #[arg(long, env = "GATEWAY_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// A second address that answers only /healthz and /readyz, with
    /// connection limits of its own: for the balancer's and the
    /// orchestrator's checks, which a flood of clients would otherwise find
    /// refused at the main address's connection cap. Bind it where only they
    /// reach it. Unset: the probes are answered on the main address only.
    #[arg(long, env = "GATEWAY_PROBE_LISTEN")]
    pub probe_listen: Option<SocketAddr>,
    /// `enforce` refuses stale tokens; `off` accepts them and marks them stale in the history.
    #[arg(long, env = "GATEWAY_FENCING", value_enum, default_value = "enforce")]
    pub fencing: FenceCheck,
    /// Maximum PostgreSQL connections (a few per core is where PostgreSQL
    /// is fastest; HTTP connections are multiplexed onto them).
    #[arg(long, env = "GATEWAY_DB_POOL_SIZE", default_value_t = DEFAULT_POOL_SIZE)]
    pub db_pool_size: u32,
    /// PostgreSQL connections of the public reads (unfenced GETs, /pages,
    /// history, the dashboard), a pool apart from the writers': a flood of
    /// readers waits for these, never for the writers' connections. 0: the
    /// reads share the writers' pool.
    #[arg(long, env = "GATEWAY_DB_READ_POOL_SIZE", default_value_t = crate::DEFAULT_READ_POOL_SIZE)]
    pub db_read_pool_size: u32,
    /// Most requests waiting for a connection of a pool while all its
    /// connections are taken; more are answered 503 database_unavailable at
    /// once instead of queueing.
    #[arg(long, env = "GATEWAY_DB_MAX_WAITING", default_value_t = crate::db::DEFAULT_MAX_WAITING)]
    pub db_max_waiting: u32,
    /// `required`: a PUT, and any request with Fencing-Token, needs
    /// `Authorization: Bearer <key>` (the gateway refuses to start without a
    /// key). `off`: anybody may write (a WARN at start).
    #[arg(long, env = "GATEWAY_AUTH", value_enum, default_value = "required")]
    pub auth: AuthMode,
    /// Writers' keys: `client=key,client=key` (keys of at least 16 bytes).
    /// The client is what the history records as `client_id`.
    #[arg(
        long,
        env = "GATEWAY_API_KEYS",
        hide_env_values = true,
        value_name = "CLIENT=KEY,..."
    )]
    pub api_keys: Option<Secret>,
    /// A file of writers' keys: one `client=key` a line, `#` comments.
    #[arg(long, env = "GATEWAY_API_KEYS_FILE", value_name = "FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// Admins' keys, for `POST /admin/pages/{id}/fence` only: `name=key,...`.
    #[arg(
        long,
        env = "GATEWAY_ADMIN_KEYS",
        hide_env_values = true,
        value_name = "NAME=KEY,..."
    )]
    pub admin_keys: Option<Secret>,
    /// A file of admins' keys: one `name=key` a line, `#` comments.
    #[arg(long, env = "GATEWAY_ADMIN_KEYS_FILE", value_name = "FILE")]
    pub admin_keys_file: Option<PathBuf>,
    /// A lock service whose tokens are checked, `NAME=URL` (repeatable; in the
    /// variable, space-separated). NAME is the Fencing-Issuer value; the URL's
    /// scheme picks the backend: redis://[user:password@]host:port,
    /// zookeeper://host:port[,host:port],
    /// redis-sentinel://[user:password@]host:port[,host:port]/MASTER (the
    /// sentinels and the master's name; the user logs in to both),
    /// postgres:// or mysql:// (a fencelock lease table). Redlock cannot be
    /// one.
    #[arg(
        long = "issuer",
        env = "GATEWAY_ISSUERS",
        hide_env_values = true,
        value_name = "NAME=URL",
        value_delimiter = ' '
    )]
    pub issuers: Vec<Secret>,
    /// How long an issuer may take to answer before the request is refused
    /// with 503 issuer_unavailable (fail closed).
    #[arg(long, env = "GATEWAY_ISSUER_TIMEOUT", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub issuer_timeout: Duration,
    /// Which issuer guards which pages: `PATTERN=ISSUER,...` (commas or
    /// spaces), PATTERN a page id or a glob where `*` stands for any run of
    /// characters; the first match wins. A page whose fence already names an
    /// issuer (set by an admin, or by an access accepted under this rule)
    /// keeps it. Every issuer named must be configured (--issuer), or be
    /// `redlock`, which mints no tokens: its pages take no fenced access. Fenced
    /// accesses with another issuer's token: 409 issuer_mismatch. Ignored
    /// with fencing off.
    #[arg(long, env = "GATEWAY_PAGE_ISSUERS", value_name = "PATTERN=ISSUER,...")]
    pub page_issuers: Option<String>,
    /// The issuer of pages no --page-issuers pattern matches. Default: the
    /// only configured issuer when exactly one is configured, else none (such
    /// pages are refused 409 no_issuer_for_page until an admin fences them).
    #[arg(long, env = "GATEWAY_DEFAULT_ISSUER", value_name = "ISSUER")]
    pub default_issuer: Option<String>,
    /// How far above a page's fence a token of a redis or redis-sentinel
    /// issuer may be (its lock's counter counts grants): further is refused
    /// as 409 suspected_forgery, with a history row (an admin accepts such
    /// a jump by setting the fence). 0: no bound (a loud warning at start).
    #[arg(long, env = "GATEWAY_MAX_TOKEN_JUMP", default_value_t = crate::issuers::DEFAULT_MAX_TOKEN_JUMP)]
    pub max_token_jump: u64,
    /// Most HTTP connections served at once; more are answered 503
    /// too_many_connections (with Retry-After) and closed.
    #[arg(long, env = "GATEWAY_MAX_CONNECTIONS", default_value_t = crate::server::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Most HTTP connections served at once from one client address; more
    /// are answered 503 too_many_connections and closed. Behind a balancer,
    /// the address is the balancer's.
    #[arg(long, env = "GATEWAY_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = crate::limits::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS)]
    pub max_connections_per_address: usize,
    /// Balancers whose connections start with a PROXY protocol v2 header
    /// (HAProxy's send-proxy-v2) naming the client, whose address the
    /// per-address limits then count: IP addresses or host names (resolved
    /// at start and every 2 s), commas or spaces. Their connections without
    /// a valid header are closed; nobody else's may carry one.
    #[arg(long, env = "GATEWAY_TRUSTED_PROXIES", value_name = "HOST,...")]
    pub trusted_proxies: Option<String>,
    /// Most dashboard event streams open at once; more are answered 503
    /// too_many_streams (with Retry-After).
    #[arg(long, env = "GATEWAY_MAX_STREAMS", default_value_t = crate::limits::DEFAULT_MAX_STREAMS)]
    pub max_streams: usize,
    /// Fenced requests (PUTs, fenced GETs) a second per client key; more are
    /// answered 429 rate_limited with Retry-After. 0: no limit.
    #[arg(long, env = "GATEWAY_WRITE_RATE_PER_KEY", default_value_t = 0)]
    pub write_rate_per_key: u32,
    /// How many fenced requests a client may send at once above its rate
    /// (the bucket's size). 0: as many as the rate.
    #[arg(long, env = "GATEWAY_WRITE_BURST_PER_KEY", default_value_t = 0)]
    pub write_burst_per_key: u32,
    /// Most dashboard event streams open at once from one client address.
    #[arg(long, env = "GATEWAY_MAX_STREAMS_PER_ADDRESS", default_value_t = crate::limits::DEFAULT_MAX_STREAMS_PER_ADDRESS)]
    pub max_streams_per_address: usize,
    /// How long a client may take to send a request's headers (and how long
    /// an idle keep-alive connection is kept); then the connection is closed.
    #[arg(long, env = "GATEWAY_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,
    /// Longest a request may take. Past it, a request that has not sent its
    /// statement yet is answered 504 `timeout` (nothing written).
    #[arg(long, env = "GATEWAY_REQUEST_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,
    /// How much longer a request whose statement was already sent waits for
    /// it past the request timeout: its result if it finishes by then, else
    /// 504 `outcome_unknown` (it may still commit; the client reads to know).
    #[arg(long, env = "GATEWAY_OUTCOME_WAIT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub outcome_wait: Duration,
    /// A database connection idle for longer than this is pinged before it
    /// is reused (a busy one is not).
    #[arg(long, env = "GATEWAY_DB_IDLE_CHECK", default_value = "5s", value_parser = humantime::parse_duration)]
    pub db_idle_check: Duration,
    /// Database connections older than this are closed instead of reused.
    #[arg(long, env = "GATEWAY_DB_MAX_LIFETIME", default_value = "30m", value_parser = humantime::parse_duration)]
    pub db_max_lifetime: Duration,
}

impl Config {
    /// Keys (read from their files too) and issuers, parsed and validated:
    /// `Err` names the flag entry or file line at fault, never a key.
    pub fn trust_options(&self) -> anyhow::Result<TrustOptions> {
        let mut writers = KeyRing::new();
        if let Some(list) = &self.api_keys {
            writers
                .add_list("GATEWAY_API_KEYS (--api-keys)", list.expose())
                .map_err(anyhow::Error::msg)?;
        }
        if let Some(path) = &self.api_keys_file {
            writers.add_file(path).map_err(anyhow::Error::msg)?;
        }
        let mut admins = KeyRing::new();
        if let Some(list) = &self.admin_keys {
            admins
                .add_list("GATEWAY_ADMIN_KEYS (--admin-keys)", list.expose())
                .map_err(anyhow::Error::msg)?;
        }
        if let Some(path) = &self.admin_keys_file {
            admins.add_file(path).map_err(anyhow::Error::msg)?;
        }
        let issuers = self
            .issuers
            .iter()
            .filter(|s| !s.expose().trim().is_empty())
            .map(|s| s.expose().parse::<IssuerSpec>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(anyhow::Error::msg)?;
        let page_issuers = match &self.page_issuers {
            Some(list) => page_issuers::parse_list(list)
                .map_err(|e| anyhow::anyhow!("GATEWAY_PAGE_ISSUERS (--page-issuers): {e}"))?,
            None => Vec::new(),
        };
        let default_issuer = match self.default_issuer.as_deref().map(str::trim) {
            Some(name) if !crate::issuers::valid_issuer_name(name) => anyhow::bail!(
                "GATEWAY_DEFAULT_ISSUER (--default-issuer) {name:?}: must match [a-z0-9._:-]{{1,64}}"
            ),
            other => other.map(str::to_owned),
        };
        let options = TrustOptions {
            auth: self.auth,
            writers,
            admins,
            issuers,
            issuer_timeout: self.issuer_timeout,
            page_issuers,
            default_issuer,
            max_token_jump: self.max_token_jump,
        };
        options.validate().map_err(anyhow::Error::msg)?;
        Ok(options)
    }

    /// The connection limits.
    pub fn serve_options(&self) -> anyhow::Result<ServeOptions> {
        Ok(ServeOptions {
            max_connections: self.max_connections,
            max_connections_per_address: self.max_connections_per_address,
            max_streams: self.max_streams,
            max_streams_per_address: self.max_streams_per_address,
            header_read_timeout: self.header_read_timeout,
            trusted_proxies: TrustedProxies::parse(self.trusted_proxies.as_deref().unwrap_or(""))
                .map_err(anyhow::Error::msg)?,
        })
    }

    /// The public reads' pool: the request pool's settings with its own size.
    pub fn read_pool_options(&self) -> PoolOptions {
        PoolOptions {
            max_connections: self.db_read_pool_size,
            ..self.pool_options()
        }
    }

    /// The request pool's settings.
    pub fn pool_options(&self) -> PoolOptions {
        PoolOptions {
            max_connections: self.db_pool_size,
            max_waiting: self.db_max_waiting,
            check_after_idle: self.db_idle_check,
            max_lifetime: self.db_max_lifetime,
            ..PoolOptions::default()
        }
    }

    pub fn deadlines(&self) -> Deadlines {
        Deadlines {
            request: self.request_timeout,
            outcome_wait: self.outcome_wait,
        }
    }
}

/// Everything [`crate::spawn_with_options`] needs besides the database: the
/// in-process twin of [`Config`]. Built with chained calls; a bad key or
/// issuer is reported by the spawn.
///
/// ```no_run
/// # async fn demo(db: &str) -> anyhow::Result<()> {
/// use gateway::{FenceCheck, GatewayOptions};
/// let gw = gateway::spawn_with_options(
///     db,
///     GatewayOptions::new(FenceCheck::Enforce)
///         .api_key("alice", "alice-key-0123456789")
///         .admin_key("admin", "admin-key-0123456789")
///         .issuer("redis", "redis://127.0.0.1:6379"),
/// )
/// .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    pub fencing: FenceCheck,
    /// PostgreSQL connections (wins over `pool.max_connections`).
    pub pool_size: u32,
    /// PostgreSQL connections of the public reads' pool.
    pub read_pool_size: u32,
    /// The request pool's checks and timeouts.
    pub pool: PoolOptions,
    pub trust: TrustOptions,
    pub serve: ServeOptions,
    /// Fenced requests a second per client, and the burst (0: no limit).
    pub write_rate: (u32, u32),
    pub deadlines: Deadlines,
    /// Whether the spawn applies the migrations first, with its own URL (a
    /// test's superuser database): [`crate::schema::migrate`], as `gateway
    /// setup` would, without its grants. Off: it only checks the schema, as
    /// the binary does (a URL of the gateway's own role).
    pub migrate: bool,
    /// The first invalid key or issuer given, reported by the spawn.
    error: Option<String>,
}

impl GatewayOptions {
    /// Authentication off, no issuers, default pool and connection limits:
    /// what [`crate::spawn`] runs.
    pub fn new(fencing: FenceCheck) -> Self {
        GatewayOptions {
            fencing,
            pool_size: DEFAULT_POOL_SIZE,
            read_pool_size: crate::DEFAULT_READ_POOL_SIZE,
            pool: PoolOptions::default(),
            trust: TrustOptions::off(),
            serve: ServeOptions::default(),
            write_rate: (0, 0),
            deadlines: Deadlines::default(),
            migrate: true,
            error: None,
        }
    }

    /// Parsed flags (keys read from their files).
    pub fn from_config(config: &Config) -> anyhow::Result<Self> {
        Ok(GatewayOptions {
            fencing: config.fencing,
            pool_size: config.db_pool_size,
            read_pool_size: config.db_read_pool_size,
            pool: config.pool_options(),
            trust: config.trust_options()?,
            serve: config.serve_options()?,
            write_rate: (config.write_rate_per_key, config.write_burst_per_key),
            deadlines: config.deadlines(),
            migrate: false,
            error: None,
        })
    }

    fn fail(&mut self, e: String) {
        self.error.get_or_insert(e);
    }

    /// A writer's key. The first one turns authentication on
    /// ([`AuthMode::Required`]); call [`GatewayOptions::auth`] afterwards to
    /// turn it off again.
    pub fn api_key(mut self, client: &str, key: &str) -> Self {
        if self.trust.writers.is_empty() {
            self.trust.auth = AuthMode::Required;
        }
        if let Err(e) = self.trust.writers.add("api key", client, key) {
            self.fail(e);
        }
        self
    }

    /// An admin's key (the history records `admin:<name>`).
    pub fn admin_key(mut self, name: &str, key: &str) -> Self {
        if let Err(e) = self.trust.admins.add("admin key", name, key) {
            self.fail(e);
        }
        self
    }

    /// An issuer whose tokens are checked: `name` is the Fencing-Issuer value.
    pub fn issuer(mut self, name: &str, url: &str) -> Self {
        match format!("{name}={url}").parse() {
            Ok(spec) => self.trust.issuers.push(spec),
            Err(e) => self.fail(e),
        }
        self
    }

    /// `pages` (a page id, or a glob with `*`) are guarded by `issuer`
    /// (`GATEWAY_PAGE_ISSUERS`; the first match wins).
    pub fn page_issuer(mut self, pages: &str, issuer: &str) -> Self {
        match format!("{pages}={issuer}").parse::<PageIssuer>() {
            Ok(p) => self.trust.page_issuers.push(p),
            Err(e) => self.fail(e),
        }
        self
    }

    /// The issuer of pages no pattern matches (`GATEWAY_DEFAULT_ISSUER`).
    pub fn default_issuer(mut self, issuer: &str) -> Self {
        self.trust.default_issuer = Some(issuer.to_owned());
        self
    }

    /// Whether the spawn migrates first (default) or only checks the schema.
    pub fn migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    pub fn auth(mut self, mode: AuthMode) -> Self {
        self.trust.auth = mode;
        self
    }

    pub fn issuer_timeout(mut self, timeout: Duration) -> Self {
        self.trust.issuer_timeout = timeout;
        self
    }

    /// How far above a page's fence a Redis token may be (0: no bound).
    pub fn max_token_jump(mut self, jump: u64) -> Self {
        self.trust.max_token_jump = jump;
        self
    }

    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool_size = n;
        self
    }

    /// The request pool's checks and timeouts (its size stays `pool_size`).
    pub fn pool_options(mut self, pool: PoolOptions) -> Self {
        self.pool = pool;
        self
    }

    pub fn read_pool_size(mut self, n: u32) -> Self {
        self.read_pool_size = n;
        self
    }

    /// The public reads' pool as spawned: `pool` with `read_pool_size`
    /// connections.
    pub fn read_pool_options_resolved(&self) -> PoolOptions {
        PoolOptions {
            max_connections: self.read_pool_size,
            ..self.pool
        }
    }

    /// The request pool as spawned: `pool` with `pool_size` connections.
    pub fn pool_options_resolved(&self) -> PoolOptions {
        PoolOptions {
            max_connections: self.pool_size,
            ..self.pool
        }
    }

    /// Longest a request may take before 504 `timeout` (statement not sent).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.deadlines.request = timeout;
        self
    }

    /// How long past the request timeout a sent statement is waited for
    /// before 504 `outcome_unknown`.
    pub fn outcome_wait(mut self, wait: Duration) -> Self {
        self.deadlines.outcome_wait = wait;
        self
    }

    pub fn max_connections(mut self, n: usize) -> Self {
        self.serve.max_connections = n;
        self
    }

    /// At most `per_second` fenced requests a second per client, in bursts
    /// of `burst` (0: as many as the rate).
    pub fn write_rate(mut self, per_second: u32, burst: u32) -> Self {
        self.write_rate = (per_second, burst);
        self
    }

    /// Balancers whose connections start with a PROXY protocol v2 header.
    pub fn trusted_proxies(mut self, proxies: TrustedProxies) -> Self {
        self.serve.trusted_proxies = proxies;
        self
    }

    pub fn max_connections_per_address(mut self, n: usize) -> Self {
        self.serve.max_connections_per_address = n;
        self
    }

    /// Most dashboard streams, overall and from one address.
    pub fn max_streams(mut self, all: usize, per_address: usize) -> Self {
        self.serve.max_streams = all;
        self.serve.max_streams_per_address = per_address;
        self
    }

    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.serve.header_read_timeout = timeout;
        self
    }

    /// The trust settings, or the first error any call above met.
    pub fn checked_trust(&self) -> anyhow::Result<TrustOptions> {
        if let Some(e) = &self.error {
            anyhow::bail!("{e}");
        }
        self.trust.validate().map_err(anyhow::Error::msg)?;
        if self.fencing == FenceCheck::Enforce {
            self.trust.page_rule().map_err(anyhow::Error::msg)?;
        }
        Ok(self.trust.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Config {
        let mut all = vec!["gateway", "--database-url", "postgres://x"];
        all.extend_from_slice(args);
        Config::try_parse_from(all).expect("flags parse")
    }

    #[test]
    fn required_auth_without_a_key_refuses_to_start_and_says_how_to_fix_it() {
        let err = parse(&[]).trust_options().unwrap_err().to_string();
        assert!(err.contains("GATEWAY_API_KEYS"), "{err}");
        assert!(err.contains("GATEWAY_AUTH=off"), "{err}");
        assert!(parse(&["--auth", "off"]).trust_options().is_ok());
    }

    #[test]
    fn keys_from_flag_and_file_issuers_and_timeout() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(
            &mut file,
            b"# the writers\nbob=bob-key-0123456789abc\n\n  carol = carol-key-0123456789\n",
        )
        .unwrap();
        let config = parse(&[
            "--api-keys",
            "alice=alice-key-0123456789",
            "--api-keys-file",
            file.path().to_str().unwrap(),
            "--admin-keys",
            "root=root-key-0123456789",
            "--issuer",
            "redis=redis://127.0.0.1:6379",
            "--issuer",
            "zookeeper=zookeeper://a:2181,b:2181",
            "--issuer-timeout",
            "250ms",
            "--max-token-jump",
            "1000",
        ]);
        let t = config.trust_options().unwrap();
        assert_eq!(
            t.writers.names().collect::<Vec<_>>(),
            ["alice", "bob", "carol"]
        );
        assert_eq!(t.writers.find("carol-key-0123456789"), Some("carol"));
        assert_eq!(t.admins.find("root-key-0123456789"), Some("root"));
        assert_eq!(t.issuers.len(), 2);
        assert_eq!(t.issuer_timeout, Duration::from_millis(250));
        assert_eq!(t.max_token_jump, 1000);
        assert_eq!(parse(&["--auth", "off"]).max_token_jump, 1 << 20);
        assert!(!format!("{config:?}").contains("alice-key"));
    }

    #[test]
    fn a_bad_file_line_is_named_and_an_admin_key_cannot_write() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, b"bob=bob-key-0123456789abc\nbob=tiny-k\n").unwrap();
        let path = file.path().to_str().unwrap().to_owned();
        let err = parse(&["--api-keys-file", &path])
            .trust_options()
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("{path} line 2")), "{err}");
        assert!(!err.contains("tiny-k"), "{err}");

        let err = parse(&[
            "--api-keys",
            "alice=same-key-0123456789",
            "--admin-keys",
            "root=same-key-0123456789",
        ])
        .trust_options()
        .unwrap_err()
        .to_string();
        assert!(err.contains("admin key must not be a writer key"), "{err}");

        let err = parse(&["--auth", "off", "--issuer", "redlock=redlock://a:1"])
            .trust_options()
            .unwrap_err()
            .to_string();
        assert!(err.contains("Redlock cannot be an issuer"), "{err}");
    }
}
