//! `cargo run --release -p bench -- trust`: what the issuer check costs.
//!
//! Fenced PUTs through the gateway, per lock backend, with real grants: the
//! bench holds the lock `page:<id>` of every page it writes (one grant each,
//! client `bench`, taken from the backend's real service before the runs and
//! held to the end), and every PUT carries that page's token. Three gateways
//! on the same database and the same pages, measured alternately in one run:
//!
//! - **no key**: authentication off, no issuer: the gateway with neither;
//! - **keys**: the writer's key required (SHA-256 digest, constant-time
//!   compare), no issuer;
//! - **keys + issuer**: the same, and before every fenced statement the
//!   gateway asks the backend's service whether `bench` holds `page:<id>`
//!   with exactly that token (`fencelock::HolderLookup`).
//!
//! The gateways run in this process (their own tokio tasks), the lock
//! services and PostgreSQL as real servers on this machine, and the load comes
//! from keep-alive HTTP/1.1 connections ([`crate::http`], as `bench
//! gateway`'s, so that it takes little of the shared CPU). Before
//! measuring, the run proves that each gateway does what its name says (a key
//! is refused where required, a token nobody holds is refused where issuers
//! are asked). Every answer must be 2xx, except 503 `issuer_unavailable` (the
//! issuer did not answer within the gateway's issuer timeout, so it failed
//! closed): those are counted and shown, not in the rate. Any other answer
//! fails the run.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use chaos::Backend;
use fencelock::lease_table::LeaseTable;
use fencelock::redis::RedisLock;
use fencelock::redis_sentinel::RedisSentinelLock;
use fencelock::zookeeper::ZooKeeperLock;
use fencelock::{AcquireOptions, Lease, LockService};
use gateway::{AuthMode, FenceCheck, GatewayOptions, RunningGateway};

use crate::http::{Counted, Headers, Load, Pages};
use crate::stats::{median, ms, spread, Repeats, Run};
use crate::{machine, sections};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    runs: Repeats,
    /// HTTP connections writing at once: one row per count. One connection
    /// shows the check's latency alone; more show it under concurrency.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    clients: Vec<usize>,
    /// Pages written (one held lock each), chosen at random per request.
    #[arg(long, default_value_t = 100)]
    pages: u64,
    /// Only these backends (repeatable; default: the four that mint tokens).
    #[arg(long, value_enum)]
    backend: Vec<Backend>,
    /// Do not rewrite the section of docs/BENCHMARKS.md.
    #[arg(long)]
    no_write: bool,
}

const BODY_LEN: usize = 100;
const CLIENT: &str = "bench";
const KEY: &str = "bench-writer-key-not-secret";
const HOLD: Duration = Duration::from_secs(3600);

/// The three gateways, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    NoKey,
    Keys,
    KeysAndIssuer,
}

const VARIANTS: [Variant; 3] = [Variant::NoKey, Variant::Keys, Variant::KeysAndIssuer];

impl Variant {
    fn keyed(self) -> bool {
        self != Variant::NoKey
    }
}

/// The real service of one backend, and its URL as the gateway's issuer.
enum Service {
    Redis(harness::Redis),
    ZooKeeper(harness::ZooKeeper),
    Sentinel(harness::SentinelGroup),
    LeasePostgres(String),
    LeaseMysql(String),
}

impl Service {
    async fn start(backend: Backend) -> anyhow::Result<Service> {
        Ok(match backend {
            Backend::Redis => Service::Redis(harness::Redis::start().await),
            Backend::Zookeeper => Service::ZooKeeper(harness::ZooKeeper::start().await),
            Backend::RedisSentinel => Service::Sentinel(harness::SentinelGroup::start().await),
            Backend::LeasePostgres => Service::LeasePostgres(harness::fresh_database().await),
            Backend::LeaseMysql => Service::LeaseMysql(harness::fresh_mysql_database().await),
            Backend::Redlock => bail!("Redlock mints no token: it cannot be an issuer"),
        })
    }

