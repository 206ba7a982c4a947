//! `cargo run --release -p bench -- abuse`: keyed writers' fenced PUTs through
//! one gateway process, quiet and then under each attack (idle dashboard
//! streams, slowloris connections, anonymous reads, connections opened and
//! dropped) and under all of them at once. Each attack runs twice: against
//! the gateway, and against a port that only sinks it, so that the writers'
//! rate under the attacker's own CPU on these shared cores is known. The
//! ratio of the two is what the gateway's defences leave the writers.
//!
//! Beside each run: the writers' p99, their PUTs refused (503, 429) and
//! connections broken (counted, not fatal), `/healthz`'s p99 on the main
//! address and on the probe address (`--probe-listen`) (asked every 50 ms),
//! the gateway's peak resident memory and open descriptors (from /proc),
//! and what the attackers were answered: 2xx, 503, 429, closed without an
//! answer, or nothing within 5 s (a hang). The attacks come from 40
//! loopback addresses (127.0.0.2 and up), so that per-address caps can tell
//! them apart; the writers and the probe come from 127.0.0.1.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chaos::procs::{api_key, GatewayProc, CLIENTS};
use harness::Postgres;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::http::{Counted, Headers, Load, Pages};
use crate::stats::{ms, quantile, Run};

#[derive(clap::Args)]
pub struct Args {
    /// Seconds of each run.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// The writers' keep-alive connections.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// A few seconds and a tenth of each attack: shows the command works
    /// (its figures are not the attacks').
    #[arg(long)]
    quick: bool,
}

/// Pages the writers spread their PUTs over.
const PAGES: u64 = 100;
/// Whose key the writers send (one the harness gateways know).
const WRITER: &str = "a";
/// How long an attacker waits for an answer before it counts a hang.
const HANG: Duration = Duration::from_secs(5);
/// How many loopback addresses the attacks come from.
const ATTACKERS: u8 = 40;

/// What an attack sends, at fixed rates.
#[derive(Clone, Copy, Debug, Default)]
struct Attack {
    /// Dashboard streams kept open (a refused one is asked again a second later).
    streams: usize,
    /// Connections that send half a request and drip a header line a
    /// second, renewed as they are cut.
    slowloris: usize,
    /// Anonymous reads a second, alternately `/pages` and a history.
    reads: u32,
    /// Connections a second opened and dropped at once.
    churn: u32,
}

impl Attack {
    fn scaled(self, quick: bool) -> Attack {
        if !quick {
            return self;
        }
        Attack {
            streams: self.streams / 10,
            slowloris: self.slowloris / 10,
            reads: self.reads / 10,
            churn: self.churn / 10,
        }
    }
}

const PHASES: [(&str, Attack); 5] = [
    (
        "2,000 idle dashboard streams",
        Attack {
            streams: 2000,
            slowloris: 0,
            reads: 0,
            churn: 0,
        },
    ),
    (
        "500 slowloris connections",
        Attack {
            streams: 0,
            slowloris: 500,
            reads: 0,
            churn: 0,
        },
    ),
    (
        "300 anonymous reads/s",
        Attack {
            streams: 0,
            slowloris: 0,
            reads: 300,
            churn: 0,
        },
    ),
    (
        "50 connections/s opened and dropped",
        Attack {
            streams: 0,
            slowloris: 0,
            reads: 0,
            churn: 50,
        },
    ),
    (
        "all four at once",
        Attack {
            streams: 2000,
            slowloris: 500,
            reads: 300,
            churn: 50,
        },
    ),
];

/// What the attackers were answered.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    refused_503: AtomicU64,
    refused_429: AtomicU64,
    other: AtomicU64,
    closed: AtomicU64,
    hung: AtomicU64,
}

impl Tally {
    fn status(&self, status: u16) {
        let counter = match status {
            200..=299 => &self.ok,
            503 => &self.refused_503,
            429 => &self.refused_429,
            _ => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn line(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{} / {} / {} / {} / {} / {}",
            n(&self.ok),
            n(&self.refused_503),
            n(&self.refused_429),
            n(&self.other),
            n(&self.closed),
            n(&self.hung)
        )
    }
}

/// One measured run: the writers, the probe, the gateway's peaks.
struct Measured {
    writers: Run,
    /// The writers' PUTs refused (503, 429) and connections broken.
    writers_refused: u64,
    writers_broken: u64,
    healthz: Vec<Duration>,
    healthz_failed: u64,
    /// The same probe on the probe address (`--probe-listen`).
    probe_healthz: Vec<Duration>,
    probe_failed: u64,
    rss_kib: u64,
    fds: u64,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let secs = Duration::from_secs(if args.quick { 2 } else { args.secs });
    let pg = Postgres::start().await;
    let url = pg.create_database().await;
    let probe_port = harness::free_port();
    let clients: Vec<String> = CLIENTS.iter().map(|c| c.to_string()).collect();
    let gateway = GatewayProc::spawn_with_args(
        &url,
        true,
        &[],
        &clients,
        harness::free_port(),
        &["--probe-listen".into(), format!("127.0.0.1:{probe_port}")],
    )
    .await?;
    let pid = gateway.pid().context("the gateway's pid")?;
    let target = SocketAddr::from(([127, 0, 0, 1], gateway.port()));
    let probes = SocketAddr::from(([127, 0, 0, 1], probe_port));
    let sink = TcpListener::bind("127.0.0.1:0").await?;
    let sink_addr = sink.local_addr()?;
    let sinking = tokio::spawn(run_sink(sink));

