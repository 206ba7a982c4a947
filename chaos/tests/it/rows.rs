//! The suite's assertions, each over the rows the chaos runner produces for
//! a subset of the matrix. A failure prints the table and the seed to replay:
//! `cargo run -p chaos -- --seed N --scenario S --backend B --fencing F`.

use chaos::{report, Backend, Plan, Row, Scenario};

use crate::{seed, SERIAL};

const FENCED: [Backend; 4] = [
    Backend::Redis,
    Backend::Zookeeper,
    Backend::LeasePostgres,
    Backend::LeaseMysql,
];

/// `scenarios` on every fenced backend, with the fence on.
fn fenced(scenarios: &[Scenario]) -> Plan {
    Plan::new(seed())
        .scenarios(scenarios)
        .backends(&FENCED)
        .fencing(true)
}

/// Run `plan` alone, print its table and seed, and check that its rows
/// (`n` of them, if given) hold every assertion of [`chaos::violations`].
async fn run_holding(plan: Plan, n: Option<usize>) -> Vec<Row> {
    let _one_at_a_time = SERIAL.lock().await;
    let rows = chaos::run(&plan).await;
    let table = report::table(&rows);
    eprintln!("seed {}\n{table}", plan.seed);
    assert!(!rows.is_empty(), "no rows ran");
    if let Some(n) = n {
        assert_eq!(rows.len(), n, "{table}");
    }
    let violations = chaos::violations(&rows);
    assert!(
        violations.is_empty(),
        "seed {}:\n{}\n{table}",
        plan.seed,
        violations.join("\n"),
    );
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_backends_lose_nothing_under_gc_pause_at_writing_and_reject_the_stale_write() {
    let rows = run_holding(fenced(&[Scenario::GcPauseWriting]), Some(FENCED.len())).await;
    assert!(rows.iter().all(|r| r.stale_rejected >= 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_fence_a_gc_pause_at_writing_loses_an_update_on_every_backend() {
    let plan = Plan::new(seed())
        .scenarios(&[Scenario::GcPauseWriting])
        .fencing(false);
    let rows = run_holding(plan, Some(Backend::ALL.len())).await;
    assert!(rows.iter().all(|r| r.lost_updates >= 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_backends_reject_a_delayed_write_and_lose_nothing() {
    run_holding(fenced(&[Scenario::DelayedWrite]), Some(FENCED.len())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_backends_lose_nothing_under_pause_at_read_crash_and_clock_jump() {
    let plan = fenced(&[Scenario::GcPauseRead, Scenario::Crash, Scenario::ClockJump]);
    run_holding(plan, Some(3 * FENCED.len())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_restarts_lose_no_acknowledged_edit_and_redlock_gets_a_second_holder() {
    let plan = Plan::new(seed()).scenarios(&[
        Scenario::RedisRestart,
        Scenario::ZookeeperRestart,
        Scenario::PostgresRestart,
    ]);
    let rows = run_holding(plan, None).await;
    let redlock = rows
        .iter()
        .find(|r| r.backend == "redlock" && r.scenario == "redis-restart")
        .expect("redlock restart row");
    assert!(redlock.double_holders >= 1, "{redlock:?}");
}

/// ZooKeeper on its three-node ensemble: the leader killed, and the
/// holder's server cut off from the other two past the session timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zookeeper_leader_kill_or_partition_loses_nothing_with_the_fence() {
    let plan =
        Plan::new(seed()).scenarios(&[Scenario::ZookeeperLeaderKill, Scenario::ZookeeperPartition]);
    // Each with the fence on and off.
    let rows = run_holding(plan, Some(4)).await;
    for r in rows.iter().filter(|r| r.fencing) {
        assert_eq!((r.lost_updates, r.stale_accepted), (0, 0), "{r:?}");
    }
}

/// Redis Sentinel and Redlock: a failover that loses a grant (and the same
/// with WAIT 1), and a Redlock client cut off from one master of three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_hands_the_lock_to_a_second_holder_whom_the_issuer_check_names() {
    let plan = Plan::new(seed()).scenarios(&[
        Scenario::SentinelFailover,
        Scenario::SentinelFailoverWait,
        Scenario::RedlockPartition,
    ]);
    let rows = run_holding(plan, Some(5)).await;
    let failover: Vec<&Row> = rows
        .iter()
        .filter(|r| r.scenario == Scenario::SentinelFailover.name())
        .collect();
    assert_eq!(failover.len(), 2);
    for r in failover {
        // The second holder is counted, and explained in the notes
        // (run_holding checks both): the promoted replica re-minted the lost
        // grant's token, which is not lower than the page's fence.
        assert!(r.double_holders >= 1, "{r:?}");
        assert!(
            r.notes
                .iter()
                .any(|n| n.contains("the same number, re-minted")),
            "{r:?}"
        );
        assert_eq!(
            r.stale_accepted, 0,
            "an equal token is not a lower one: {r:?}"
        );
        if r.fencing {
            // The issuer check (the promoted master names b) refuses a's
            // write: nothing acknowledged is lost.
            assert!(r.token_not_current >= 1, "{r:?}");
            assert_eq!(r.lost_updates, 0, "{r:?}");
            assert!(
                r.notes
                    .iter()
                    .any(|n| n.contains("its write was rejected (token_not_current)")),
                "{r:?}"
            );
        } else {
            // Without it, a's write lands and b's acknowledged edit is gone.
            assert!(r.lost_updates >= 1, "{r:?}");
        }
    }
    for r in rows
        .iter()
        .filter(|r| r.scenario == Scenario::SentinelFailoverWait.name())
    {
        assert_eq!(
            (r.double_holders, r.lost_updates, r.stale_accepted),
            (0, 0, 0),
            "{r:?}"
        );
    }
    for r in rows.iter().filter(|r| r.fencing) {
        assert_eq!((r.lost_updates, r.stale_accepted), (0, 0), "{r:?}");
    }
}

/// The storage failing over, on one backend: the lock service is not what
/// fails here, the storage is. ZooKeeper's token (a zxid) never goes back by itself, so any
/// regression is the database's.
const FAILOVER_BACKEND: [Backend; 1] = [Backend::Zookeeper];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_failover_loses_no_acknowledged_edit_and_keeps_the_fence() {
    let plan = Plan::new(seed())
        .scenarios(&[
            Scenario::PostgresFailoverSync,
            Scenario::PostgresFailoverAsync,
        ])
        .backends(&FAILOVER_BACKEND)
        .fencing(true);
    // violations() exempts the async row from the loss checks: it is reported as measured.
    let rows = run_holding(plan, Some(2)).await;
    let sync = rows
        .iter()
        .find(|r| r.scenario == Scenario::PostgresFailoverSync.name())
        .expect("sync row");
    assert_eq!((sync.lost_updates, sync.stale_accepted), (0, 0), "{sync:?}");
    assert!(
        !sync
            .notes
            .iter()
            .any(|n| n.starts_with(chaos::failover::FENCE_WENT_BACKWARDS)),
        "{sync:?}"
    );
    let async_row = rows
        .iter()
        .find(|r| r.scenario == Scenario::PostgresFailoverAsync.name())
        .expect("async row");
    eprintln!(
        "asynchronous standby, as measured: {} acknowledged, {} lost, {} stale accepted; {}",
        async_row.acknowledged,
        async_row.lost_updates,
        async_row.stale_accepted,
        async_row.notes.join("; ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_behind_the_balancer_costs_requests_not_acknowledged_edits() {
    let plan = Plan::new(seed())
        .scenarios(&[Scenario::GatewayKill])
        .backends(&FAILOVER_BACKEND)
        .fencing(true);
    let rows = run_holding(plan, Some(1)).await;
    assert!(rows[0].acknowledged >= 1, "{:?}", rows[0]);
}