    /// (Fencing-Issuer name, URL for `--issuer`).
    fn issuer(&self) -> (&'static str, String) {
        match self {
            Service::Redis(r) => ("redis", r.url()),
            Service::ZooKeeper(z) => ("zookeeper", format!("zookeeper://{}", z.connect_string())),
            Service::Sentinel(g) => (
                "redis-sentinel",
                format!(
                    "redis-sentinel://{}/{}",
                    g.sentinel_addrs().join(","),
                    g.master_name()
                ),
            ),
            Service::LeasePostgres(url) => ("lease-postgres", url.clone()),
            Service::LeaseMysql(url) => ("lease-mysql", url.clone()),
        }
    }

    async fn locks(&self) -> anyhow::Result<Arc<dyn LockService>> {
        Ok(match self {
            Service::Redis(r) => {
                Arc::new(RedisLock::connect(&r.url()).await?.with_client_id(CLIENT)?)
            }
            Service::ZooKeeper(z) => Arc::new(
                ZooKeeperLock::connect(&z.connect_string(), Duration::from_secs(30))
                    .await?
                    .with_client_id(CLIENT)?,
            ),
            Service::Sentinel(g) => Arc::new(
                RedisSentinelLock::connect(&g.sentinel_addrs(), g.master_name())
                    .await?
                    .with_client_id(CLIENT)?,
            ),
            Service::LeasePostgres(url) => {
                Arc::new(LeaseTable::postgres(url).await?.with_client_id(CLIENT)?)
            }
            Service::LeaseMysql(url) => {
                Arc::new(LeaseTable::mysql(url).await?.with_client_id(CLIENT)?)
            }
        })
    }
}

struct Row {
    backend: Backend,
    clients: usize,
    runs: HashMap<&'static str, Vec<Run>>,
    /// 503 `issuer_unavailable` answers of the issuer variant, over all runs.
    unavailable: u64,
    /// All answers of the issuer variant, over all runs.
    answers: u64,
}

fn label(v: Variant) -> &'static str {
    match v {
        Variant::NoKey => "no key",
        Variant::Keys => "keys",
        Variant::KeysAndIssuer => "keys + issuer",
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let backends = if args.backend.is_empty() {
        vec![
            Backend::Redis,
            Backend::Zookeeper,
            Backend::LeasePostgres,
            Backend::LeaseMysql,
        ]
    } else {
        args.backend.clone()
    };
    // The gateways' own database: a private server, as `bench gateway` uses.
    let pg = harness::Postgres::start().await;
    let mut rows = Vec::new();
    for backend in backends {
        eprintln!(
            "{backend}: starting the lock service and taking {} locks",
            args.pages
        );
        let service = Service::start(backend).await?;
        let (issuer, issuer_url) = service.issuer();
        let locks = service.locks().await?;
        let mut leases: Vec<Lease> = Vec::with_capacity(args.pages as usize);
        let mut tokens = Vec::with_capacity(args.pages as usize);
        for id in 1..=args.pages {
            let lease = locks
                .acquire_with(
                    &format!("page:{id}"),
                    // Held for the whole run; no renewal traffic during it.
                    AcquireOptions::new(HOLD)
                        .wait(Duration::from_secs(10))
                        .auto_renew(false),
                )
                .await
                .with_context(|| format!("{backend}: lock page:{id}"))?;
            tokens.push(lease.token().context("a fencing token")?.get());
            leases.push(lease);
        }
        let pages = Pages::Held(Arc::new(tokens));

        let db = pg.create_database().await;
        let mut gateways: Vec<(Variant, RunningGateway)> = Vec::new();
        for v in VARIANTS {
            let options = match v {
                Variant::NoKey => GatewayOptions::new(FenceCheck::Enforce).auth(AuthMode::Off),
                Variant::Keys => GatewayOptions::new(FenceCheck::Enforce).api_key(CLIENT, KEY),
                Variant::KeysAndIssuer => GatewayOptions::new(FenceCheck::Enforce)
                    .api_key(CLIENT, KEY)
                    .issuer(issuer, &issuer_url),
            };
            gateways.push((v, gateway::spawn_with_options(&db, options).await?));
        }
        for (v, gw) in &gateways {
            prove(*v, gw, issuer).await.with_context(|| {
                format!(
                    "{backend}: the `{}` gateway is not what it claims",
                    label(*v)
                )
            })?;
        }

        eprintln!("{backend}: seeding and warming up");
        for (v, gw) in &gateways {
            let c = args.clients.iter().copied().max().unwrap_or(1);
            load(gw.addr(), *v, issuer, &pages, c)
                .run(Duration::from_secs(1))
                .await?;
        }
        let mut backend_rows: Vec<Row> = args
            .clients
            .iter()
            .map(|&clients| Row {
                backend,
                clients,
                runs: HashMap::new(),
                unavailable: 0,
                answers: 0,
            })
            .collect();
        for r in 0..args.runs.repeats {
            for row in backend_rows.iter_mut() {
                for (v, gw) in &gateways {
                    let load = load(gw.addr(), *v, issuer, &pages, row.clients);
                    let out = load.run(Duration::from_secs(args.runs.secs)).await?;
                    let (run, unavailable) = (out.run, out.unavailable);
                    eprintln!(
                        "{backend} c={} run {}/{}: {:<14} {:>7.0} PUT/s  p50 {}  p99 {}  ({unavailable} x 503)",
                        row.clients,
                        r + 1,
                        args.runs.repeats,
                        label(*v),
                        run.per_sec(),
                        ms(run.p50()),
                        ms(run.p99()),
                    );
                    if *v == Variant::KeysAndIssuer {
                        row.unavailable += unavailable;
                        row.answers += run.ops + unavailable;
                    }
                    row.runs.entry(label(*v)).or_default().push(run);
                }
            }
        }
        for (_, gw) in gateways {
            gw.shutdown().await?;
        }
        for lease in leases {
            let _ = lease.release().await;
        }
        rows.extend(backend_rows);
        drop(service);
    }
    let table = table(&rows);
    println!("{table}");
    if !args.no_write {
        sections::write_section(HEADING, &section_text(&args, &table), Some("## Gateway:"))?;
        eprintln!("wrote the section \"{HEADING}\" of docs/BENCHMARKS.md");
    }
    Ok(())
}