    let json = Load::json_of_len(100);
    let headers = Headers {
        key: Some(api_key(WRITER)),
        client_id: Some(WRITER.into()),
        issuer: None,
    };
    let writers = |token: u64| Load {
        targets: vec![target],
        clients: args.clients,
        pages: Pages::Random { n: PAGES, token },
        headers: headers.clone(),
        json: json.clone(),
        counted: Counted::Refusals,
    };
    eprintln!("seeding {PAGES} pages, warming up");
    let each = Pages::Each { n: PAGES, token: 1 };
    Load {
        pages: each,
        ..writers(1)
    }
    .run(Duration::ZERO)
    .await?;
    writers(1).run(Duration::from_secs(1)).await?;

    let mut token = 1;
    let mut rows = Vec::new();
    token += 1;
    eprintln!("quiet");
    let quiet = measured(pid, target, probes, writers(token).run(secs)).await?;
    rows.push(row("quiet", None, &quiet, &quiet, None));
    for (name, attack) in PHASES {
        let attack = attack.scaled(args.quick);
        eprintln!("{name}: against the sink");
        token += 1;
        let sink_tally = Arc::new(Tally::default());
        let stop = CancellationToken::new();
        let attackers = launch(attack, sink_addr, &stop, &sink_tally);
        settle(&attack).await;
        let sunk = measured(pid, target, probes, writers(token).run(secs)).await?;
        stop.cancel();
        attackers.join_all().await;

        eprintln!("{name}: against the gateway");
        token += 1;
        let tally = Arc::new(Tally::default());
        let stop = CancellationToken::new();
        let attackers = launch(attack, target, &stop, &tally);
        settle(&attack).await;
        let attacked = measured(pid, target, probes, writers(token).run(secs)).await?;
        stop.cancel();
        attackers.join_all().await;
        rows.push(row(name, Some(&sunk), &attacked, &quiet, Some(&tally)));
    }
    sinking.abort();
    drop(gateway);
    drop(pg);

    println!(
        "| attack | writers' PUT/s, attack on the sink | writers' PUT/s, attack on the gateway | \
         gateway ÷ sink | writers' p99 ms (quiet ×) | writers refused / broken | /healthz p99 ms (failed) | /healthz on the probe address: p99 ms (failed) | gateway RSS MiB | \
         gateway fds | attackers answered: 2xx / 503 / 429 / other / closed / no answer in 5 s |"
    );
    println!("|---|---:|---:|---:|---|---|---|---|---:|---:|---|");
    for r in rows {
        println!("{r}");
    }
    Ok(())
}

/// Give the attack a moment to reach its size before the writers start.
async fn settle(attack: &Attack) {
    if attack.streams + attack.slowloris > 0 {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn row(
    name: &str,
    sunk: Option<&Measured>,
    m: &Measured,
    quiet: &Measured,
    tally: Option<&Tally>,
) -> String {
    let rate = m.writers.per_sec();
    let (sink_rate, ratio) = match sunk {
        Some(s) => (
            format!("{:.0}", s.writers.per_sec()),
            format!("{:.2}×", rate / s.writers.per_sec().max(1.0)),
        ),
        None => ("".into(), "".into()),
    };
    let p99 = m.writers.p99();
    let times_quiet = p99.as_secs_f64() / quiet.writers.p99().as_secs_f64().max(1e-9);
    format!(
        "| {name} | {sink_rate} | {rate:.0} | {ratio} | {} ({times_quiet:.1}×) | {} / {} | {} ({}) | {} ({}) | {:.0} | {} | {} |",
        ms(p99),
        m.writers_refused,
        m.writers_broken,
        ms(quantile(&m.healthz, 0.99)),
        m.healthz_failed,
        ms(quantile(&m.probe_healthz, 0.99)),
        m.probe_failed,
        m.rss_kib as f64 / 1024.0,
        m.fds,
        tally.map_or_else(String::new, Tally::line)
    )
}

/// Run the writers' load while probing `/healthz` and sampling the gateway.
async fn measured(
    pid: u32,
    target: SocketAddr,
    probes: SocketAddr,
    load: impl std::future::Future<Output = anyhow::Result<crate::http::Outcome>>,
) -> anyhow::Result<Measured> {
    let stop = CancellationToken::new();
    let probe = tokio::spawn(probe_healthz(target, stop.clone()));
    let probe_own = tokio::spawn(probe_healthz(probes, stop.clone()));
    let sample = tokio::spawn(sample(pid, stop.clone()));
    let outcome = load.await;
    stop.cancel();
    let (healthz, healthz_failed) = probe.await?;
    let (probe_healthz, probe_failed) = probe_own.await?;
    let (rss_kib, fds) = sample.await?;
    let outcome = outcome?;
    Ok(Measured {
        writers: outcome.run,
        writers_refused: outcome.refused,
        writers_broken: outcome.broken,
        healthz,
        healthz_failed,
        probe_healthz,
        probe_failed,
        rss_kib,
        fds,
    })
}

/// `GET /healthz` every 50 ms on a new connection each: the latencies, and
/// how many got no 200 within 5 s.
async fn probe_healthz(target: SocketAddr, stop: CancellationToken) -> (Vec<Duration>, u64) {
    let (mut times, mut failed) = (Vec::new(), 0);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return (times, failed),
        }
        let t0 = Instant::now();
        let answer = tokio::time::timeout(HANG, async {
            let mut s = TcpStream::connect(target).await?;
            s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await?;
            let mut head = [0u8; 12];
            s.read_exact(&mut head).await?;
            Ok::<_, std::io::Error>(head)
        })
        .await;
        match answer {
            Ok(Ok(head)) if head.starts_with(b"HTTP/1.1 200") => times.push(t0.elapsed()),
            _ => failed += 1,
        }
    }
}

/// The gateway's peak resident memory (KiB) and open descriptors.
async fn sample(pid: u32, stop: CancellationToken) -> (u64, u64) {
    let (mut rss, mut fds) = (0, 0);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return (rss, fds),
        }
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            let kib = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            rss = rss.max(kib);
        }
        if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
            fds = fds.max(dir.count() as u64);
        }
    }
}

