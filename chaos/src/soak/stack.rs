//! The soak's stack (PostgreSQL primary and synchronous standby, two
//! gateways behind HAProxy, each backend's own lock server), its pages, and
//! the workers that edit them until the end.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use harness::procs::{EventLog, GatewayProc, WorkerProc, WorkerSpec};
use harness::{Haproxy, PostgresPair, Replication};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::backends::{Services, Zk};
use crate::history;

use super::config::{Fault, SoakConfig};
use super::report::FaultRecord;

pub(super) struct Page {
    pub(super) name: String,
    /// Index into `Soak::locks`.
    pub(super) lock: usize,
    pub(super) log: EventLog,
}

/// A worker that edits one page until the end of the soak.
pub(super) struct Editor {
    pub(super) page: usize,
    /// The one ensemble server this worker may talk to (`None`: all).
    pub(super) pin: Option<usize>,
    pub(super) proc: WorkerProc,
}

pub(super) struct Soak {
    pub(super) config: SoakConfig,
    pub(super) rng: StdRng,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    pub(super) pg: PostgresPair,
    pub(super) db_name: String,
    pub(super) gateways: Vec<GatewayProc>,
    /// The clients the gateways have keys for; workers take them in order.
    clients: Vec<String>,
    pub(super) balancer: Haproxy,
    /// Each backend's own lock server(s).
    pub(super) locks: Vec<Services>,
    pub(super) pages: Vec<Page>,
    pub(super) editors: Vec<Editor>,
    /// Killed editors, stragglers, jumpers: reaped at the end.
    pub(super) others: Vec<(usize, WorkerProc)>,
    /// The clocks of the jumpers, alive until the end.
    pub(super) clocks: Vec<harness::faults::ClockJump>,
    pub(super) faults: Vec<FaultRecord>,
    /// The kinds of fault this stack can take (the ensemble's need one).
    pub(super) kinds: Vec<Fault>,
    /// The ensemble server the next pinned editor talks to (round robin).
    next_pin: usize,
    next_client: usize,
    /// Each client's role, for the fault log.
    roles: HashMap<String, String>,
}

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

impl Soak {
    pub(super) async fn start(config: SoakConfig) -> anyhow::Result<Self> {
        let rng = StdRng::seed_from_u64(config.seed);
        eprintln!("soak: starting PostgreSQL primary + synchronous standby");
        let pg = PostgresPair::start(Replication::Sync).await;
        let db_url = pg.create_database().await;
        let db_name = history::database_name(&db_url)?;
        let mut locks = vec![];
        let mut pages = vec![];
        for &backend in &config.backends {
            eprintln!("soak: starting the lock server of {backend}");
            locks.push(Services::start_owned(backend, config.zookeeper_standalone).await?);
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
        let issuers: Vec<(String, String)> = locks.iter().filter_map(Services::issuer).collect();
        let clients: Vec<String> = (0..client_capacity(config.duration))
            .map(client_name)
            .collect();
        let gateway_ports = vec![harness::free_port(), harness::free_port()];
        let mut gateways = vec![];
        for &port in &gateway_ports {
            gateways.push(GatewayProc::spawn_for(&db_url, true, &issuers, &clients, port).await?);
        }
        let balancer = Haproxy::start(&gateway_ports).await;
        balancer
            .wait_up(2, Duration::from_secs(30))
            .await
            .map_err(|e| anyhow::anyhow!("balancer: {e}"))?;
        let ensemble = locks.iter().any(Services::is_ensemble);
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
            gateways,
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
    pub(super) fn next_pin_for(&mut self, page: usize) -> Option<usize> {
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
    pub(super) fn spec(
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
        Ok(WorkerSpec::keyed(&client)
            .args(lock.worker_args(via, pin))
            .arg("--gateway", gateway)
            .arg("--page", &self.pages[page].name)
            .arg("--ttl", "2s")
            .arg("--wait", "20s")
            .arg("--work-ms", work_ms)
            .arg("--fencing", "on"))
    }

    /// `client (role)`, for the fault log.
    pub(super) fn who(&self, client: &str) -> String {
        match self.roles.get(client) {
            Some(role) => format!("{client} ({role})"),
            None => client.to_string(),
        }
    }

    pub(super) fn spawn_editor(&mut self, page: usize, pin: Option<usize>) -> anyhow::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let gateway = self.balancer.url();
        let spec = self
            .spec(page, "w", &gateway, &HashMap::new(), pin)?
            .arg("--duration", format!("{}ms", left.as_millis().max(1)));
        let proc = WorkerProc::spawn(&spec, &self.pages[page].log)?;
        self.editors.push(Editor { page, pin, proc });
        Ok(())
    }

    pub(super) fn spawn_other(&mut self, page: usize, spec: &WorkerSpec) -> anyhow::Result<usize> {
        let proc = WorkerProc::spawn(spec, &self.pages[page].log)?;
        self.others.push((page, proc));
        Ok(self.others.len() - 1)
    }

    /// Let every worker finish; the ones that do not are violations.
    pub(super) async fn drain(&mut self) -> Vec<String> {
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
}
