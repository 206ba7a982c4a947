//! The ZooKeeper lock against real ZooKeeper: one standalone server shared by
//! the tests (each uses its own lock names), and a three-node ensemble for the
//! failover test.

use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::zookeeper::{ZooKeeperLock, LOCKS_ROOT};

use fencelock::{AcquireOptions, LockError, LockService};
use harness::wait_until;
use harness::zookeeper::ZooKeeperEnsemble;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::support::zookeeper::{connect, connect_string, connected, lock_nodes, SESSION};
use crate::support::{held, held_with};

#[track_caller]
fn assert_increasing(tokens: &[u64]) {
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing: {tokens:?}"
    );
}

#[tokio::test]
async fn bad_or_unreachable_connect_strings_fail_at_once() {
    let started = Instant::now();
    let unreachable =
        ZooKeeperLock::connect(&format!("127.0.0.1:{}", harness::free_port()), SESSION)
            .await
            .err()
            .expect("nobody listens there");
    assert!(
        matches!(unreachable, LockError::Unavailable { .. }),
        "{unreachable:?}"
    );
    assert!(started.elapsed() < SESSION, "took {:?}", started.elapsed());
    let empty = ZooKeeperLock::connect("", SESSION).await.err().unwrap();
    assert!(matches!(empty, LockError::InvalidConfig(_)), "{empty:?}");
    let bad = ZooKeeperLock::connect("127.0.0.1:notaport", SESSION)
        .await
        .err()
        .unwrap();
    assert!(matches!(bad, LockError::InvalidConfig(_)), "{bad:?}");
}

#[tokio::test]
async fn waiters_are_granted_in_arrival_order_with_increasing_tokens_one_at_a_time() {
    let (cs, lock) = connected().await;
    let name = "fifo";
    let first = held(&lock, name, SESSION).await;
    let order = Arc::new(Mutex::new(vec![(0, first.token().unwrap().get())]));
    let inside = Arc::new(AtomicU32::new(0));
    let mut waiters = Vec::new();
    for i in 1..=5u32 {
        let (waiter, order, inside) = (lock.clone(), order.clone(), inside.clone());
        waiters.push(tokio::spawn(async move {
            let lease = waiter
                .acquire(name, SESSION, Duration::from_secs(20))
                .await
                .unwrap();
            assert_eq!(
                inside.fetch_add(1, Ordering::SeqCst),
                0,
                "two holders at once"
            );
            order
                .lock()
                .unwrap()
                .push((i, lease.token().unwrap().get()));
            tokio::task::yield_now().await;
            inside.fetch_sub(1, Ordering::SeqCst);
            lease.release().await.unwrap();
        }));
        // Waiter i is queued (parked on its predecessor) before i+1 arrives.
        wait_until(Duration::from_secs(10), || async {
            (lock.parked() == u64::from(i)).then_some(()).ok_or(())
        })
        .await
        .unwrap_or_else(|_| panic!("waiter {i} never parked"));
    }
    first.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let who: Vec<u32> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(who, vec![0, 1, 2, 3, 4, 5]);
    assert_increasing(&order.iter().map(|(_, t)| *t).collect::<Vec<_>>());
    assert!(lock_nodes(&cs, name).await.is_empty());
}

