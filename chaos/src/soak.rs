//! The soak (issue 15): every fenced backend at once, each on pages of its
//! own, all through two gateways behind HAProxy on PostgreSQL with a
//! synchronous standby, while faults drawn from the whole catalogue hit the
//! stack one after another; then a checker reads the complete history.
//!
//! `cargo run -p chaos -- --soak --minutes 30 [--seed N] [--backend B]...`
//!
//! # The stack
//! - PostgreSQL primary + synchronous standby ([`harness::PostgresPair`]);
//!   two gateway processes on its multi-host URL; HAProxy in front of them,
//!   health-checked on `/readyz`. Workers talk to the balancer only.
//! - Per backend, its own lock server(s): Redis with `appendfsync always` (a
//!   Redis that forgets its counter is the separate, deliberately stuck row
//!   `redis-restart`; here restarts keep it), ZooKeeper (the three-node
//!   ensemble in network namespaces, [`harness::ZooKeeperHosts`], or one
//!   server with `--zookeeper-standalone`), a PostgreSQL for the lease
//!   table, a MariaDB for the other lease table.
//! - Per page, [`SoakConfig::workers_per_page`] workers editing until the end;
//!   on the ensemble, each ZooKeeper page's first worker talks to one server
//!   only (pinned), so that `zookeeper-partition` cuts a worker off with the
//!   minority.
//!
//! # The faults
//! First each kind once, in an order drawn from the seed (so a two-minute
//! run covers the catalogue), then kinds drawn at random, with a random gap:
//! see [`Fault`]. Each fault undoes itself before the next one starts.
//!
//! # The checker
//! Per page, over `page_history` read from the final primary and every
//! worker's events: accepted tokens never decrease in commit order; every
//! acknowledged edit has its accepted PUT in the history; every acknowledged
//! line is in the final body exactly once; the final body is the last
//! accepted write (its version, and its line last); the fence is the highest
//! accepted token. Any worker that does not finish is a violation too.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use harness::{
    Haproxy, MariaDb, Persistence, Postgres, PostgresPair, Redis, Replication, ZooKeeper,
    ZooKeeperHosts,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::backends::{Backend, Zk};
use crate::history::{self, Attempt};
use crate::procs::{now_ms, Event, EventLog, GatewayProc, WorkerProc, WorkerSpec};
use harness::proxy::{via_proxy, DelayProxy, Mode};

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    pub seed: u64,
    /// Faults are injected until then; the workers stop starting edits then.
    pub duration: Duration,
    /// Fenced backends only (Redlock has no token to check).
    pub backends: Vec<Backend>,
    pub pages_per_backend: usize,
    pub workers_per_page: usize,
    /// One ZooKeeper server instead of the three-node ensemble: then the
    /// ensemble's faults (`zookeeper-partition`, `zookeeper-leader-kill`)
    /// are not in the catalogue.
    pub zookeeper_standalone: bool,
}

impl SoakConfig {
    pub fn new(seed: u64, duration: Duration) -> Self {
        Self {
            seed,
            duration,
            // Issue 14's Sentinel group is not one server to kill and
            // restart: its failures are the chaos rows `sentinel-failover*`.
            backends: Backend::ALL
                .into_iter()
                .filter(|b| b.mints_tokens() && *b != Backend::RedisSentinel)
                .collect(),
            pages_per_backend: 2,
            workers_per_page: 2,
            zookeeper_standalone: false,
        }
    }
}

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGSTOP a random editing worker for 0.5–4 s (past its 2 s TTL or not).
    PauseWorker,
    /// SIGKILL a random editing worker; a new one takes its place.
    KillWorker,
    /// A worker takes the lock, reads, passes its lost-lock check and freezes
    /// before its PUT until another worker has written the page: only the
    /// fence can refuse its write.
    GcPauseWriting,
    /// A worker whose network (to the balancer and to its lock server) holds
    /// everything it sends from its read on, until another worker has
    /// written the page.
    DelayedWrite,
    /// A worker's wall clock (and, half the time, its monotonic clock) jumps
    /// one hour while it holds the lock (libfaketime).
    ClockJump,
    /// A backend's lock service is SIGKILLed and started again 0.5–2 s
    /// later: for ZooKeeper the whole ensemble (all three servers; one
    /// server at a time is `ZookeeperLeaderKill`).
    LockRestart,
    /// The PostgreSQL primary is SIGKILLed and started again 0.5–2 s later.
    PostgresRestart,
    /// The replication link is cut for 0–0.8 s, the primary SIGKILLed, the
    /// standby promoted, and a new standby built from it.
    PostgresFailover,
    /// One of the two gateways is SIGKILLed, and started again 0.5–3 s after
    /// the balancer marked it down.
    GatewayKill,
    /// One ZooKeeper server, the one a random pinned worker talks to (leader
    /// or follower, whichever it is), is cut off from the other two right
    /// after that worker's next grant (or after 10 s without one) for 0.5–4 s
    /// (the session timeout is 2 s), then healed; the next fault waits until
    /// all three serve again. Ensemble only.
    ZookeeperPartition,
    /// The ensemble's leader (found with `srvr`) is SIGKILLed and started
    /// again 0.5–3 s after the kill, once the other two have elected a new
    /// leader. Ensemble only.
    ZookeeperLeaderKill,
}

impl Fault {
    pub const ALL: [Fault; 11] = [
        Fault::PauseWorker,
        Fault::KillWorker,
        Fault::GcPauseWriting,
        Fault::DelayedWrite,
        Fault::ClockJump,
        Fault::LockRestart,
        Fault::PostgresRestart,
        Fault::PostgresFailover,
        Fault::GatewayKill,
        Fault::ZookeeperPartition,
        Fault::ZookeeperLeaderKill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::PauseWorker => "pause-worker",
            Fault::KillWorker => "kill-worker",
            Fault::GcPauseWriting => "gc-pause-writing",
            Fault::DelayedWrite => "delayed-write",
            Fault::ClockJump => "clock-jump",
            Fault::LockRestart => "lock-restart",
            Fault::PostgresRestart => "postgres-restart",
            Fault::PostgresFailover => "postgres-failover",
            Fault::GatewayKill => "gateway-kill",
            Fault::ZookeeperPartition => "zookeeper-partition",
            Fault::ZookeeperLeaderKill => "zookeeper-leader-kill",
        }
    }

    /// Whether the fault needs the ZooKeeper ensemble.
    pub fn needs_ensemble(self) -> bool {
        matches!(self, Fault::ZookeeperPartition | Fault::ZookeeperLeaderKill)
    }
}

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub fault: Fault,
    /// Seconds since the soak started.
    pub at_s: f64,
    pub target: String,
    pub detail: String,
    /// Set when the fault could not be carried out to the end (a straggler
    /// that never got the lock, say). Not a safety violation by itself.
    pub error: Option<String>,
}

