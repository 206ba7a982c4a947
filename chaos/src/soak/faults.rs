//! The fault loop: first each kind once, in an order drawn from the seed,
//! then kinds drawn at random, with a random gap; each kind carried out with
//! the harness's catalogue ([`harness::faults`]) and healed before the next.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use harness::faults::{
    gateway_kill, pause, postgres_failover, restart, zookeeper_leader_kill, zookeeper_partition,
    ClockJump, HeldLink, StopSelf,
};
use harness::procs::now_ms;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;

use crate::backends::Services;

use super::config::Fault;
use super::report::FaultRecord;
use super::stack::Soak;

/// How long a fault waits for a worker's event.
const FAULT_WAIT: Duration = Duration::from_secs(40);

/// How long `zookeeper-partition` waits for its pinned worker's grant
/// before it cuts anyway.
const PARTITION_AIM: Duration = Duration::from_secs(10);

/// `d` in ms, or `never` for what did not happen.
fn ms<E>(d: &Result<Duration, E>) -> String {
    match d {
        Ok(d) => format!("{} ms", d.as_millis()),
        Err(_) => "never".into(),
    }
}

impl Soak {
    /// Inject faults one after another until the deadline, and past it
    /// until each kind was injected once: on a loaded machine the first pass
    /// alone can take longer than a short soak.
    pub(super) async fn inject_faults(&mut self) {
        let mut first_pass: Vec<Fault> = self.kinds.clone();
        first_pass.shuffle(&mut self.rng);
        while Instant::now() < self.deadline || !first_pass.is_empty() {
            let gap = Duration::from_millis(self.rng.random_range(500..=3000));
            let left = self.deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(if first_pass.is_empty() {
                gap.min(left)
            } else {
                gap
            })
            .await;
            if Instant::now() >= self.deadline && first_pass.is_empty() {
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
            Fault::PauseWorker => self.pause_worker(record).await,
            Fault::KillWorker => self.kill_worker(record),
            Fault::GcPauseWriting => self.gc_pause_writing(record).await,
            Fault::DelayedWrite => self.delayed_write(record).await,
            Fault::ClockJump => self.clock_jump(record).await,
            Fault::LockRestart => self.lock_restart(record).await,
            Fault::PostgresRestart => self.postgres_restart(record).await,
            Fault::PostgresFailover => self.postgres_failover(record).await,
            Fault::GatewayKill => self.gateway_kill(record).await,
            Fault::ZookeeperPartition => self.zookeeper_partition(record).await,
            Fault::ZookeeperLeaderKill => self.zookeeper_leader_kill(record).await,
        }
    }

    async fn pause_worker(&mut self, record: &mut FaultRecord) -> anyhow::Result<()> {
        let i = self.rng.random_range(0..self.editors.len());
        let pause = Duration::from_millis(self.rng.random_range(500..=4000));
        let editor = &self.editors[i];
        record.target = self.who(&editor.proc.client);
        record.detail = format!("stopped {} ms", pause.as_millis());
        let paused = pause::pause(&editor.proc);
        tokio::time::sleep(pause).await;
        paused.heal(&editor.proc);
        Ok(())
    }

    fn kill_worker(&mut self, record: &mut FaultRecord) -> anyhow::Result<()> {
        let i = self.rng.random_range(0..self.editors.len());
        let mut editor = self.editors.swap_remove(i);
        record.target = self.who(&editor.proc.client);
        editor.proc.crash();
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
        Ok(())
    }

    async fn gc_pause_writing(&mut self, record: &mut FaultRecord) -> anyhow::Result<()> {
        let page = self.rng.random_range(0..self.pages.len());
        let gateway = self.balancer.url();
        let pause = StopSelf("writing");
        let spec = self
            .spec(page, "gc", &gateway, &HashMap::new(), None)?
            .arg("--edits", 1);
        let spec = pause.arm(spec);
        record.target = spec.client.clone();
        let w = self.spawn_other(page, &spec)?;
        let log = self.pages[page].log.clone();
        let paused = match pause.stopped(&self.others[w].1, &log, FAULT_WAIT).await {
            Ok(paused) => paused,
            Err(e) => {
                self.others[w].1.crash();
                return Err(e);
            }
        };
        let other = log
            .wait_other_wrote(&spec.client, now_ms(), FAULT_WAIT)
            .await;
        paused.heal(&self.others[w].1);
        record.detail = "frozen before its PUT until another holder wrote".into();
        other.map(drop)
    }

    async fn delayed_write(&mut self, record: &mut FaultRecord) -> anyhow::Result<()> {
        let page = self.rng.random_range(0..self.pages.len());
        // One proxy in front of the balancer and one per lock server (three
        // for the ensemble), all held together.
        let balancer = self.balancer.port();
        let lock_ports = self.locks[self.pages[page].lock].ports();
        let link = HeldLink::start(std::iter::once(balancer).chain(lock_ports)).await?;
        let gateway = format!(
            "http://127.0.0.1:{}",
            link.proxy_port(balancer).context("the balancer's proxy")?
        );
        let spec = self
            .spec(page, "dw", &gateway, &link.via(), None)?
            .arg("--edits", 1);
        record.target = spec.client.clone();
        self.spawn_other(page, &spec)?;
        let log = self.pages[page].log.clone();
        let client = spec.client;
        log.wait_event(&client, "read", FAULT_WAIT).await?;
        let held = link.inject();
        let since = now_ms();
        let other = match log.wait_event(&client, "writing", FAULT_WAIT).await {
            Ok(_) => log.wait_other_wrote(&client, since, FAULT_WAIT).await,
            Err(e) => Err(e),
        };
        held.heal();
        record.detail = format!(
            "{} bytes held until another holder wrote",
            link.bytes_held(balancer)
        );
        // The proxies must outlive the worker's last request.
        let _ = log.wait_event(&client, "summary", FAULT_WAIT).await;
        other.map(drop)
    }

    async fn clock_jump(&mut self, record: &mut FaultRecord) -> anyhow::Result<()> {
        let page = self.rng.random_range(0..self.pages.len());
        let clock = ClockJump::new(self.rng.random_bool(0.5))?;
        let gateway = self.balancer.url();
        let spec = self
            .spec(page, "cj", &gateway, &HashMap::new(), None)?
            .arg("--edits", 3);
        let spec = clock.arm(spec);
        record.target = spec.client.clone();
        self.spawn_other(page, &spec)?;
        clock
            .inject(&self.pages[page].log, &spec.client, FAULT_WAIT)
            .await?;
        record.detail = format!(
            "+1h while holding ({})",
            if clock.monotonic() {
                "monotonic too"
            } else {
                "wall clock only"
            }
        );
        self.clocks.push(clock);
        Ok(())
    }

    async fn lock_restart(&mut self, record: &mut FaultRecord) -> anyhow::Result<()> {
        let i = self.rng.random_range(0..self.locks.len());
        let outage = Duration::from_millis(self.rng.random_range(500..=2000));
        let lock = &mut self.locks[i];
        record.target = match lock.is_ensemble() {
            true => "zookeeper (all three servers)".into(),
            false => lock.backend.name().into(),
        };
        let down = restart::kill(lock);
        tokio::time::sleep(outage).await;
        let serving = down.heal(lock).await;
        record.detail = format!(
            "down {} ms; serving {} after the start",
            outage.as_millis(),
            ms(&serving)
        );
        serving.map(drop)
    }

    async fn postgres_restart(&mut self, record: &mut FaultRecord) -> anyhow::Result<()> {
        let outage = Duration::from_millis(self.rng.random_range(500..=2000));
        record.target = format!("primary on port {}", self.pg.primary_port());
        let down = restart::kill(&mut self.pg);
        tokio::time::sleep(outage).await;
        down.heal(&mut self.pg).await?;
        record.detail = format!("down {} ms", outage.as_millis());
        Ok(())
    }

    async fn postgres_failover(&mut self, record: &mut FaultRecord) -> anyhow::Result<()> {
        let cut_for = Duration::from_millis(self.rng.random_range(0..=800));
        record.target = format!("primary on port {}", self.pg.primary_port());
        let cut = postgres_failover::cut(&self.pg);
        tokio::time::sleep(cut_for).await;
        let failed_over = cut.fail_over(&mut self.pg).await;
        let promotion = failed_over.promotion;
        let rebuild = failed_over.heal(&mut self.pg).await;
        record.detail = format!(
            "link cut {} ms before the kill; promoted port {} in {} ms; new synchronous standby in {} ms",
            cut_for.as_millis(),
            self.pg.primary_port(),
            promotion.as_millis(),
            rebuild.as_millis()
        );
        Ok(())
    }

    async fn gateway_kill(&mut self, record: &mut FaultRecord) -> anyhow::Result<()> {
        let i = self.rng.random_range(0..self.gateways.len());
        let down_for = Duration::from_millis(self.rng.random_range(500..=3000));
        record.target = format!("gw{}", i + 1);
        let down = gateway_kill::inject(&mut self.gateways[i], &self.balancer, i).await;
        let marked = down.marked_down.clone();
        tokio::time::sleep(down_for).await;
        let gateways = self.gateways.len();
        down.heal(&mut self.gateways[i], &self.balancer, gateways)
            .await?;
        record.detail = format!(
            "SIGKILL; marked down after {}; started again {} ms later",
            ms(&marked),
            down_for.as_millis()
        );
        marked
            .map(drop)
            .map_err(|e| anyhow::anyhow!("never marked down: {e}"))
    }

    async fn zookeeper_partition(&mut self, record: &mut FaultRecord) -> anyhow::Result<()> {
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
        // Aim the cut at a lock holder: it comes when the pinned worker has
        // just been granted the lock (or, if that takes longer than
        // PARTITION_AIM, whenever; the detail says which).
        let since = now_ms();
        let _ = log
            .wait_for("the pinned worker's grant", PARTITION_AIM, |ev| {
                ev.is(&client, "acquired") && ev.received_ms >= since
            })
            .await;
        let zk = self.locks[lock]
            .ensemble()
            .context("the pinned editor's page has no ensemble")?;
        let mode = zk.mode(cut).await.unwrap_or_else(|| "not serving".into());
        record.target = format!("zk{} ({mode}), {who}", cut + 1);
        let partitioned = zookeeper_partition::inject(zk, cut)?;
        let cut_ms = partitioned.at_ms;
        tokio::time::sleep(hold).await;
        // Whether the cut-off server noticed (a follower gives up after
        // syncLimit × tickTime = 2.5 s without its leader).
        let mode_at_heal = zk.mode(cut).await.unwrap_or_else(|| "not serving".into());
        let healed = partitioned.heal(zk).await;
        let events = log.all();
        let holding = events
            .iter()
            .rfind(|ev| ev.client == client && ev.received_ms < cut_ms)
            .is_some_and(|ev| matches!(ev.kind(), "acquired" | "read" | "writing" | "wrote"));
        let during: Vec<_> = events
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
             worker {} the lock at the cut; all three serving {} after the heal; on \
             its page from the cut on: pinned worker {} wrote, {} lost, {} rejected, {} \
             errors; the others {} acquired, {} wrote",
            hold.as_millis(),
            mode_at_heal,
            if holding { "held" } else { "did not hold" },
            ms(&healed.as_ref().map(|h| h.serving_after)),
            count(true, "wrote"),
            count(true, "lost"),
            count(true, "rejected"),
            count(true, "error"),
            count(false, "acquired"),
            count(false, "wrote"),
        );
        healed.map(drop)
    }

    async fn zookeeper_leader_kill(&mut self, record: &mut FaultRecord) -> anyhow::Result<()> {
        let down = Duration::from_millis(self.rng.random_range(500..=3000));
        let zk = self
            .locks
            .iter_mut()
            .find_map(Services::ensemble)
            .context("no ensemble")?;
        let killed = zookeeper_leader_kill::inject(zk).await?;
        record.target = format!("zk{} (leader)", killed.leader + 1);
        let election = match &killed.elected {
            Ok((_, took)) => *took,
            Err(_) => killed.at.elapsed(),
        };
        tokio::time::sleep(down.saturating_sub(election)).await;
        let restarted = killed.at.elapsed();
        let elected = killed.elected.clone();
        let serving = killed.heal(zk).await;
        record.detail = format!(
            "SIGKILL; {} {} ms after the kill; started again {} ms after the kill, \
             all three serving {} later",
            match &elected {
                Ok((l, _)) => format!("zk{} led", l + 1),
                Err(_) => "no new leader".into(),
            },
            election.as_millis(),
            restarted.as_millis(),
            ms(&serving)
        );
        elected.map_err(anyhow::Error::msg)?;
        serving.map(drop)
    }
}