#[tokio::test]
async fn separate_sessions_never_hold_at_once_and_tokens_only_grow() {
    let cs = connect_string().await;
    let inside = Arc::new(AtomicU32::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let lock = connect(&cs).await;
        let (inside, tokens) = (inside.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let lease = lock
                    .acquire("exclusive", SESSION, Duration::from_secs(20))
                    .await
                    .unwrap();
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokens.lock().unwrap().push(lease.token().unwrap().get());
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                lease.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 20);
    assert_increasing(&tokens);
}

#[tokio::test]
async fn timeouts_and_dropped_acquires_leave_no_node_behind() {
    let (cs, lock) = connected().await;
    let name = "timeouts";
    let held = held(&lock, name, SESSION).await;

    let once = lock
        .acquire(name, SESSION, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(once, LockError::Timeout { .. }), "{once:?}");
    assert_eq!(lock_nodes(&cs, name).await.len(), 1);

    let started = Instant::now();
    let waited = lock
        .acquire(name, SESSION, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(waited, LockError::Timeout { .. }), "{waited:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(lock_nodes(&cs, name).await.len(), 1);

    // Drop the acquire future while it waits: the guard deletes its node even
    // though the session lives on.
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        lock.acquire(name, SESSION, Duration::from_secs(30)),
    )
    .await;
    assert!(dropped.is_err(), "must still be waiting");
    wait_until(Duration::from_secs(5), || async {
        (lock_nodes(&cs, name).await.len() == 1)
            .then_some(())
            .ok_or(())
    })
    .await
    .expect("the dropped waiter's node is deleted");

    // A dropped lease deletes its node too, so others are not blocked for the
    // life of the session.
    drop(held);
    let next = lock
        .acquire(name, SESSION, Duration::from_secs(5))
        .await
        .expect("lock freed by the dropped lease");
    next.release().await.unwrap();
}

#[tokio::test]
async fn names_are_validated_and_escaped() {
    let (cs, lock) = connected().await;
    let err = lock.acquire("", SESSION, Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");
    let a = lock
        .acquire("pages/1", SESSION, Duration::ZERO)
        .await
        .unwrap();
    // "pages/1" and "pages%2F1" are different locks.
    let b = lock
        .acquire("pages%2F1", SESSION, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(lock_nodes(&cs, "pages%2F1").await.len(), 1);
    a.release().await.unwrap();
    b.release().await.unwrap();
}

/// Hold the lock with contender 0, queue the others, then release one holder
/// at a time once every remaining waiter is parked, counting the wake-ups each
/// release causes across all sessions.
async fn wakeups_per_release(cs: &str, name: &'static str, fair: bool) -> Vec<u64> {
    const N: usize = 5;
    let mut locks = Vec::new();
    for _ in 0..N {
        let lock = connect(cs).await;
        locks.push(if fair { lock } else { lock.non_fair() });
    }
    let wakeups = |locks: &[ZooKeeperLock]| locks.iter().map(|l| l.wakeups()).sum::<u64>();
    let parked = |locks: &[ZooKeeperLock]| locks.iter().map(|l| l.parked()).sum::<u64>();
    let (granted_tx, mut granted_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for lock in &locks {
        let lock = lock.clone();
        let granted = granted_tx.clone();
        tasks.push(tokio::spawn(async move {
            let lease = lock
                .acquire(name, Duration::from_secs(2), Duration::from_secs(30))
                .await
                .unwrap();
            let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
            granted
                .send((lease.token().unwrap().get(), release_tx))
                .unwrap();
            release_rx.await.unwrap();
            lease.release().await.unwrap();
        }));
    }
    let mut per_release = Vec::new();
    let mut tokens = Vec::new();
    for holder in 0..N {
        let (token, release) = granted_rx.recv().await.unwrap();
        tokens.push(token);
        let waiting = (N - 1 - holder) as u64;
        wait_until(Duration::from_secs(10), || async {
            (parked(&locks) == waiting).then_some(()).ok_or(())
        })
        .await
        .unwrap_or_else(|_| panic!("{waiting} waiters never parked"));
        if holder > 0 {
            let before = per_release.iter().sum::<u64>();
            per_release.push(wakeups(&locks) - before);
        }
        release.send(()).unwrap();
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_increasing(&tokens);
    per_release
}

#[tokio::test]
async fn fair_lock_wakes_one_waiter_per_release() {
    let cs = connect_string().await;
    let per_release = wakeups_per_release(&cs, "herd-fair", true).await;
    assert_eq!(per_release, vec![1, 1, 1, 1]);
}

#[tokio::test]
async fn non_fair_lock_wakes_every_waiter_on_every_release() {
    let cs = connect_string().await;
    let per_release = wakeups_per_release(&cs, "herd-non-fair", false).await;
    // N = 5: the first release wakes the 4 waiters, the next the 3 left...
    assert_eq!(per_release, vec![4, 3, 2, 1]);
}

const CHILD_CONNECT: &str = "ZK_LOCK_TEST_CHILD_CONNECT";
const CHILD_LOCK: &str = "ZK_LOCK_TEST_CHILD_LOCK";

/// Run by `paused_holder_loses_its_session_and_the_next_waiter_gets_a_higher_token`
/// in a child process (it does nothing when run directly). Prints `ACQUIRED
/// <token>`; a plain thread notices the resume after SIGCONT (a gap in its own
/// 20 ms sleeps) and checks the lease at once, before the ZooKeeper client has
/// had a chance to reconnect and learn about the expiry; then asks ZooKeeper
/// with a renewal.
#[tokio::test]
#[ignore = "child process of the SIGSTOP test"]
async fn child_holder_process() {
    let (Ok(connect_string), Ok(name)) = (std::env::var(CHILD_CONNECT), std::env::var(CHILD_LOCK))
    else {
        return;
    };
    let lock = connect(&connect_string).await;
    // A TTL far above the session timeout: only the session bounds the lease.
    let lease = lock
        .acquire(&name, Duration::from_secs(60), Duration::ZERO)
        .await
        .unwrap();
    let signal = lease.lost_signal();
    let resumed = tokio::task::spawn_blocking(move || loop {
        let before = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        if before.elapsed() > SESSION / 2 {
            return (signal.is_lost(), signal.reason());
        }
    });
    println!("ACQUIRED {}", lease.token().unwrap().get());
    let (lost, reason) = resumed.await.unwrap();
    println!("CHECK lost={lost} reason={reason:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match lease.renew().await {
            Err(e @ LockError::NotHeld { .. }) => {
                println!("RENEW refused: {e}");
                break;
            }
            Ok(v) => {
                println!("RENEW accepted {v:?}");
                break;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("renew: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                println!("RENEW failed: {e}");
                break;
            }
        }
    }
    println!("DONE");
}

async fn expect_line<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut Lines<R>,
    prefix: &str,
) -> String {
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_string();
            }
        }
        panic!("child exited before printing {prefix:?}");
    })
    .await;
    found.unwrap_or_else(|_| panic!("child never printed {prefix:?}"))
}