/// What the checker found on one page.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PageReport {
    pub page: String,
    pub backend: String,
    /// `wrote` events: edits the gateway acknowledged.
    pub acknowledged: u64,
    /// Rows of `page_history` (every fenced access and write attempt).
    pub attempts: u64,
    pub accepted_writes: u64,
    /// Attempts refused with `stale_token` (the storage's fence).
    pub stale_refused: u64,
    /// Attempts refused with `token_not_current` (the issuer check: the lock
    /// service no longer grants that token), before the fence was asked.
    pub not_current_refused: u64,
    /// Accepted writes whose token is lower than one accepted before.
    pub stale_accepted: u64,
    /// Accepted accesses whose token is lower than the previous accepted one.
    pub token_decreases: u64,
    /// Acknowledged lines missing from the final body.
    pub lost: u64,
    /// Acknowledged lines present more than once.
    pub duplicated: u64,
    /// Acknowledged edits with no accepted PUT of that client, token and version.
    pub acked_not_in_history: u64,
    /// Lines in the body that no worker was told about (a PUT that landed
    /// but whose answer was lost, e.g. to a killed gateway). Allowed.
    pub unacknowledged_lines: u64,
    pub final_version: i64,
}

/// Everything a soak measured.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    pub seed: u64,
    pub minutes: f64,
    pub pages: Vec<PageReport>,
    pub faults: Vec<FaultRecord>,
    /// Error events of the workers (failed requests and lock calls, retried).
    pub worker_errors: u64,
    /// Workers started, including stragglers and replacements.
    pub workers: u64,
    pub violations: Vec<String>,
    pub wall_s: f64,
    /// `ensemble` (three servers in network namespaces) or `standalone`.
    pub zookeeper: &'static str,
}

impl SoakReport {
    pub fn faults_by_kind(&self) -> BTreeMap<Fault, (u64, u64)> {
        let mut out: BTreeMap<Fault, (u64, u64)> = BTreeMap::new();
        for f in &self.faults {
            let e = out.entry(f.fault).or_default();
            e.0 += 1;
            if f.error.is_some() {
                e.1 += 1;
            }
        }
        out
    }

    pub fn total(&self, f: impl Fn(&PageReport) -> u64) -> u64 {
        self.pages.iter().map(f).sum()
    }

    /// The Markdown tables for docs/CHAOS.md.
    pub fn table(&self) -> String {
        let mut by_backend: BTreeMap<&str, PageReport> = BTreeMap::new();
        for p in &self.pages {
            let b = by_backend.entry(&p.backend).or_default();
            b.backend = p.backend.clone();
            b.acknowledged += p.acknowledged;
            b.attempts += p.attempts;
            b.accepted_writes += p.accepted_writes;
            b.stale_refused += p.stale_refused;
            b.not_current_refused += p.not_current_refused;
            b.stale_accepted += p.stale_accepted;
            b.token_decreases += p.token_decreases;
            b.lost += p.lost;
            b.duplicated += p.duplicated;
            b.acked_not_in_history += p.acked_not_in_history;
            b.unacknowledged_lines += p.unacknowledged_lines;
        }
        let mut t = String::from(
            "| backend | edits acknowledged | attempts in history | accepted writes | stale refused (fence) | refused (issuer check) | stale accepted | tokens decreasing | lost | duplicated | acked, not in history | unacknowledged lines |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let mut all = PageReport {
            backend: "**all**".into(),
            ..Default::default()
        };
        for b in by_backend.values() {
            t.push_str(&row_of(b));
            all.acknowledged += b.acknowledged;
            all.attempts += b.attempts;
            all.accepted_writes += b.accepted_writes;
            all.stale_refused += b.stale_refused;
            all.not_current_refused += b.not_current_refused;
            all.stale_accepted += b.stale_accepted;
            all.token_decreases += b.token_decreases;
            all.lost += b.lost;
            all.duplicated += b.duplicated;
            all.acked_not_in_history += b.acked_not_in_history;
            all.unacknowledged_lines += b.unacknowledged_lines;
        }
        t.push_str(&row_of(&all));
        t.push_str("\n| fault | injected | could not complete |\n|---|---:|---:|\n");
        let mut n = 0;
        for (f, (count, failed)) in self.faults_by_kind() {
            t.push_str(&format!("| {} | {count} | {failed} |\n", f.name()));
            n += count;
        }
        t.push_str(&format!("| **all** | {n} | |\n"));
        t
    }
}

fn row_of(b: &PageReport) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        b.backend,
        b.acknowledged,
        b.attempts,
        b.accepted_writes,
        b.stale_refused,
        b.not_current_refused,
        b.stale_accepted,
        b.token_decreases,
        b.lost,
        b.duplicated,
        b.acked_not_in_history,
        b.unacknowledged_lines
    )
}

/// One backend's lock server(s), owned by the soak so it can restart them.
struct LockServer {
    backend: Backend,
    redis: Option<Redis>,
    /// The three-node ensemble ([`harness::ZooKeeperHosts`], each server on
    /// a network namespace of its own so it can be partitioned), or one
    /// server with `--zookeeper-standalone`.
    zookeeper: Option<Zk>,
    postgres: Option<Postgres>,
    mariadb: Option<MariaDb>,
    lease_url: Option<String>,
}

impl LockServer {
    async fn start(backend: Backend, zookeeper_standalone: bool) -> anyhow::Result<Self> {
        let mut me = Self {
            backend,
            redis: None,
            zookeeper: None,
            postgres: None,
            mariadb: None,
            lease_url: None,
        };
        match backend {
            Backend::Redis => me.redis = Some(Redis::start_with(Persistence::AofAlways).await),
            Backend::Zookeeper if zookeeper_standalone => {
                me.zookeeper = Some(Zk::Standalone(ZooKeeper::start().await))
            }
            Backend::Zookeeper => {
                if !harness::netns::available() {
                    bail!(
                        "the soak's ZooKeeper ensemble runs in network namespaces, which need \
                         root and `unshare`; run as root or pass --zookeeper-standalone"
                    );
                }
                me.zookeeper = Some(Zk::Ensemble(ZooKeeperHosts::start().await))
            }
            Backend::LeasePostgres => {
                let pg = Postgres::start().await;
                me.lease_url = Some(pg.create_database().await);
                me.postgres = Some(pg);
            }
            Backend::LeaseMysql => {
                let db = MariaDb::start().await;
                me.lease_url = Some(db.create_database().await);
                me.mariadb = Some(db);
            }
            Backend::Redlock => bail!("the soak runs fenced backends only"),
            Backend::RedisSentinel => {
                bail!("the soak does not run the Sentinel group (see the sentinel-failover rows)")
            }
        }
        Ok(me)
    }