/// Check that a gateway is the variant it stands for, on page `probe` (whose
/// lock nobody holds): keyed ones refuse a PUT without a key; the one with
/// the issuer refuses a token nobody was granted; the others accept it.
async fn prove(v: Variant, gw: &RunningGateway, issuer: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let put = |key: Option<&str>| {
        let mut req = http
            .put(format!("{}/pages/probe", gw.url()))
            .header("Fencing-Token", "1")
            .header("Fencing-Issuer", issuer)
            .json(&serde_json::json!({ "body": "probe" }));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        req.send()
    };
    let anonymous = put(None).await?.status().as_u16();
    let keyed = put(Some(KEY)).await?;
    let (keyed_status, keyed_body) = (keyed.status().as_u16(), keyed.text().await?);
    match v {
        Variant::NoKey if (200..300).contains(&anonymous) => {}
        Variant::Keys if anonymous == 401 && (200..300).contains(&keyed_status) => {}
        Variant::KeysAndIssuer
            if anonymous == 401
                && keyed_status == 409
                && keyed_body.contains("token_not_current") => {}
        _ => bail!(
            "without a key: {anonymous}; with the key and a token nobody holds: \
             {keyed_status} {keyed_body}"
        ),
    }
    Ok(())
}

/// A load of fenced PUTs of the held `pages` on the gateway at `addr`, with
/// the key where the variant needs one; the answers 503
/// `issuer_unavailable` (the gateway failed closed) are counted.
fn load(addr: SocketAddr, v: Variant, issuer: &str, pages: &Pages, clients: usize) -> Load {
    Load {
        targets: vec![addr],
        clients,
        pages: pages.clone(),
        headers: Headers {
            issuer: Some(issuer.to_owned()),
            key: v.keyed().then(|| KEY.to_owned()),
            ..Headers::default()
        },
        json: Load::json_of_len(BODY_LEN),
        counted: Counted::IssuerUnavailable,
    }
}

fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| backend | connections | no key: PUT/s (median, min..max) | keys: PUT/s | keys + issuer: PUT/s | keys + issuer ÷ keys, paired runs (median, min..max) | keys p50 / p99 ms | keys + issuer p50 / p99 ms | keys + issuer: 503 issuer_unavailable |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let rates = |v: Variant| -> Vec<f64> {
            row.runs
                .get(label(v))
                .map(|runs| runs.iter().map(Run::per_sec).collect())
                .unwrap_or_default()
        };
        let cell = |v: Variant| {
            let r = rates(v);
            let (lo, hi) = spread(&r);
            format!("{:.0} ({lo:.0}..{hi:.0})", median(&r))
        };
        let q = |v: Variant, f: fn(&Run) -> Duration| {
            let v: Vec<f64> = row
                .runs
                .get(label(v))
                .map(|runs| runs.iter().map(|r| f(r).as_secs_f64()).collect())
                .unwrap_or_default();
            ms(Duration::from_secs_f64(median(&v)))
        };
        // Each repeat ran the two back to back: their ratio is less exposed
        // to the machine's load drifting over the run than a ratio of medians.
        let paired: Vec<f64> = rates(Variant::KeysAndIssuer)
            .iter()
            .zip(rates(Variant::Keys))
            .map(|(with, without)| with / without)
            .collect();
        let (lo, hi) = spread(&paired);
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.2}× ({lo:.2}..{hi:.2}) | {} / {} | {} / {} | {} of {} |\n",
            row.backend,
            row.clients,
            cell(Variant::NoKey),
            cell(Variant::Keys),
            cell(Variant::KeysAndIssuer),
            median(&paired),
            q(Variant::Keys, Run::p50),
            q(Variant::Keys, Run::p99),
            q(Variant::KeysAndIssuer, Run::p50),
            q(Variant::KeysAndIssuer, Run::p99),
            row.unavailable,
            row.answers,
        ));
    }
    t
}

fn section_text(args: &Args, table: &str) -> String {
    let date = machine::utc_now();
    let cpus = machine::cpus();
    let clients: Vec<String> = args.clients.iter().map(usize::to_string).collect();
    let clients = clients.join(",");
    let backends: String = args
        .backend
        .iter()
        .map(|b| format!(" --backend {b}"))
        .collect();
    let load = machine::load_average();
    format!(
        "Command: `cargo run --release -p bench -- trust` \
         (here: `--secs {} --repeats {} --clients {clients} --pages {}{backends}`)\n\n\
         Machine: {cpus} CPUs (`nproc`), shared: load average {load} (1, 5, 15 min) when the \
         run ended. Date: {date}. Every figure is fenced PUT/s through \
         the gateway (in the bench's process, default pool of {} PostgreSQL connections, a \
         private PostgreSQL 15 with `fsync=off` as in the section above) from {clients} \
         keep-alive HTTP connections (one row each), with real grants: for each backend the bench takes the lock \
         `page:<id>` of each of {} pages from the backend's real server (client `bench`) and \
         holds them; every PUT writes a random one of those pages with its token. Three \
         gateways on the same database, measured alternately in one run: **no key** \
         (authentication off, no issuer), **keys** (the writer's \
         key required, no issuer), **keys + issuer** (and before each fenced statement the \
         gateway asks the backend's server whether `bench` holds `page:<id>` with exactly that \
         token: one Redis `GET`; a ZooKeeper `sync` and `getChildren` (sent together), then \
         `getData` of the queue's head; one `select` of the lease row by its key). The run first proves each gateway is what it \
         claims (a PUT without a key refused where keys are required, a token nobody holds \
         refused where the issuer is asked). Medians of {} runs of {} s, min..max in brackets; \
         each repeat runs the three one after the other, and the ratio column is the median of \
         the repeats' own ratios (keys + issuer over keys, run back to back). The rates count \
         accepted PUTs; the last column counts the answers 503 `issuer_unavailable` (the issuer \
         did not answer within the gateway's default issuer timeout, 500 ms: the gateway \
         failed closed) among all answers; any other answer than 2xx fails the run.\n\n\
         {table}",
        args.runs.secs,
        args.runs.repeats,
        args.pages,
        gateway::DEFAULT_POOL_SIZE,
        args.pages,
        args.runs.repeats,
        args.runs.secs,
    )
}

const HEADING: &str = "## What the issuer check costs";