#[tokio::test]
async fn paused_holder_loses_its_session_and_the_next_waiter_gets_a_higher_token() {
    let cs = connect_string().await;
    let name = "paused-holder";
    // The test's path in this binary: `zookeeper_lock::child_holder_process`.
    let (_, module) = module_path!()
        .split_once("::")
        .expect("a module of the binary");
    let child_test = format!("{module}::child_holder_process");
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &child_test, "--ignored", "--nocapture"])
        .env(CHILD_CONNECT, &cs)
        .env(CHILD_LOCK, name)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("re-run the test binary as the holder");
    let pid = Pid::from_raw(child.id().unwrap() as i32);
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let paused_token: u64 = expect_line(&mut out, "ACQUIRED ").await.parse().unwrap();

    let waiter = connect(&cs).await;
    let next = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire(name, SESSION, Duration::from_secs(20)).await }
    });
    wait_until(Duration::from_secs(10), || async {
        (waiter.parked() == 1).then_some(()).ok_or(())
    })
    .await
    .expect("the waiter queues behind the child");
    assert!(!next.is_finished());

    kill(pid, Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    let lease = next
        .await
        .unwrap()
        .expect("granted once the child's session expired");
    // The child was silent for about the session timeout before ZooKeeper let go.
    assert!(
        stopped.elapsed() >= SESSION / 2,
        "granted after {:?}",
        stopped.elapsed()
    );
    let token = lease.token().unwrap().get();
    assert!(token > paused_token, "{token} <= {paused_token}");

    kill(pid, Signal::SIGCONT).unwrap();
    // The first check after resuming says "lost", from the lease's own
    // deadline (validity below the session timeout), not from ZooKeeper.
    let check = expect_line(&mut out, "CHECK ").await;
    assert!(
        check.starts_with("lost=true"),
        "resumed holder still trusts its lease: {check}"
    );
    assert!(check.contains("validity passed"), "{check}");
    let renew = expect_line(&mut out, "RENEW ").await;
    assert!(
        renew.starts_with("refused") && renew.contains("session"),
        "the resumed holder's session must be gone: {renew}"
    );
    expect_line(&mut out, "DONE").await;
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("child exits")
        .unwrap();
    assert!(status.success());
    lease.release().await.unwrap();
}

