//! The ZooKeeper recipes against a real ZooKeeper (one standalone server for
//! this binary; each test uses its own lock names): the fair queue's rotation,
//! the read-write lock, the refused mix of fair and non-fair, and the recipe
//! fixes, with faults injected by a proxy that loses one reply on purpose.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::zookeeper::{ZooKeeperLock, LOCKS_ROOT};
use fencelock::{HolderLookup, Lease, LockError, LockService};
use harness::proxy::{Op, ZooKeeperProxy};
use harness::wait_until;
use zookeeper_client as zk;

use crate::support::zookeeper::{
    connect, connect_rw, connect_string, lock_nodes, zk_server, SESSION,
};
use crate::support::{assert_timeout, held, take_and_release};

const WAIT: Duration = Duration::from_secs(20);
/// Long enough for a waiter to have parked if it was ever going to.
const SHORT: Duration = Duration::from_millis(300);

fn token(lease: &Lease) -> u64 {
    lease.token().expect("zookeeper grants carry tokens").get()
}

/// The shared server's connect string, a proxy in front of it (to lose or
/// repeat a reply on purpose), and a holder connected to the server itself.
async fn a_holder_and_a_proxy() -> (String, ZooKeeperProxy, ZooKeeperLock) {
    let cs = connect_string().await;
    let proxy = ZooKeeperProxy::start(zk_server().await.port()).await;
    let holder = connect(&cs).await;
    (cs, proxy, holder)
}

#[track_caller]
fn assert_refused_mix(result: Result<Lease, LockError>, what: &str) {
    match result {
        Err(LockError::InvalidConfig(msg)) => {
            assert!(msg.contains("fair"), "{what}: {msg}");
        }
        Ok(lease) => panic!(
            "{what}: granted (token {}) while the other variant holds the name",
            token(&lease)
        ),
        Err(e) => panic!("{what}: {e:?}, expected InvalidConfig"),
    }
}