/// A port that accepts everything and answers nothing.
async fn run_sink(listener: TcpListener) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
        });
    }
}

/// The `i`th attacker's address: 127.0.0.2 and up.
fn attacker(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (i % ATTACKERS as usize) as u8))
}

async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// Send `request` and read the status of the answer: `Some(status)`,
/// `None` when the connection closed first; `Err` on a hang.
async fn ask(stream: &mut TcpStream, request: &[u8]) -> Result<Option<u16>, ()> {
    let read = async {
        stream.write_all(request).await.ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    };
    tokio::time::timeout(HANG, read).await.map_err(|_| ())
}

fn count(tally: &Tally, answer: Result<Option<u16>, ()>) {
    match answer {
        Ok(Some(status)) => tally.status(status),
        Ok(None) => {
            tally.closed.fetch_add(1, Ordering::Relaxed);
        }
        Err(()) => {
            tally.hung.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Start `attack` on `target` until `stop`.
fn launch(
    attack: Attack,
    target: SocketAddr,
    stop: &CancellationToken,
    tally: &Arc<Tally>,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for i in 0..attack.streams {
        let (stop, tally) = (stop.clone(), tally.clone());
        set.spawn(async move {
            let request = b"GET /dashboard/events HTTP/1.1\r\nhost: x\r\n\r\n";
            while !stop.is_cancelled() {
                let Ok(mut s) = connect_from(attacker(i), target).await else {
                    tally.closed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                };
                let answer = ask(&mut s, request).await;
                let held = matches!(answer, Ok(Some(200)));
                count(&tally, answer);
                if held {
                    // Idle: keep it open, discarding the events.
                    let mut buf = [0u8; 4096];
                    tokio::select! {
                        () = async { while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {} } => {}
                        () = stop.cancelled() => return,
                    }
                } else {
                    drop(s);
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        () = stop.cancelled() => return,
                    }
                }
            }
        });
    }
    for i in 0..attack.slowloris {
        let (stop, tally) = (stop.clone(), tally.clone());
        set.spawn(async move {
            while !stop.is_cancelled() {
                let Ok(mut s) = connect_from(attacker(i + 7), target).await else {
                    tally.closed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                };
                let mut alive = s
                    .write_all(b"GET /pages/1 HTTP/1.1\r\nhost: x\r\n")
                    .await
                    .is_ok();
                while alive && !stop.is_cancelled() {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        () = stop.cancelled() => return,
                    }
                    alive = s.write_all(b"x-drip: 1\r\n").await.is_ok();
                }
                // Cut (or refused): counted as closed, renewed.
                tally.closed.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    for (rate, kind) in [(attack.reads, 0), (attack.churn, 1)] {
        if rate == 0 {
            continue;
        }
        let (stop, tally) = (stop.clone(), tally.clone());
        set.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut requests = JoinSet::new();
            let mut n = 0_usize;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = stop.cancelled() => break,
                }
                n += 1;
                let tally = tally.clone();
                requests.spawn(async move {
                    let Ok(mut s) = connect_from(attacker(n), target).await else {
                        tally.closed.fetch_add(1, Ordering::Relaxed);
                        return;
                    };
                    if kind == 1 {
                        return; // churn: dropped at once
                    }
                    let request: &[u8] = if n.is_multiple_of(2) {
                        b"GET /pages HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                    } else {
                        b"GET /pages/1/history HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                    };
                    count(&tally, ask(&mut s, request).await);
                });
                while requests.try_join_next().is_some() {}
            }
            requests.abort_all();
        });
    }
    set
}