#[tokio::test]
async fn killing_the_ensemble_leader_keeps_the_lock_and_its_token() {
    let mut ensemble = ZooKeeperEnsemble::start().await;
    let cs = ensemble.connect_string();
    let session = Duration::from_secs(8);
    let holder = ZooKeeperLock::connect(&cs, session).await.unwrap();
    let other = ZooKeeperLock::connect(&cs, session).await.unwrap();
    let name = "failover";
    let lease = holder.acquire(name, session, Duration::ZERO).await.unwrap();
    let token = lease.token().unwrap().get();

    let old_leader = ensemble.leader().await.expect("a leader");
    ensemble.kill(old_leader);
    let new_leader = ensemble.wait_serving(Duration::from_secs(30)).await;
    assert_ne!(new_leader, old_leader);

    // The holder's session, node and token survived the failover.
    wait_until(Duration::from_secs(10), || lease.renew())
        .await
        .expect("holder renews through the new leader");
    assert!(!lease.is_lost(), "{:?}", lease.lost_reason());
    let client = zk::Client::connect(&cs).await.unwrap();
    let parent = format!("{LOCKS_ROOT}/{name}");
    let nodes = client.list_children(&parent).await.unwrap();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let (_, stat) = client
        .get_data(&format!("{parent}/{}", nodes[0]))
        .await
        .unwrap();
    assert_eq!(stat.czxid as u64, token);
    let refused = other
        .acquire(name, session, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(refused, LockError::Timeout { .. }), "{refused:?}");

    // New grants are ordered after the old ones: a higher epoch.
    lease.release().await.unwrap();
    let after = other.acquire(name, session, Duration::ZERO).await.unwrap();
    let new_token = after.token().unwrap().get();
    assert!(new_token > token);
    assert!(
        new_token >> 32 > token >> 32,
        "epoch {} not above {}",
        new_token >> 32,
        token >> 32
    );
    after.release().await.unwrap();
}