    /// The ensemble, if this is ZooKeeper on three servers.
    fn ensemble(&mut self) -> Option<&mut ZooKeeperHosts> {
        match self.zookeeper.as_mut()? {
            Zk::Ensemble(e) => Some(e),
            Zk::Standalone(_) => None,
        }
    }

    fn is_ensemble(&self) -> bool {
        matches!(self.zookeeper, Some(Zk::Ensemble(_)))
    }

    /// The gateways' `--issuer NAME=URL` for this server (the names the
    /// worker sends as `Fencing-Issuer`). For the ensemble: all three servers.
    fn issuer(&self) -> Option<(String, String)> {
        let url = match self.backend {
            Backend::Redis => self.redis.as_ref().map(Redis::url)?,
            Backend::Zookeeper => format!(
                "zookeeper://{}",
                self.zookeeper.as_ref().map(Zk::connect_string)?
            ),
            Backend::LeasePostgres | Backend::LeaseMysql => self.lease_url.clone()?,
            Backend::Redlock | Backend::RedisSentinel => return None,
        };
        Some((self.backend.name().to_string(), url))
    }

    /// The TCP ports a worker reaches this service on (three for the ensemble).
    fn ports(&self) -> Vec<u16> {
        match self.backend {
            Backend::Redis => self.redis.iter().map(Redis::port).collect(),
            Backend::Zookeeper => self.zookeeper.iter().flat_map(Zk::ports).collect(),
            Backend::LeasePostgres => self.postgres.iter().map(Postgres::port).collect(),
            Backend::LeaseMysql => self.mariadb.iter().map(MariaDb::port).collect(),
            Backend::Redlock | Backend::RedisSentinel => vec![],
        }
    }

    /// The worker's flags for this server. `via` maps a server port to a
    /// proxy's port; `pin` names the one ensemble server the worker may use
    /// (`None`: all three).
    fn worker_args(&self, via: &HashMap<u16, u16>, pin: Option<usize>) -> Vec<(String, String)> {
        let (flag, url) = match self.backend {
            Backend::Redis => (
                "--redis-url",
                self.redis.as_ref().map(Redis::url).unwrap_or_default(),
            ),
            Backend::Zookeeper => (
                "--zookeeper-connect",
                match (self.zookeeper.as_ref(), pin) {
                    (Some(Zk::Ensemble(e)), Some(i)) => e.connect_string_to(i),
                    (Some(zk), _) => zk.connect_string(),
                    (None, _) => String::new(),
                },
            ),
            Backend::LeasePostgres => {
                ("--database-url", self.lease_url.clone().unwrap_or_default())
            }
            Backend::LeaseMysql => ("--mysql-url", self.lease_url.clone().unwrap_or_default()),
            Backend::Redlock | Backend::RedisSentinel => ("--redlock-urls", String::new()),
        };
        let url = self
            .ports()
            .into_iter()
            .fold(url, |url, port| match via.get(&port) {
                Some(p) => via_proxy(&url, port, *p),
                None => url,
            });
        vec![
            ("--backend".into(), self.backend.name().into()),
            (flag.into(), url),
        ]
    }

    /// SIGKILL the service: every server of it (all three of the ensemble).
    fn kill(&mut self) {
        if let Some(r) = self.redis.as_mut() {
            r.kill();
        }
        if let Some(z) = self.zookeeper.as_mut() {
            z.kill_all();
        }
        if let Some(p) = self.postgres.as_mut() {
            p.kill();
        }
        if let Some(m) = self.mariadb.as_mut() {
            m.kill();
        }
    }

    /// Start it again and wait until it serves (the ensemble: all three).
    async fn start_again(&mut self) -> anyhow::Result<()> {
        if let Some(r) = self.redis.as_mut() {
            r.start_again().await;
        }
        match self.zookeeper.as_mut() {
            Some(Zk::Standalone(z)) => z.start_again().await,
            Some(Zk::Ensemble(e)) => {
                for i in 0..e.len() {
                    e.process(i).start()?;
                }
                e.wait_all_serving(ZOOKEEPER_WAIT)
                    .await
                    .map_err(|err| anyhow::anyhow!("ensemble after the restart: {err}"))?;
            }
            None => {}
        }
        if let Some(p) = self.postgres.as_mut() {
            p.start_again().await;
        }
        if let Some(m) = self.mariadb.as_mut() {
            m.start_again().await;
        }
        Ok(())
    }
}

struct Page {
    name: String,
    /// Index into `Soak::locks`.
    lock: usize,
    log: EventLog,
}

/// A worker that edits one page until the end of the soak.
struct Editor {
    page: usize,
    /// The one ensemble server this worker may talk to (`None`: all).
    pin: Option<usize>,
    proc: WorkerProc,
}

struct Soak {
    config: SoakConfig,
    rng: StdRng,
    started: Instant,
    deadline: Instant,
    pg: PostgresPair,
    db_name: String,
    db_url: String,
    gateway_ports: Vec<u16>,
    gateways: Vec<Option<GatewayProc>>,
    /// The gateways' `--issuer`s: every lock server, by backend name.
    issuers: Vec<(String, String)>,
    /// The clients the gateways have keys for; workers take them in order.
    clients: Vec<String>,
    balancer: Haproxy,
    locks: Vec<LockServer>,
    pages: Vec<Page>,
    editors: Vec<Editor>,
    /// Killed editors, stragglers, jumpers: reaped at the end.
    others: Vec<(usize, WorkerProc)>,
    /// libfaketime offset files of the jumpers, alive until the end.
    clocks: Vec<tempfile::NamedTempFile>,
    faults: Vec<FaultRecord>,
    /// The kinds of fault this stack can take (the ensemble's need one).
    kinds: Vec<Fault>,
    /// The ensemble server the next pinned editor talks to (round robin).
    next_pin: usize,
    next_client: usize,
    /// Each client's role, for the fault log.
    roles: HashMap<String, String>,
}

const FAULT_WAIT: Duration = Duration::from_secs(40);

