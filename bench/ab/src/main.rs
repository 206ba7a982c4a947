//! One round of the uncontended A/B (see `scripts/ab-uncontended`): a fresh
//! client (its own connection, so its own place among the runtime's
//! threads), 500 acquire+release pairs to warm up, then pairs back to back
//! on one lock for the given seconds. Prints the rate (pairs/s).
//!
//! `ab-probe <redis url> <secs> <current|multi> [non-fair]`

use std::time::{Duration, Instant};

use fencelock::redis::RedisLock;
use fencelock::{AcquireOptions, LockService};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "ab-probe <redis url> <secs> <current|multi> [non-fair]";
    let url = args.get(1).expect(usage).clone();
    let secs: f64 = args.get(2).expect(usage).parse().expect(usage);
    let runtime = match args.get(3).map(String::as_str) {
        Some("current") => tokio::runtime::Builder::new_current_thread(),
        Some("multi") => tokio::runtime::Builder::new_multi_thread(),
        _ => panic!("{usage}"),
    }
    .enable_all()
    .build()
    .expect("runtime");
    let non_fair = args.get(4).map(String::as_str) == Some("non-fair");
    let rate = runtime.block_on(async move {
        // Spawned, as the benchmarks' clients are: on the multi-threaded
        // runtime the loop runs on a worker thread, like the connection's
        // driver task.
        tokio::spawn(round(url, Duration::from_secs_f64(secs), non_fair))
            .await
            .expect("round panicked")
    });
    println!("{rate:.0}");
}

async fn round(url: String, secs: Duration, non_fair: bool) -> f64 {
    let lock = RedisLock::connect(&url).await.expect("connect");
    let lock = variant(lock, non_fair);
    let opts = AcquireOptions::new(Duration::from_secs(10))
        .wait(Duration::from_secs(30))
        .auto_renew(false);
    let name = format!("ab-{}", std::process::id());
    for _ in 0..500 {
        let lease = lock.acquire_with(&name, opts).await.expect("acquire");
        lease.release().await.expect("release");
    }
    let start = Instant::now();
    let mut pairs = 0u64;
    while start.elapsed() < secs {
        let lease = lock.acquire_with(&name, opts).await.expect("acquire");
        lease.release().await.expect("release");
        pairs += 1;
    }
    pairs as f64 / start.elapsed().as_secs_f64()
}

#[cfg(feature = "variants")]
fn variant(lock: RedisLock, non_fair: bool) -> RedisLock {
    if non_fair {
        lock.non_fair()
    } else {
        lock
    }
}

#[cfg(not(feature = "variants"))]
fn variant(lock: RedisLock, non_fair: bool) -> RedisLock {
    assert!(!non_fair, "this build's Redis lock has no non-fair variant");
    lock
}