async fn election_hands_over_on_abdicate(fair: bool) {
    let cs = connect_string().await;
    let name = if fair {
        "election-fair"
    } else {
        "election-non-fair"
    };
    let mut candidates = Vec::new();
    for _ in 0..3 {
        let lock = connect(&cs).await;
        candidates.push(if fair { lock } else { lock.non_fair() });
    }
    let observer = candidates[0].election(name);
    let first = candidates[0].election(name).campaign("c0").await.unwrap();
    let seen = observer.leader().await.unwrap().unwrap();
    assert_eq!((seen.candidate.as_str(), seen.epoch), ("c0", first.epoch()));

    let mut pending = Vec::new();
    for (i, lock) in candidates.iter().enumerate().skip(1) {
        let election = lock.election(name);
        pending.push(tokio::spawn(async move {
            election.campaign(&format!("c{i}")).await.unwrap()
        }));
        wait_until(Duration::from_secs(10), || async {
            (lock.parked() == 1).then_some(()).ok_or(())
        })
        .await
        .expect("candidate waits");
    }
    let timed_out = candidates[0]
        .election(name)
        .campaign_for("late", Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(
        matches!(timed_out, LockError::Timeout { .. }),
        "{timed_out:?}"
    );

    let mut epochs = vec![first.epoch().get()];
    let mut leader = first;
    for _ in 0..2 {
        leader.abdicate().await.unwrap();
        let next = loop {
            // The next leader is whoever's campaign finishes.
            if let Some(i) = pending.iter().position(|p| p.is_finished()) {
                break pending.remove(i).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(!next.is_lost());
        let seen = observer.leader().await.unwrap().unwrap();
        assert_eq!(
            (seen.candidate.as_str(), seen.epoch),
            (next.candidate(), next.epoch())
        );
        epochs.push(next.epoch().get());
        leader = next;
    }
    assert_increasing(&epochs);
    if fair {
        assert_eq!(
            leader.candidate(),
            "c2",
            "fair election keeps arrival order"
        );
    }
    leader.abdicate().await.unwrap();
    assert_eq!(observer.leader().await.unwrap(), None);
}

#[tokio::test]
async fn fair_election_epochs_increase_and_abdicate_hands_over() {
    election_hands_over_on_abdicate(true).await;
}

#[tokio::test]
async fn non_fair_election_epochs_increase_and_abdicate_hands_over() {
    election_hands_over_on_abdicate(false).await;
}

#[tokio::test]
async fn lost_session_fires_the_lost_signal() {
    // Expire the session for real from the outside: a second client that
    // reuses the session id and password, then closes it.
    let (cs, lock) = connected().await;
    let lease = lock
        .acquire_with("expire", AcquireOptions::new(Duration::from_secs(60)))
        .await
        .unwrap();
    let mut lost = lease.lost_signal();
    assert!(!lost.is_lost());
    // The original client competes for the session while the twin takes it
    // over, so the twin's connect or its close can lose that race on a busy
    // machine: then the session simply did not end, and we try again. The
    // claim under test is only what happens once it does end.
    let mut reason = None;
    for _attempt in 0..5 {
        let session = lock.session_info().await;
        let twin = tokio::time::timeout(
            Duration::from_secs(5),
            zk::Client::connector().with_session(session).connect(&cs),
        )
        .await;
        if let Ok(Ok(twin)) = twin {
            drop(twin); // closing the twin closes the shared session on the server
        }
        if let Ok(r) = tokio::time::timeout(Duration::from_secs(5), lost.lost()).await {
            reason = Some(r);
            break;
        }
    }
    let reason = reason.expect("lost signal fires once the session is closed");
    assert!(reason.contains("session"), "{reason}");
    // The service opens a new session for the next acquire.
    let again = AcquireOptions::new(SESSION).wait(Duration::from_secs(5));
    held_with(&lock, "expire", again)
        .await
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn holder_lookup_from_another_session_names_the_client_and_token() {
    let cs = connect_string().await;
    let svc = connect(&cs).await.with_client_id("alice").unwrap();
    // The storage's own session, as the gateway has one.
    let lookup = connect(&cs).await;
    crate::support::contract::holder_lookup_names_the_client_and_token(
        &svc,
        &lookup,
        "alice",
        "holder-lookup",
        false,
    )
    .await;
}

#[tokio::test]
async fn dropped_lease_is_released_in_the_background() {
    let cs = connect_string().await;
    crate::support::contract::dropped_lease_is_released_in_the_background(
        &connect(&cs).await,
        "dropped-lease",
    )
    .await;
}

/// A holder connected only to a follower that is cut off from the leader must
/// stop trusting its lease before the majority hands the lock to the next
/// client: its renewals go through the leader (`sync`), so the cut follower
/// cannot vouch for a session the leader has expired. Without the `sync` the
/// follower answers the renewal's `exists` from its own state until its link
/// to the leader times out (`syncLimit` ticks, past the session timeout), and
/// the first holder still trusts its lease when the second one is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_partitioned_follower_stops_trusting_its_lease_before_the_next_grant() {
    let mut hosts = harness::ZooKeeperHosts::start().await;
    let leader = hosts.leader().await.expect("a leader");
    let cut = (leader + 1) % hosts.len();
    assert_eq!(hosts.mode(cut).await.as_deref(), Some("follower"));
    let a = connect(&hosts.connect_string_to(cut))
        .await
        .with_client_id("a")
        .unwrap();
    let b = connect(&hosts.connect_string_to(leader))
        .await
        .with_client_id("b")
        .unwrap();
    let held = a
        .acquire("partitioned", SESSION, Duration::ZERO)
        .await
        .expect("a is granted the lock");
    assert!(!held.is_lost());

    hosts.partition(cut).expect("cut the follower off");
    let next = b
        .acquire("partitioned", SESSION, Duration::from_secs(30))
        .await
        .expect("the majority expires a's session and grants b the lock");
    // `is_lost` compares the lease's trust deadline with the clock itself,
    // whatever its watchdog task managed to do meanwhile.
    let a_lost_at_grant = held.is_lost();
    hosts.heal().expect("heal");
    assert!(next.token() > held.token());
    assert!(
        a_lost_at_grant,
        "b was granted the lock while a still trusted its lease (reason so far: {:?})",
        held.lost_reason()
    );
    next.release().await.unwrap();
}
