//! How the ZooKeeper lock shares one hot lock among several clients: each
//! client has its own session (as separate worker processes do; `shared`
//! puts them all on one) and loops acquire → release with no work in
//! between, for a fixed time. Prints the grants per client and how often the
//! lock went to the client that had just released it (0 in a strict
//! rotation). A measurement tool, not a test: the claim is tested in
//! `tests/zookeeper_recipes.rs`.
//!
//! ```text
//! cargo run --release -p fencelock --features zookeeper --example zk_rotation -- \
//!     127.0.0.1:2181 [seconds=8] [clients=3] [fair|non-fair] [shared]
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::zookeeper::ZooKeeperLock;
use fencelock::LockService;
use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let connect = args
        .first()
        .ok_or("usage: zk_rotation CONNECT [secs] [clients] [fair|non-fair]")?;
    let secs: u64 = args.get(1).map_or(Ok(8), |s| s.parse())?;
    let clients: usize = args.get(2).map_or(Ok(3), |s| s.parse())?;
    let fair = args.get(3).is_none_or(|s| s != "non-fair");
    // `shared`: every client on one session (one ZooKeeperLock), as tasks
    // of one process would be.
    let shared = args.get(4).is_some_and(|s| s == "shared");
    let name = format!("rotation-{}", std::process::id());
    let order = Arc::new(Mutex::new(Vec::<(u64, usize)>::new()));
    let until = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    let one = ZooKeeperLock::connect(connect, Duration::from_secs(4)).await?;
    for i in 0..clients {
        let mut lock = if shared {
            one.clone()
        } else {
            ZooKeeperLock::connect(connect, Duration::from_secs(4)).await?
        };
        if !fair {
            lock = lock.non_fair();
        }
        let (order, name) = (order.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let lease = lock
                    .acquire(&name, Duration::from_secs(4), Duration::from_secs(10))
                    .await?;
                let token = lease.token().map_or(0, |t| t.get());
                order.lock().unwrap().push((token, i));
                lease.release().await?;
            }
            Ok::<_, fencelock::LockError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let mut order = order.lock().unwrap().clone();
    order.sort_unstable();
    let total = order.len();
    let mut per = vec![0usize; clients];
    for (_, i) in &order {
        per[*i] += 1;
    }
    let again = order.windows(2).filter(|w| w[0].1 == w[1].1).count();
    let shares: Vec<String> = per
        .iter()
        .map(|n| format!("{:.0}%", 100.0 * *n as f64 / total.max(1) as f64))
        .collect();
    println!(
        "{} clients, {}, {secs} s: {total} grants ({:.0}/s), per client {per:?} ({}), \
         same client twice in a row {again} of {} hand-overs",
        clients,
        if fair { "fair" } else { "non-fair" },
        total as f64 / secs as f64,
        shares.join(" / "),
        total.saturating_sub(1),
    );
    Ok(())
}