/// Wait until `parked()` of each of `locks` is `n`.
async fn parked(what: &str, n: u64, parked: impl Fn() -> Vec<u64>) {
    wait_until(Duration::from_secs(10), || async {
        parked().iter().all(|p| *p == n).then_some(()).ok_or(())
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not parked ({:?})", parked()));
}

/// The next grant a waiter task reports, failing the test (not hanging it)
/// when none comes: a waiter that is never granted times out after `WAIT`.
async fn next_grant<T>(granted: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(WAIT + Duration::from_secs(5), granted.recv())
        .await
        .expect("no grant came")
        .expect("the waiter task ended without a grant")
}

/// Three clients, each on its own session, loop acquire → release on one lock
/// until `grants` grants were made. Before releasing, the holder waits until
/// the two others are parked on a watch, so all three are always queued at a
/// hand-over. Returns who was granted, in grant order, with the tokens.
async fn take_turns(cs: &str, name: &'static str, fair: bool, grants: usize) -> Vec<(usize, u64)> {
    let mut locks = Vec::new();
    for _ in 0..3 {
        let lock = connect(cs).await;
        locks.push(if fair { lock } else { lock.non_fair() });
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for me in 0..3 {
        let (locks, order, done) = (locks.clone(), order.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let lease = locks[me].acquire(name, SESSION, WAIT).await.unwrap();
                if done.load(Ordering::SeqCst) {
                    lease.release().await.unwrap();
                    return;
                }
                let n = {
                    let mut order = order.lock().unwrap();
                    order.push((me, token(&lease)));
                    order.len()
                };
                if n == grants {
                    done.store(true, Ordering::SeqCst);
                } else {
                    let others: Vec<&ZooKeeperLock> =
                        (0..3).filter(|i| *i != me).map(|i| &locks[i]).collect();
                    parked("the other two clients", 1, || {
                        others.iter().map(|l| l.parked()).collect()
                    })
                    .await;
                }
                lease.release().await.unwrap();
                if done.load(Ordering::SeqCst) {
                    return;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    order
}

#[tokio::test]
async fn three_always_queued_clients_take_strict_turns_on_the_fair_lock() {
    let order = take_turns(&connect_string().await, "rotation", true, 30).await;
    let who: Vec<usize> = order.iter().map(|(w, _)| *w).collect();
    let tokens: Vec<u64> = order.iter().map(|(_, t)| *t).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing in grant order: {tokens:?}"
    );
    // Strict rotation: the first three grants go to three different clients,
    // and from then on each grant goes to the client granted three before.
    let mut first = who[..3].to_vec();
    first.sort_unstable();
    assert_eq!(first, [0, 1, 2], "grant order {who:?}");
    for k in 3..who.len() {
        assert_eq!(who[k], who[k - 3], "grant {k} breaks the rotation: {who:?}");
    }
    for client in 0..3 {
        let share = who.iter().filter(|w| **w == client).count();
        assert!(
            share * 5 >= who.len(),
            "client {client} got {share} of {who:?}"
        );
    }
}

#[tokio::test]
async fn readers_share_the_lock() {
    let cs = connect_string().await;
    let (a, b) = (connect_rw(&cs).await, connect_rw(&cs).await);
    let r1 = a
        .read()
        .acquire("rw-share", SESSION, Duration::ZERO)
        .await
        .unwrap();
    let r2 = b
        .read()
        .acquire("rw-share", SESSION, Duration::ZERO)
        .await
        .expect("a second reader is granted while the first holds");
    assert!(!r1.is_lost() && !r2.is_lost());
    assert!(r1.renew().await.is_ok() && r2.renew().await.is_ok());
    assert_ne!(token(&r1), token(&r2));
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    assert!(lock_nodes(&cs, "rw-share").await.is_empty());
}

#[tokio::test]
async fn a_writer_excludes_readers_writers_and_the_mutex_and_waits_for_readers() {
    let cs = connect_string().await;
    let name = "rw-exclusive";
    let (a, b) = (connect_rw(&cs).await, connect_rw(&cs).await);
    let mutex = connect(&cs).await;

    let w = held(&a.write(), name, SESSION).await;
    assert_timeout(b.read().acquire(name, SESSION, SHORT).await, "reader");
    assert_timeout(b.write().acquire(name, SESSION, SHORT).await, "writer");
    assert_timeout(mutex.acquire(name, SESSION, SHORT).await, "fair mutex");
    w.release().await.unwrap();

    let r = held(&b.read(), name, SESSION).await;
    assert_timeout(
        a.write().acquire(name, SESSION, SHORT).await,
        "writer behind a reader",
    );
    assert_timeout(
        mutex.acquire(name, SESSION, SHORT).await,
        "mutex behind a reader",
    );
    r.release().await.unwrap();
    take_and_release(&a.write(), name, SESSION).await;
    assert!(lock_nodes(&cs, name).await.is_empty());
}

#[tokio::test]
async fn a_reader_queued_behind_a_writer_waits_for_it_though_readers_hold() {
    let cs = connect_string().await;
    let name = "rw-queued";
    let (a, b, c) = (
        connect_rw(&cs).await,
        connect_rw(&cs).await,
        connect_rw(&cs).await,
    );
    let r1 = held(&a.read(), name, SESSION).await;

    let (tx, mut granted) = tokio::sync::mpsc::unbounded_channel::<(&str, u64)>();
    let (release_w, released) = tokio::sync::oneshot::channel::<()>();
    let writer = {
        let (b, tx) = (b.clone(), tx.clone());
        tokio::spawn(async move {
            let w = b.write().acquire(name, SESSION, WAIT).await.unwrap();
            tx.send(("writer", token(&w))).unwrap();
            released.await.unwrap();
            w.release().await.unwrap();
        })
    };
    parked("the writer", 1, || vec![b.parked()]).await;
    let reader = {
        let c = c.clone();
        tokio::spawn(async move {
            let r2 = c.read().acquire(name, SESSION, WAIT).await.unwrap();
            tx.send(("reader 2", token(&r2))).unwrap();
            r2.release().await.unwrap();
        })
    };
    // The second reader waits, although only a reader holds the lock.
    parked("the second reader", 1, || vec![c.parked()]).await;
    assert!(granted.try_recv().is_err(), "granted past a queued writer");

    r1.release().await.unwrap();
    let (who, w_token) = next_grant(&mut granted).await;
    assert_eq!(who, "writer");
    // The writer holds; the second reader is still parked behind it.
    assert_eq!(c.parked(), 1);
    assert!(granted.try_recv().is_err());
    release_w.send(()).unwrap();
    let (who, r2_token) = next_grant(&mut granted).await;
    assert_eq!(who, "reader 2");
    writer.await.unwrap();
    reader.await.unwrap();
    assert!(
        w_token < r2_token,
        "writer {w_token}, reader after it {r2_token}"
    );
}

#[tokio::test]
async fn read_write_tokens_increase_in_grant_order() {
    let cs = connect_string().await;
    let name = "rw-tokens";
    let rws = [
        connect_rw(&cs).await,
        connect_rw(&cs).await,
        connect_rw(&cs).await,
        connect_rw(&cs).await,
    ];
    let w1 = rws[0]
        .write()
        .acquire(name, SESSION, Duration::ZERO)
        .await
        .unwrap();
    let (tx, mut granted) = tokio::sync::mpsc::unbounded_channel::<(usize, Lease)>();
    // Readers 1 and 2, then writer 2, queue behind writer 1, in that order.
    for (i, reader) in [(1, true), (2, true), (3, false)] {
        let (rw, tx) = (rws[i].clone(), tx.clone());
        tokio::spawn(async move {
            let lease = if reader {
                rw.read().acquire(name, SESSION, WAIT).await
            } else {
                rw.write().acquire(name, SESSION, WAIT).await
            };
            tx.send((i, lease.unwrap())).unwrap();
        });
        parked("the new waiter", 1, || vec![rws[i].parked()]).await;
    }
    let w1_token = token(&w1);
    w1.release().await.unwrap();
    // Both readers are granted together; the second writer still waits.
    let (first, r_a) = next_grant(&mut granted).await;
    let (second, r_b) = next_grant(&mut granted).await;
    let mut readers = [first, second];
    readers.sort_unstable();
    assert_eq!(readers, [1, 2]);
    assert_eq!(rws[3].parked(), 1);
    let reader_tokens = [token(&r_a), token(&r_b)];
    r_a.release().await.unwrap();
    r_b.release().await.unwrap();
    let (last, w2) = next_grant(&mut granted).await;
    assert_eq!(last, 3);
    let w2_token = token(&w2);
    w2.release().await.unwrap();
    for r in reader_tokens {
        assert!(
            w1_token < r && r < w2_token,
            "writer 1 {w1_token} < reader {r} < writer 2 {w2_token}"
        );
    }
}

#[tokio::test]
async fn fair_and_non_fair_locks_refuse_each_others_names() {
    let cs = connect_string().await;
    let fair = connect(&cs).await;
    let non_fair = connect(&cs).await.non_fair();
    let rw = connect_rw(&cs).await;

    let fair_lease = held(&fair, "mix-a", SESSION).await;
    assert_refused_mix(
        non_fair.acquire("mix-a", SESSION, SHORT).await,
        "non-fair while the fair lock holds",
    );
    assert_eq!(
        lock_nodes(&cs, "mix-a").await.len(),
        1,
        "the refused node is deleted"
    );
    fair_lease.release().await.unwrap();

    let non_fair_lease = held(&non_fair, "mix-b", SESSION).await;
    assert_refused_mix(
        fair.acquire("mix-b", SESSION, SHORT).await,
        "fair while the non-fair lock holds",
    );
    assert_refused_mix(
        rw.read().acquire("mix-b", SESSION, SHORT).await,
        "reader while the non-fair lock holds",
    );
    assert_eq!(lock_nodes(&cs, "mix-b").await, ["lock"]);
    non_fair_lease.release().await.unwrap();

    let reader = held(&rw.read(), "mix-c", SESSION).await;
    assert_refused_mix(
        non_fair.acquire("mix-c", SESSION, SHORT).await,
        "non-fair while a reader holds",
    );
    reader.release().await.unwrap();
    // Once the other variant is gone, the name is free for either.
    let later = held(&non_fair, "mix-c", SESSION).await;
    later.release().await.unwrap();
}

#[tokio::test]
async fn the_holder_lookup_names_the_writer_and_the_non_fair_holder_but_no_reader() {
    let cs = connect_string().await;
    // The storage's own session, as the gateway has one (a plain, fair service).
    let lookup = connect(&cs).await;
    let rw = connect_rw(&cs).await.with_client_id("writer-7").unwrap();

    let w = rw
        .write()
        .acquire("lookup-rw", SESSION, Duration::ZERO)
        .await
        .unwrap();
    let holder = lookup.current_holder("lookup-rw").await.unwrap().unwrap();
    assert_eq!(holder.client_id, "writer-7");
    assert_eq!(holder.token, w.token().unwrap());
    w.release().await.unwrap();

    let r = rw
        .read()
        .acquire("lookup-rw", SESSION, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(lookup.current_holder("lookup-rw").await.unwrap(), None);
    assert_eq!(rw.current_holder("lookup-rw").await.unwrap(), None);
    r.release().await.unwrap();

    let non_fair = connect(&cs)
        .await
        .non_fair()
        .with_client_id("naive-1")
        .unwrap();
    let n = held(&non_fair, "lookup-nf", SESSION).await;
    let holder = lookup.current_holder("lookup-nf").await.unwrap().unwrap();
    assert_eq!(holder.client_id, "naive-1");
    assert_eq!(holder.token, n.token().unwrap());
    n.release().await.unwrap();
    assert_eq!(lookup.current_holder("lookup-nf").await.unwrap(), None);
}

/// The non-fair release after a lost reply: the delete went through, its reply
/// never came, and the next holder's node now sits at the same path. The
/// release must find it is not ours and leave it.
#[tokio::test]
async fn a_release_whose_delete_reply_is_lost_leaves_the_next_holders_node() {
    let cs = connect_string().await;
    let name = "lost-delete-reply";
    let proxy = ZooKeeperProxy::start(zk_server().await.port()).await;
    // Long enough a session that it outlives the time the proxy turns it away.
    let a = ZooKeeperLock::connect(&proxy.connect_string(), Duration::from_secs(10))
        .await
        .unwrap()
        .non_fair();
    let b = connect(&cs).await.non_fair();

    let held = a.acquire(name, SESSION, Duration::ZERO).await.unwrap();
    let next = {
        let b = b.clone();
        tokio::spawn(async move { b.acquire(name, SESSION, WAIT).await.unwrap() })
    };
    parked("the next holder", 1, || vec![b.parked()]).await;

    proxy.lose_reply(Op::Delete);
    let release = tokio::spawn(held.release());
    proxy.fired().await;
    // The delete took effect: the waiter is granted, at the same path.
    let next = next.await.unwrap();
    proxy.reopen();

    let released = release.await.unwrap();
    assert_eq!(released, Ok(()), "our delete did go through");
    let client = zk::Client::connect(&cs).await.unwrap();
    let stat = client
        .check_stat(&format!("{LOCKS_ROOT}/{name}/lock"))
        .await
        .unwrap()
        .expect("the next holder's node survives our release");
    assert_eq!(stat.czxid as u64, token(&next));
    next.renew().await.expect("the next holder still holds");
    assert!(!next.is_lost());
    next.release().await.unwrap();
}

/// A create applied twice (as when its reply is lost and the recovery misses
/// the first node): the second node, ours, queues behind the first, also
/// ours. The acquire must delete the stray, not wait behind itself.
#[tokio::test]
async fn a_waiter_deletes_a_stray_node_of_its_own_ahead_of_it() {
    let name = "stray-own-node";
    let (cs, proxy, holder) = a_holder_and_a_proxy().await;
    let waiter = connect(&proxy.connect_string()).await;

    let held = holder.acquire(name, SESSION, Duration::ZERO).await.unwrap();
    proxy.duplicate(Op::Create);
    let acquire = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.acquire(name, SESSION, Duration::from_secs(5)).await })
    };
    proxy.fired().await;
    parked("the waiter", 1, || vec![waiter.parked()]).await;
    // The holder's node and one of the waiter's: the stray is gone.
    assert_eq!(lock_nodes(&cs, name).await.len(), 2);
    held.release().await.unwrap();
    let lease = acquire
        .await
        .unwrap()
        .expect("granted once the holder released, not stuck behind its own node");
    assert_eq!(lock_nodes(&cs, name).await.len(), 1);
    lease.release().await.unwrap();
    assert!(lock_nodes(&cs, name).await.is_empty());
}

/// A create whose reply is lost is found by its GUID (after a `sync`) when
/// the session is back, not made a second time.
#[tokio::test]
async fn a_create_whose_reply_is_lost_is_found_not_repeated() {
    let name = "lost-create-reply";
    let (cs, proxy, holder) = a_holder_and_a_proxy().await;
    let waiter = ZooKeeperLock::connect(&proxy.connect_string(), Duration::from_secs(10))
        .await
        .unwrap();

    let held = holder.acquire(name, SESSION, Duration::ZERO).await.unwrap();
    proxy.lose_reply(Op::Create);
    let acquire = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.acquire(name, SESSION, WAIT).await })
    };
    proxy.fired().await;
    proxy.reopen();
    parked("the waiter", 1, || vec![waiter.parked()]).await;
    // The holder's node is the parent's first (sequence 0); the waiter's lost
    // create made the second. A repeated create would have made a third (and
    // the stray check would then have deleted the second).
    let mut nodes = lock_nodes(&cs, name).await;
    nodes.sort_by_key(|n| n.rsplit_once("-lock-").map(|(_, seq)| seq.to_string()));
    assert_eq!(nodes.len(), 2, "one node for the waiter: {nodes:?}");
    assert!(
        nodes[1].ends_with("-lock-0000000001"),
        "the waiter waits on the node its lost create made: {nodes:?}"
    );
    held.release().await.unwrap();
    let lease = acquire.await.unwrap().unwrap();
    lease.release().await.unwrap();
    assert!(lock_nodes(&cs, name).await.is_empty());
}

