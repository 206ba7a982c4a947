//! The two-minute soak: every fenced backend at once under random
//! faults from the whole catalogue, then the checker over the complete
//! history must find nothing. `cargo run -p chaos -- --soak --minutes 30` is
//! the long one (docs/CHAOS.md, "Soak").
//!
//! `CHAOS_SOAK_MINUTES` changes the length; `CHAOS_SEED` replays a run.
//! Root is needed: the ZooKeeper ensemble runs in network namespaces (its
//! two faults, `zookeeper-partition` and `zookeeper-leader-kill`, are among
//! the kinds that must be injected).

use std::time::Duration;

use chaos::soak::{self, Fault, SoakConfig};

use crate::{seed, SERIAL};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_minutes_of_random_faults_on_every_fenced_backend_leave_a_clean_history() {
    let _one_at_a_time = SERIAL.lock().await;
    let seed = seed();
    let minutes: f64 = std::env::var("CHAOS_SOAK_MINUTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let config = SoakConfig::new(seed, Duration::from_secs_f64(minutes * 60.0));
    let backends = config.backends.len();
    let report = soak::run(config).await.expect("the soak ran");
    eprintln!("seed {seed}\n{}", report.table());
    for f in report.faults.iter().filter(|f| f.error.is_some()) {
        eprintln!("fault that could not complete: {f:?}");
    }
    assert!(
        report.violations.is_empty(),
        "seed {seed}: the checker found:\n{}\n{}",
        report.violations.join("\n"),
        report.table()
    );
    // The run did what it says: every backend edited, every kind of fault
    // was injected, and the fence had stale writes to refuse.
    let by_kind = report.faults_by_kind();
    let missing: Vec<&str> = Fault::ALL
        .iter()
        .filter(|f| !by_kind.contains_key(f))
        .map(|f| f.name())
        .collect();
    assert!(
        missing.is_empty(),
        "seed {seed}: faults never injected: {missing:?}"
    );
    let mut edited: Vec<&str> = report
        .pages
        .iter()
        .filter(|p| p.acknowledged > 0)
        .map(|p| p.backend.as_str())
        .collect();
    edited.dedup();
    assert_eq!(edited.len(), backends, "seed {seed}: {}", report.table());
    assert!(
        report.total(|p| p.stale_refused + p.not_current_refused) >= 1,
        "seed {seed}: no stale write was refused: {}",
        report.table()
    );
}