/// How long `zookeeper-partition` waits for its pinned worker's grant
/// before it cuts anyway.
const PARTITION_AIM: Duration = Duration::from_secs(10);

/// How long the ensemble may take to serve again with all three servers
/// (after a heal, a restart, an election).
const ZOOKEEPER_WAIT: Duration = Duration::from_secs(60);

/// Soak client `i`: the worker's id, its key's client and the lock holder.
fn client_name(i: usize) -> String {
    format!("soak{i}")
}

/// How many clients get keys: the gateways read their keys once, and a soak
/// starts workers as it goes (replacements, stragglers). A 30-minute run
/// started 129; this leaves room for several times the rate.
fn client_capacity(duration: Duration) -> usize {
    64 + 12 * (duration.as_secs() as usize / 60 + 1)
}

/// Run the soak and check it.
pub async fn run(config: SoakConfig) -> anyhow::Result<SoakReport> {
    let started_wall = Instant::now();
    let mut soak = Soak::start(config).await?;
    soak.inject_faults().await;
    let stuck = soak.drain().await;
    let mut report = soak.check().await?;
    report.violations.extend(stuck);
    report.wall_s = started_wall.elapsed().as_secs_f64();
    Ok(report)
}

impl Soak {
    async fn start(config: SoakConfig) -> anyhow::Result<Self> {
        let rng = StdRng::seed_from_u64(config.seed);
        eprintln!("soak: starting PostgreSQL primary + synchronous standby");
        let pg = PostgresPair::start(Replication::Sync).await;
        let db_url = pg.create_database().await;
        let db_name = db_url
            .rsplit('/')
            .next()
            .and_then(|s| s.split('?').next())
            .context("database name")?
            .to_string();
        let mut locks = vec![];
        let mut pages = vec![];
        for &backend in &config.backends {
            eprintln!("soak: starting the lock server of {backend}");
            locks.push(LockServer::start(backend, config.zookeeper_standalone).await?);
            for i in 0..config.pages_per_backend {
                pages.push(Page {
                    name: format!("soak-{}-{i}-{:x}", backend.name(), config.seed & 0xffff),
                    lock: locks.len() - 1,
                    log: EventLog::default(),
                });
            }
        }
        // Trust on, as in the demo: every worker has its own key, and the
        // gateways check every token with the lock server that issued it.
        let issuers: Vec<(String, String)> = locks.iter().filter_map(LockServer::issuer).collect();
        let clients: Vec<String> = (0..client_capacity(config.duration))
            .map(client_name)
            .collect();
        let gateway_ports = vec![harness::free_port(), harness::free_port()];
        let mut gateways = vec![];
        for &port in &gateway_ports {
            gateways.push(Some(
                GatewayProc::spawn_for(&db_url, true, &issuers, &clients, port).await?,
            ));
        }
        let balancer = Haproxy::start(&gateway_ports).await;
        balancer
            .wait_up(2, Duration::from_secs(30))
            .await
            .map_err(|e| anyhow::anyhow!("balancer: {e}"))?;
        let ensemble = locks.iter().any(LockServer::is_ensemble);
        let kinds: Vec<Fault> = Fault::ALL
            .into_iter()
            .filter(|f| ensemble || !f.needs_ensemble())
            .collect();
        let started = Instant::now();
        let deadline = started + config.duration;
        let mut me = Self {
            config,
            rng,
            started,
            deadline,
            pg,
            db_name,
            db_url,
            gateway_ports,
            gateways,
            issuers,
            clients,
            balancer,
            locks,
            pages,
            editors: vec![],
            others: vec![],
            clocks: vec![],
            faults: vec![],
            kinds,
            next_pin: 0,
            next_client: 0,
            roles: HashMap::new(),
        };
        // On the ensemble, each ZooKeeper page's first editor is pinned to
        // one server (round robin, so the pages use different servers) and
        // the others use all three: a partition of that server then cuts a
        // lock holder off with the minority, while its peers go on with the
        // majority.
        for page in 0..me.pages.len() {
            for n in 0..me.config.workers_per_page {
                let pin = if n == 0 { me.next_pin_for(page) } else { None };
                me.spawn_editor(page, pin)?;
            }
        }
        eprintln!(
            "soak: {} workers on {} pages through the balancer; faults for {:?}",
            me.editors.len(),
            me.pages.len(),
            me.config.duration
        );
        Ok(me)
    }

    /// The next client with a key (see [`client_capacity`]).
    fn client(&mut self) -> anyhow::Result<String> {
        let client = self
            .clients
            .get(self.next_client)
            .cloned()
            .with_context(|| {
                format!(
                    "all {} clients with keys are taken (see client_capacity)",
                    self.clients.len()
                )
            })?;
        self.next_client += 1;
        Ok(client)
    }

    /// The next ensemble server for a pinned editor of `page`, if the page's
    /// lock service is the ensemble.
    fn next_pin_for(&mut self, page: usize) -> Option<usize> {
        let lock = &self.locks[self.pages[page].lock];
        let servers = match lock.zookeeper.as_ref()? {
            Zk::Ensemble(e) => e.len(),
            Zk::Standalone(_) => return None,
        };
        let pin = self.next_pin % servers;
        self.next_pin += 1;
        Some(pin)
    }

    /// A worker of `page` in `role` (`w` editor, `gc`, `dw`, `cj` stragglers),
    /// reaching its lock service through the proxies of `via` and, if
    /// `pin`ned, through that one ensemble server only.
    fn spec(
        &mut self,
        page: usize,
        role: &str,
        gateway: &str,
        via: &HashMap<u16, u16>,
        pin: Option<usize>,
    ) -> anyhow::Result<WorkerSpec> {
        let client = self.client()?;
        let role = match pin {
            Some(i) => format!("{role}, on zk{} only", i + 1),
            None => role.to_string(),
        };
        self.roles.insert(client.clone(), role);
        let work_ms = self.rng.random_range(20..=150);
        let lock = &self.locks[self.pages[page].lock];
        Ok(WorkerSpec {
            client,
            args: lock.worker_args(via, pin),
            env: vec![],
        }
        .arg("--gateway", gateway)
        .arg("--page", &self.pages[page].name)
        .arg("--ttl", "2s")
        .arg("--wait", "20s")
        .arg("--work-ms", work_ms)
        .arg("--fencing", "on"))
    }

    /// `client (role)`, for the fault log.
    fn who(&self, client: &str) -> String {
        match self.roles.get(client) {
            Some(role) => format!("{client} ({role})"),
            None => client.to_string(),
        }
    }