/// What one holder lookup (the gateway's question) costs from another
/// session, on a queue of 1 (the holder alone) and of 3 (the holder and two
/// waiters): the median and 90th percentile of 500 lookups. A measurement,
/// not a claim; run by hand:
/// `cargo test -p fencelock --test it lookup_cost -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "a measurement, run by hand"]
async fn lookup_cost() {
    let cs = connect_string().await;
    let lookup = connect(&cs).await;
    for queue in [1, 3] {
        let name = format!("lookup-cost-{queue}");
        let holder = connect(&cs).await.with_client_id("holder").unwrap();
        let lease = held(&holder, &name, SESSION).await;
        let mut waiters = Vec::new();
        for _ in 1..queue {
            let waiter = connect(&cs).await;
            let task = {
                let (waiter, name) = (waiter.clone(), name.clone());
                tokio::spawn(async move { waiter.acquire(&name, SESSION, WAIT).await })
            };
            parked("a waiter", 1, || vec![waiter.parked()]).await;
            waiters.push(task);
        }
        for _ in 0..50 {
            lookup.current_holder(&name).await.unwrap();
        }
        let mut took = Vec::new();
        for _ in 0..500 {
            let started = std::time::Instant::now();
            let found = lookup.current_holder(&name).await.unwrap();
            took.push(started.elapsed());
            assert_eq!(found.map(|h| h.token), lease.token());
        }
        took.sort_unstable();
        println!(
            "queue of {queue}: median {:?}, p90 {:?}",
            took[took.len() / 2],
            took[took.len() * 9 / 10]
        );
        lease.release().await.unwrap();
        for w in waiters {
            w.await.unwrap().unwrap().release().await.unwrap();
        }
    }
}
