//! The Python peers: the `redis` package's `Lock` and `kazoo`'s `Lock`,
//! acquire+release in a loop by N threads, each in a venv under `target/`
//! with its pinned package (`bench locks`, `bench zookeeper`, `bench
//! compare`, which runs them with one thread).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::stats::Run;
use crate::tools;

/// The pinned `redis` package.
pub const REDIS: &str = "redis==8.1.0";
/// The pinned `kazoo` package.
pub const KAZOO: &str = "kazoo==2.11.0";

const REDIS_LOCK: &str = r#"
import json, sys, threading, time
import redis
port, clients, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
name = "py-%d" % clients
r = redis.Redis(port=port)
lat, guard = [], threading.Lock()
end = time.perf_counter() + secs
def work():
    mine = []
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        lock = r.lock(name, timeout=10, blocking_timeout=30)
        if not lock.acquire():
            raise SystemExit("not acquired")
        lock.release()
        mine.append(time.perf_counter() - t0)
    with guard:
        lat.extend(mine)
start = time.perf_counter()
threads = [threading.Thread(target=work) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"elapsed": time.perf_counter() - start, "lat": lat}))
"#;

/// `redis.Redis(port).lock("py-CLIENTS", timeout=10, blocking_timeout=30)`
/// acquire+release in a loop by `clients` threads on one lock (its defaults:
/// 0.1 s sleep between tries when waiting).
pub async fn redis_lock(
    python: &Path,
    port: u16,
    clients: usize,
    secs: Duration,
) -> anyhow::Result<Run> {
    let args = [
        port.to_string(),
        clients.to_string(),
        secs.as_secs_f64().to_string(),
    ];
    tools::python_peer(python, REDIS_LOCK, &args).await
}

const KAZOO_LOCK: &str = r#"
import json, sys, threading, time
from kazoo.client import KazooClient
hosts, clients, secs, name = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
path = "/kazoo-bench/" + name
zks = [KazooClient(hosts=hosts, timeout=10.0) for _ in range(clients)]
for zk in zks:
    zk.start()
zks[0].ensure_path(path)
lat, guard = [], threading.Lock()
start = time.perf_counter()
end = start + secs
def work(i):
    lock = zks[i].Lock(path, "c%d" % i)
    mine = []
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        if not lock.acquire(timeout=30):
            raise SystemExit("not acquired")
        lock.release()
        mine.append(time.perf_counter() - t0)
    with guard:
        lat.extend(mine)
threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
elapsed = time.perf_counter() - start
for zk in zks:
    zk.stop()
print(json.dumps({"elapsed": elapsed, "lat": lat}))
"#;

/// kazoo's `Lock` on `/kazoo-bench/NAME` acquire+release in a loop by
/// `clients` threads, each with its own `KazooClient` (session).
pub async fn kazoo_lock(
    python: &Path,
    hosts: &str,
    clients: usize,
    secs: Duration,
    name: &str,
) -> anyhow::Result<Run> {
    let args = [
        hosts.to_string(),
        clients.to_string(),
        secs.as_secs_f64().to_string(),
        name.to_string(),
    ];
    tools::python_peer(python, KAZOO_LOCK, &args).await
}

/// The interpreter of a peer: `given`, or a venv `target/VENV` with the
/// pinned `packages` (providing `modules`) made on first use. Says on stderr
/// when there is none: the peer's rows are then left out.
pub async fn python(
    given: &Option<PathBuf>,
    venv: &str,
    modules: &str,
    packages: &[&str],
) -> anyhow::Result<PathBuf> {
    let python = match given {
        Some(p) => Ok(p.clone()),
        None => tools::python_venv(venv, modules, packages).await,
    };
    if let Err(e) = &python {
        eprintln!("Python peer ({modules}) unavailable: {e:#}");
    }
    python
}