    fn spawn_editor(&mut self, page: usize, pin: Option<usize>) -> anyhow::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let gateway = self.balancer.url();
        let spec = self
            .spec(page, "w", &gateway, &HashMap::new(), pin)?
            .arg("--duration", format!("{}ms", left.as_millis().max(1)));
        let proc = WorkerProc::spawn(&spec, &self.pages[page].log)?;
        self.editors.push(Editor { page, pin, proc });
        Ok(())
    }

    fn spawn_other(&mut self, page: usize, spec: &WorkerSpec) -> anyhow::Result<usize> {
        let proc = WorkerProc::spawn(spec, &self.pages[page].log)?;
        self.others.push((page, proc));
        Ok(self.others.len() - 1)
    }

    async fn inject_faults(&mut self) {
        let mut first_pass: Vec<Fault> = self.kinds.clone();
        first_pass.shuffle(&mut self.rng);
        while Instant::now() < self.deadline {
            let gap = Duration::from_millis(self.rng.random_range(500..=3000));
            tokio::time::sleep(gap.min(self.deadline.saturating_duration_since(Instant::now())))
                .await;
            if Instant::now() >= self.deadline {
                break;
            }
            let fault = match first_pass.pop() {
                Some(f) => f,
                None => self.kinds[self.rng.random_range(0..self.kinds.len())],
            };
            let at_s = self.started.elapsed().as_secs_f64();
            let mut record = FaultRecord {
                fault,
                at_s,
                target: String::new(),
                detail: String::new(),
                error: None,
            };
            if let Err(e) = self.inject(fault, &mut record).await {
                record.error = Some(format!("{e:#}"));
            }
            eprintln!(
                "soak {:>6.1}s {:<18} {} {}{}",
                record.at_s,
                fault.name(),
                record.target,
                record.detail,
                record
                    .error
                    .as_deref()
                    .map(|e| format!(" [could not complete: {}]", e.lines().next().unwrap_or("")))
                    .unwrap_or_default()
            );
            self.faults.push(record);
        }
    }

    async fn inject(&mut self, fault: Fault, record: &mut FaultRecord) -> anyhow::Result<()> {
        match fault {
            Fault::PauseWorker => {
                let i = self.rng.random_range(0..self.editors.len());
                let pause = Duration::from_millis(self.rng.random_range(500..=4000));
                let editor = &self.editors[i];
                record.target = self.who(&editor.proc.client);
                record.detail = format!("stopped {} ms", pause.as_millis());
                editor.proc.pause();
                tokio::time::sleep(pause).await;
                editor.proc.resume();
            }
            Fault::KillWorker => {
                let i = self.rng.random_range(0..self.editors.len());
                let mut editor = self.editors.swap_remove(i);
                record.target = self.who(&editor.proc.client);
                editor.proc.crash().await;
                let page = editor.page;
                // A pinned editor's replacement is pinned too, to the next
                // server, so that every server gets its turn.
                let pin = match editor.pin {
                    Some(_) => self.next_pin_for(page),
                    None => None,
                };
                self.others.push((page, editor.proc));
                self.spawn_editor(page, pin)?;
                record.detail = format!(
                    "SIGKILL; replaced by {}",
                    self.editors.last().map_or("?", |e| e.proc.client.as_str())
                );
            }
            Fault::GcPauseWriting => {
                let page = self.rng.random_range(0..self.pages.len());
                let gateway = self.balancer.url();
                let spec = self
                    .spec(page, "gc", &gateway, &HashMap::new(), None)?
                    .arg("--edits", 1)
                    .arg("--stop-self-at", "writing");
                record.target = spec.client.clone();
                let w = self.spawn_other(page, &spec)?;
                let log = self.pages[page].log.clone();
                let client = spec.client.clone();
                let frozen = log
                    .wait_for("the straggler's `writing`", FAULT_WAIT, |e| {
                        e.client == client && e.kind() == "writing"
                    })
                    .await;
                if let Err(e) = frozen {
                    self.others[w].1.crash().await;
                    return Err(e);
                }
                let since = now_ms();
                self.others[w]
                    .1
                    .wait_stopped(Duration::from_secs(5))
                    .await?;
                let other = wait_other_wrote(&log, &client, since).await;
                self.others[w].1.resume();
                record.detail = "frozen before its PUT until another holder wrote".into();
                other?;
            }
            Fault::DelayedWrite => {
                let page = self.rng.random_range(0..self.pages.len());
                let gw_proxy =
                    DelayProxy::start(([127, 0, 0, 1], self.balancer.port()).into()).await?;
                // One proxy per lock server (three for the ensemble), all
                // held together.
                let mut lock_proxies = vec![];
                let mut via = HashMap::new();
                for port in self.locks[self.pages[page].lock].ports() {
                    let proxy = DelayProxy::start(([127, 0, 0, 1], port).into()).await?;
                    via.insert(port, proxy.port());
                    lock_proxies.push(proxy);
                }
                let gateway = format!("http://127.0.0.1:{}", gw_proxy.port());
                let spec = self
                    .spec(page, "dw", &gateway, &via, None)?
                    .arg("--edits", 1);
                record.target = spec.client.clone();
                self.spawn_other(page, &spec)?;
                let log = self.pages[page].log.clone();
                let client = spec.client.clone();
                let c = client.clone();
                log.wait_for("the delayed worker's `read`", FAULT_WAIT, move |e| {
                    e.client == c && e.kind() == "read"
                })
                .await?;
                gw_proxy.set_mode(Mode::Hold);
                lock_proxies.iter().for_each(|p| p.set_mode(Mode::Hold));
                let since = now_ms();
                let c = client.clone();
                let writing = log
                    .wait_for("the delayed worker's `writing`", FAULT_WAIT, move |e| {
                        e.client == c && e.kind() == "writing"
                    })
                    .await;
                let other = match writing {
                    Ok(_) => wait_other_wrote(&log, &client, since).await,
                    Err(e) => Err(e),
                };
                gw_proxy.set_mode(Mode::Pass);
                lock_proxies.iter().for_each(|p| p.set_mode(Mode::Pass));
                record.detail = format!(
                    "{} bytes held until another holder wrote",
                    gw_proxy.bytes_delayed()
                );
                // The proxies must outlive the worker's last request.
                let c = client.clone();
                let _ = log
                    .wait_for("the delayed worker's summary", FAULT_WAIT, move |e| {
                        e.client == c && e.kind() == "summary"
                    })
                    .await;
                other?;
            }
            Fault::ClockJump => {
                let page = self.rng.random_range(0..self.pages.len());
                let monotonic = self.rng.random_bool(0.5);
                let offset = tempfile::NamedTempFile::new()?;
                std::fs::write(offset.path(), "+0\n")?;
                let gateway = self.balancer.url();
                let mut spec = self
                    .spec(page, "cj", &gateway, &HashMap::new(), None)?
                    .arg("--edits", 3);
                spec.env = vec![
                    ("LD_PRELOAD".into(), crate::scenarios::LIBFAKETIME.into()),
                    (
                        "FAKETIME_TIMESTAMP_FILE".into(),
                        offset.path().display().to_string(),
                    ),
                    ("FAKETIME_NO_CACHE".into(), "1".into()),
                ];
                if !monotonic {
                    spec.env
                        .push(("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()));
                }
                record.target = spec.client.clone();
                self.spawn_other(page, &spec)?;
                let client = spec.client.clone();
                self.pages[page]
                    .log
                    .wait_for("the jumper's `acquired`", FAULT_WAIT, move |e| {
                        e.client == client && e.kind() == "acquired"
                    })
                    .await?;
                std::fs::write(offset.path(), "+1h\n")?;
                self.clocks.push(offset);
                record.detail = format!(
                    "+1h while holding ({})",
                    if monotonic {
                        "monotonic too"
                    } else {
                        "wall clock only"
                    }
                );
            }
            Fault::LockRestart => {
                let i = self.rng.random_range(0..self.locks.len());
                let outage = Duration::from_millis(self.rng.random_range(500..=2000));
                record.target = match self.locks[i].is_ensemble() {
                    true => "zookeeper (all three servers)".into(),
                    false => self.locks[i].backend.name().into(),
                };
                self.locks[i].kill();
                tokio::time::sleep(outage).await;
                let restart = Instant::now();
                let serving = self.locks[i].start_again().await;
                record.detail = format!(
                    "down {} ms; serving {} ms after the start",
                    outage.as_millis(),
                    restart.elapsed().as_millis()
                );
                serving?;
            }
            Fault::PostgresRestart => {
                let outage = Duration::from_millis(self.rng.random_range(500..=2000));
                record.target = format!("primary on port {}", self.pg.primary_port());
                self.pg.kill_primary();
                tokio::time::sleep(outage).await;
                self.pg.start_primary_again().await;
                record.detail = format!("down {} ms", outage.as_millis());
            }
            Fault::PostgresFailover => {
                let cut = Duration::from_millis(self.rng.random_range(0..=800));
                record.target = format!("primary on port {}", self.pg.primary_port());
                self.pg.cut_replication();
                tokio::time::sleep(cut).await;
                self.pg.kill_primary();
                let promotion = self.pg.promote().await;
                let rebuild = Instant::now();
                self.pg.rebuild_standby().await;
                record.detail = format!(
                    "link cut {} ms before the kill; promoted port {} in {} ms; new synchronous standby in {} ms",
                    cut.as_millis(),
                    self.pg.primary_port(),
                    promotion.as_millis(),
                    rebuild.elapsed().as_millis()
                );
            }
            Fault::GatewayKill => {
                let i = self.rng.random_range(0..self.gateways.len());
                let down_for = Duration::from_millis(self.rng.random_range(500..=3000));
                record.target = format!("gw{}", i + 1);
                if let Some(pid) = self.gateways[i].as_ref().and_then(GatewayProc::pid) {
                    kill(Pid::from_raw(pid as i32), Signal::SIGKILL)?;
                }
                let killed = Instant::now();
                let marked = self
                    .balancer
                    .wait_down(&format!("gw{}", i + 1), Duration::from_secs(15))
                    .await;
                let down_after = killed.elapsed();
                self.gateways[i] = None;
                tokio::time::sleep(down_for).await;
                self.gateways[i] = Some(
                    GatewayProc::spawn_for(
                        &self.db_url,
                        true,
                        &self.issuers,
                        &self.clients,
                        self.gateway_ports[i],
                    )
                    .await?,
                );
                self.balancer
                    .wait_up(2, Duration::from_secs(30))
                    .await
                    .map_err(|e| anyhow::anyhow!("balancer: {e}"))?;
                record.detail = format!(
                    "SIGKILL; marked down after {} ms; started again {} ms later",
                    down_after.as_millis(),
                    down_for.as_millis()
                );
                marked.map_err(|e| anyhow::anyhow!("never marked down: {e}"))?;
            }
            Fault::ZookeeperPartition => {
                let pinned: Vec<usize> = (0..self.editors.len())
                    .filter(|&e| self.editors[e].pin.is_some())
                    .collect();
                let &e = pinned
                    .choose(&mut self.rng)
                    .context("no editor is pinned to one ensemble server")?;
                let hold = Duration::from_millis(self.rng.random_range(500..=4000));
                let (page, cut) = (self.editors[e].page, self.editors[e].pin.unwrap_or(0));
                let client = self.editors[e].proc.client.clone();
                let who = self.who(&client);
                let log = self.pages[page].log.clone();
                let lock = self.pages[page].lock;
                // Aim the cut at a lock holder: it comes when the pinned
                // worker has just been granted the lock (or, if that takes
                // longer than PARTITION_AIM, whenever; the detail says which).
                let since = now_ms();
                let c = client.clone();
                let _ = log
                    .wait_for("the pinned worker's grant", PARTITION_AIM, move |ev| {
                        ev.client == c && ev.kind() == "acquired" && ev.received_ms >= since
                    })
                    .await;
                let zk = self.locks[lock]
                    .ensemble()
                    .context("the pinned editor's page has no ensemble")?;
                let mode = zk.mode(cut).await.unwrap_or_else(|| "not serving".into());
                record.target = format!("zk{} ({mode}), {who}", cut + 1);
                let cut_ms = now_ms();
                zk.partition(cut)?;
                tokio::time::sleep(hold).await;
                // Whether the cut-off server noticed (a follower gives up
                // after syncLimit × tickTime = 2.5 s without its leader).
                let mode_at_heal = zk.mode(cut).await.unwrap_or_else(|| "not serving".into());
                zk.heal()?;
                let healed = Instant::now();
                let serving = zk.wait_all_serving(ZOOKEEPER_WAIT).await;
                let rejoined = healed.elapsed();
                let events = log.all();
                let holding = events
                    .iter()
                    .rfind(|ev| ev.client == client && ev.received_ms < cut_ms)
                    .is_some_and(|ev| {
                        matches!(ev.kind(), "acquired" | "read" | "writing" | "wrote")
                    });
                let during: Vec<&Event> = events
                    .iter()
                    .filter(|ev| ev.received_ms >= cut_ms)
                    .collect();
                let count = |mine: bool, kind: &str| {
                    during
                        .iter()
                        .filter(|ev| (ev.client == client) == mine && ev.kind() == kind)
                        .count()
                };
                record.detail = format!(
                    "cut off {} ms (the session timeout is 2 s), {} at the heal; the pinned \
                     worker {} the lock at the cut; all three serving {} ms after the heal; on \
                     its page from the cut on: pinned worker {} wrote, {} lost, {} rejected, {} \
                     errors; the others {} acquired, {} wrote",
                    hold.as_millis(),
                    mode_at_heal,
                    if holding { "held" } else { "did not hold" },
                    rejoined.as_millis(),
                    count(true, "wrote"),
                    count(true, "lost"),
                    count(true, "rejected"),
                    count(true, "error"),
                    count(false, "acquired"),
                    count(false, "wrote"),
                );
                serving.map_err(|err| anyhow::anyhow!("after the heal: {err}"))?;
            }
            Fault::ZookeeperLeaderKill => {
                let down = Duration::from_millis(self.rng.random_range(500..=3000));
                let lock = self
                    .locks
                    .iter()
                    .position(LockServer::is_ensemble)
                    .context("no ensemble")?;
                let zk = self.locks[lock].ensemble().context("no ensemble")?;
                let leader = zk.leader().await.context("no server says it leads")?;
                record.target = format!("zk{} (leader)", leader + 1);
                let killed = Instant::now();
                zk.kill(leader);
                let zk_ref: &ZooKeeperHosts = zk;
                let elected = harness::wait_until(ZOOKEEPER_WAIT, || async move {
                    match zk_ref.leader().await {
                        Some(l) if l != leader => Ok(l),
                        other => Err(format!("leader {other:?}")),
                    }
                })
                .await;
                let election = killed.elapsed();
                tokio::time::sleep(down.saturating_sub(election)).await;
                let restarted = killed.elapsed();
                zk.process(leader).start()?;
                let started = Instant::now();
                let serving = zk.wait_all_serving(ZOOKEEPER_WAIT).await;
                record.detail = format!(
                    "SIGKILL; {} {} ms after the kill; started again {} ms after the kill, \
                     all three serving {} ms later",
                    match &elected {
                        Ok(l) => format!("zk{} led", l + 1),
                        Err(_) => "no new leader".into(),
                    },
                    election.as_millis(),
                    restarted.as_millis(),
                    started.elapsed().as_millis()
                );
                elected.map_err(|err| anyhow::anyhow!("no new leader: {err}"))?;
                serving.map_err(|err| anyhow::anyhow!("after the restart: {err}"))?;
            }
        }
        Ok(())
    }

    /// Let every worker finish; the ones that do not are violations.
    async fn drain(&mut self) -> Vec<String> {
        eprintln!("soak: faults over; waiting for the workers to finish");
        let mut stuck = vec![];
        for (_, w) in self.others.iter_mut() {
            if w.killed_at.is_none() {
                w.resume();
                if let Err(e) = w.wait_exit(Duration::from_secs(90)).await {
                    stuck.push(format!("{e:#}"));
                }
            }
        }
        for e in self.editors.iter_mut() {
            e.proc.resume();
            if let Err(err) = e.proc.wait_exit(Duration::from_secs(90)).await {
                stuck.push(format!("{err:#}"));
            }
        }
        stuck
    }

    async fn check(&self) -> anyhow::Result<SoakReport> {
        let url = self.pg.primary_url(&self.db_name);
        let names: Vec<String> = self.pages.iter().map(|p| p.name.clone()).collect();
        let attempts = history::load(&url, &names).await?;
        let mut by_page: HashMap<String, Vec<Attempt>> = HashMap::new();
        for a in attempts {
            by_page.entry(a.page_id.clone()).or_default().push(a);
        }
        let mut report = SoakReport {
            seed: self.config.seed,
            minutes: self.config.duration.as_secs_f64() / 60.0,
            pages: vec![],
            faults: self.faults.clone(),
            worker_errors: 0,
            workers: (self.editors.len() + self.others.len()) as u64,
            violations: vec![],
            wall_s: 0.0,
            zookeeper: if self.locks.iter().any(LockServer::is_ensemble) {
                "ensemble"
            } else {
                "standalone"
            },
        };
        for page in &self.pages {
            let events = page.log.all();
            report.worker_errors += events.iter().filter(|e| e.kind() == "error").count() as u64;
            let state = history::page_state(&url, &page.name).await?;
            let attempts = by_page.get(&page.name).cloned().unwrap_or_default();
            let (pr, mut violations) = check_page(
                &page.name,
                self.locks[page.lock].backend.name(),
                &attempts,
                &events,
                state.as_ref(),
            );
            report.pages.push(pr);
            report.violations.append(&mut violations);
        }
        Ok(report)
    }
}

/// Wait (bounded) until a client other than `client` wrote the page after `since`.
async fn wait_other_wrote(log: &EventLog, client: &str, since: i64) -> anyhow::Result<Event> {
    let client = client.to_string();
    log.wait_for("another holder's `wrote`", FAULT_WAIT, move |e| {
        e.client != client && e.kind() == "wrote" && e.received_ms >= since
    })
    .await
}

/// The checker over one page: its history in commit order, the workers'
/// events, and the final row `(body, version, fence)`.
pub fn check_page(
    page: &str,
    backend: &str,
    attempts: &[Attempt],
    events: &[Event],
    state: Option<&(Option<String>, i64, Option<i64>)>,
) -> (PageReport, Vec<String>) {
    let mut v = vec![];
    let mut r = PageReport {
        page: page.into(),
        backend: backend.into(),
        attempts: attempts.len() as u64,
        ..Default::default()
    };
    // 1. Accepted tokens never decrease in commit order.
    let mut highest: Option<(i64, i64)> = None;
    for a in attempts {
        match a.outcome.as_str() {
            "stale_token" => r.stale_refused += 1,
            "token_not_current" => r.not_current_refused += 1,
            _ => {}
        }
        if a.accepted() && a.method == "PUT" {
            r.accepted_writes += 1;
        }
        let (true, Some(t)) = (a.accepted(), a.token) else {
            continue;
        };
        if let Some((h, at)) = highest {
            if t < h {
                r.token_decreases += 1;
                v.push(format!(
                    "{page}: token {t} accepted at seq {} after token {h} at seq {at}",
                    a.seq
                ));
            }
        }
        if highest.is_none_or(|(h, _)| t > h) {
            highest = Some((t, a.seq));
        }
    }
    r.stale_accepted = history::stale_writes_accepted(attempts, None);

    // 2. Every acknowledged edit is an accepted PUT of the history.
    let wrote: Vec<&Event> = events.iter().filter(|e| e.kind() == "wrote").collect();
    r.acknowledged = wrote.len() as u64;
    for e in &wrote {
        let token = e.u64("token").map(|t| t as i64);
        let version = e.u64("version").map(|t| t as i64);
        let found = attempts.iter().any(|a| {
            a.method == "PUT"
                && a.accepted()
                && a.client_id.as_deref() == Some(e.client.as_str())
                && a.token == token
                && Some(a.version) == version
        });
        if !found {
            r.acked_not_in_history += 1;
            v.push(format!(
                "{page}: acknowledged edit of {} (token {token:?}, version {version:?}) has no accepted PUT in the history",
                e.client
            ));
        }
    }

    // 3. Every acknowledged line is in the final body exactly once.
    let (body, version, fence) = match state {
        Some((body, version, fence)) => (body.clone().unwrap_or_default(), *version, *fence),
        None => (String::new(), 0, None),
    };
    r.final_version = version;
    let mut counts: HashMap<&str, u64> = HashMap::new();
    for line in body.lines() {
        *counts.entry(line.trim()).or_default() += 1;
    }
    let mut acked_lines = std::collections::HashSet::new();
    for e in &wrote {
        let Some(line) = e.str("line") else { continue };
        acked_lines.insert(line);
        match counts.get(line).copied().unwrap_or(0) {
            0 => {
                r.lost += 1;
                v.push(format!(
                    "{page}: acknowledged line {line:?} is not in the final body"
                ));
            }
            1 => {}
            n => {
                r.duplicated += 1;
                v.push(format!(
                    "{page}: acknowledged line {line:?} is {n} times in the final body"
                ));
            }
        }
    }
    r.unacknowledged_lines = counts
        .keys()
        .filter(|l| !l.is_empty() && !acked_lines.contains(*l))
        .count() as u64;

    // 4. The final body is the last accepted write, and the fence the highest token.
    if let Some(last) = attempts
        .iter()
        .rev()
        .find(|a| a.method == "PUT" && a.accepted())
    {
        if last.version != version {
            v.push(format!(
                "{page}: the last accepted write made version {}, the page is at {version}",
                last.version
            ));
        }
        let last_line = body.lines().last().unwrap_or("").trim();
        let client = last.client_id.as_deref().unwrap_or("");
        let token = last.token.map_or("none".to_string(), |t| t.to_string());
        let acked = wrote.iter().find(|e| {
            e.client == client
                && e.u64("token").map(|t| t as i64) == last.token
                && e.u64("version").map(|t| t as i64) == Some(last.version)
        });
        let matches = match acked.and_then(|e| e.str("line")) {
            Some(line) => last_line == line,
            None => {
                last_line.starts_with(&format!("{client} #"))
                    && last_line.ends_with(&format!(" token={token}"))
            }
        };
        if !matches {
            v.push(format!(
                "{page}: the final body ends with {last_line:?}, not with the last accepted write's line (client {client}, token {token})"
            ));
        }
    }
    let max_token = attempts
        .iter()
        .filter(|a| a.accepted())
        .filter_map(|a| a.token)
        .max();
    if max_token.is_some() && fence != max_token {
        v.push(format!(
            "{page}: the fence is {fence:?}, the highest accepted token {max_token:?}"
        ));
    }
    (r, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(seq: i64, client: &str, token: i64, version: i64, outcome: &str) -> Attempt {
        Attempt {
            seq,
            page_id: "p".into(),
            method: "PUT".into(),
            outcome: outcome.into(),
            token: Some(token),
            client_id: Some(client.into()),
            version,
        }
    }

    fn wrote(client: &str, n: u64, token: u64, version: u64) -> Event {
        Event {
            client: client.into(),
            json: json!({"event": "wrote", "edit": n, "token": token, "version": version,
                         "line": format!("{client} #{n} token={token}")}),
            received_ms: 0,
        }
    }

    fn state(body: &str, version: i64, fence: i64) -> (Option<String>, i64, Option<i64>) {
        (Some(body.to_string()), version, Some(fence))
    }

    #[test]
    fn a_clean_history_passes() {
        let h = [
            put(1, "a", 3, 1, "accepted"),
            put(2, "b", 4, 2, "accepted"),
            put(3, "a", 3, 2, "stale_token"),
        ];
        let e = [wrote("a", 1, 3, 1), wrote("b", 1, 4, 2)];
        let s = state("a #1 token=3\nb #1 token=4\n", 2, 4);
        let (r, v) = check_page("p", "redis", &h, &e, Some(&s));
        assert!(v.is_empty(), "{v:?}");
        assert_eq!((r.acknowledged, r.stale_refused, r.lost), (2, 1, 0));
    }

    #[test]
    fn a_lost_line_a_duplicate_and_a_decreasing_token_are_each_found() {
        let h = [put(1, "a", 5, 1, "accepted"), put(2, "b", 4, 2, "accepted")];
        let e = [wrote("a", 1, 5, 1), wrote("b", 1, 4, 2)];
        let s = state("b #1 token=4\nb #1 token=4\n", 2, 5);
        let (r, v) = check_page("p", "redis", &h, &e, Some(&s));
        assert_eq!(
            (r.lost, r.duplicated, r.token_decreases, r.stale_accepted),
            (1, 1, 1, 1)
        );
        assert_eq!(v.len(), 3, "{v:?}");
    }

    #[test]
    fn an_acknowledged_write_missing_from_the_history_or_a_stale_body_is_found() {
        let h = [put(1, "a", 3, 1, "accepted")];
        let e = [wrote("a", 1, 3, 1), wrote("b", 1, 4, 2)];
        // b's line is there, but the page says version 1 and the history
        // never saw b's PUT: a write acknowledged and then forgotten.
        let s = state("a #1 token=3\nb #1 token=4\n", 1, 3);
        let (r, v) = check_page("p", "redis", &h, &e, Some(&s));
        assert_eq!(r.acked_not_in_history, 1);
        assert!(
            v.iter()
                .any(|m| m.contains("not with the last accepted write")),
            "{v:?}"
        );
    }
}
