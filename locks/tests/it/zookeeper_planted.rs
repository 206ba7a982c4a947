//! Nodes planted by hand in a lock's queue, by a client with every right
//! (anyone on an open server, the admin on a secured one): the recipes and
//! the holder lookup count only ephemeral nodes, in the order the server
//! created them, so a persistent "holder" holds nothing and a node named to
//! sort first queues where it was created. And the bound on a lock's
//! tokens (`HolderLookup::minted`).

use std::time::Duration;

use fencelock::zookeeper::ZooKeeperLock;
use fencelock::{HolderLookup, LockError, LockService};
use zookeeper_client as zk;

use crate::support::zookeeper::{
    connect, connect_rw, connect_string, gateway, lock_client, one_parked, parent_of, raw_client,
    secured, SESSION,
};
use crate::support::{assert_timeout, held, holder_of};

const WAIT: Duration = Duration::from_secs(20);
/// A queue node's name that sorts before every real one, by name and by
/// sequence.
const FIRST_BY_NAME: &str = "_c_00000000-0000-0000-0000-000000000000-lock--2147483648";

/// Where a planter puts its nodes: the lock's parent, made if missing.
async fn parent_for(planter: &zk::Client, name: &str) -> String {
    let parent = parent_of(name);
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    planter.mkdir(&parent, &persistent).await.unwrap();
    parent
}

/// A persistent node at the non-fair lock's path and one named to head the
/// queue, each claiming `victim` holds the lock, and a persistent
/// container: none is a holder to the lookup or a node to wait for.
async fn persistent_nodes_hold_nothing(planter: &zk::Client, locks: &ZooKeeperLock, name: &str) {
    let parent = parent_for(planter, name).await;
    let victim = locks.client_id().to_string();
    let claim = format!("00000000-0000-0000-0000-000000000000\n{victim}");
    for (node, mode) in [
        ("lock", zk::CreateMode::Persistent),
        (FIRST_BY_NAME, zk::CreateMode::Persistent),
        (
            "_c_00000000-0000-0000-0000-000000000001-write-0000000000",
            zk::CreateMode::Container,
        ),
    ] {
        planter
            .create(
                &format!("{parent}/{node}"),
                claim.as_bytes(),
                &mode.with_acls(zk::Acls::anyone_all()),
            )
            .await
            .unwrap_or_else(|e| panic!("plant {node}: {e}"));
    }
    assert_eq!(locks.current_holder(name).await.unwrap(), None);

    // The fair lock, a writer and a reader are granted at once.
    let lease = held(locks, name, SESSION).await;
    assert_eq!(locks.current_holder(name).await.unwrap(), holder_of(&lease));
    lease.release().await.unwrap();
    let rw = locks.read_write();
    held(&rw.write(), name, SESSION)
        .await
        .release()
        .await
        .unwrap();
    held(&rw.read(), name, SESSION)
        .await
        .release()
        .await
        .unwrap();

    // The non-fair lock cannot create its node over a persistent one: it
    // says so, and does not delete it (that could delete a holder's).
    match locks.clone().non_fair().acquire(name, SESSION, WAIT).await {
        Err(LockError::InvalidConfig(msg)) => assert!(msg.contains("not an ephemeral"), "{msg}"),
        other => panic!("non-fair acquire over a persistent node: {other:?}"),
    }
    assert_eq!(locks.current_holder(name).await.unwrap(), None);
}

#[tokio::test]
async fn persistent_nodes_planted_by_anyone_on_an_open_server_hold_nothing() {
    let cs = connect_string().await;
    let planter = zk::Client::connect(&cs).await.unwrap();
    let locks = connect(&cs).await.with_client_id("alice").unwrap();
    persistent_nodes_hold_nothing(&planter, &locks, "planted-open").await;
}

#[tokio::test]
async fn persistent_nodes_planted_by_the_admin_hold_nothing() {
    let s = secured().await;
    let planter = raw_client(&s.connect_string(), &["admin"]).await;
    let locks = lock_client("worker-a").await;
    persistent_nodes_hold_nothing(&planter, &locks, "planted-by-admin").await;
    // The gateway's own session sees no holder either.
    assert_eq!(
        gateway()
            .await
            .current_holder("planted-by-admin")
            .await
            .unwrap(),
        None
    );
}

/// An ephemeral node named to sort first, created while a holder and a
/// waiter are queued: it is granted after them (its czxid says so), and
/// before a waiter that came after it.
#[tokio::test]
async fn a_hand_named_ephemeral_node_queues_where_the_server_created_it() {
    let cs = connect_string().await;
    let name = "planted-ephemeral";
    let (a, w1, w2) = (
        connect(&cs).await.with_client_id("a").unwrap(),
        connect(&cs).await.with_client_id("w1").unwrap(),
        connect(&cs).await.with_client_id("w2").unwrap(),
    );
    let lookup = connect(&cs).await;
    let first = held(&a, name, SESSION).await;
    let queued = {
        let w1 = w1.clone();
        tokio::spawn(async move { w1.acquire(name, SESSION, WAIT).await })
    };
    one_parked(&w1).await;

    let planter = zk::Client::connect(&cs).await.unwrap();
    let planted = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let (_, _) = planter
        .create(
            &format!("{}/{FIRST_BY_NAME}", parent_of(name)),
            b"00000000-0000-0000-0000-000000000000\nmallory",
            &planted,
        )
        .await
        .unwrap();
    assert_eq!(
        lookup.current_holder(name).await.unwrap(),
        holder_of(&first)
    );

    first.release().await.unwrap();
    let second = queued.await.unwrap().expect("w1, queued first, is granted");
    assert_eq!(
        lookup.current_holder(name).await.unwrap(),
        holder_of(&second)
    );
    let behind = {
        let w2 = w2.clone();
        tokio::spawn(async move { w2.acquire(name, SESSION, WAIT).await })
    };
    one_parked(&w2).await;
    let second_token = second.token().unwrap();
    second.release().await.unwrap();

    // Now the planted node heads the queue: it holds, as any ephemeral
    // node whose turn it is, and w2 waits behind it until its session ends.
    let holder = lookup.current_holder(name).await.unwrap().unwrap();
    assert_eq!(holder.client_id, "mallory");
    assert!(holder.token > second_token);
    assert_timeout(
        a.acquire(name, SESSION, Duration::from_millis(200)).await,
        "a newcomer behind the planted node",
    );
    assert!(!behind.is_finished());
    drop(planter);
    let last = behind
        .await
        .unwrap()
        .expect("w2 once the planted node's session ended");
    assert_eq!(lookup.current_holder(name).await.unwrap(), holder_of(&last));
    last.release().await.unwrap();
}

/// `minted`: at or above every token granted for the lock, and below
/// every later one; also when the lock's parent is gone.
#[tokio::test]
async fn the_minted_bound_covers_every_token_and_stays_below_the_next() {
    let cs = connect_string().await;
    let name = "minted-bound";
    let locks = connect(&cs).await;
    let lease = held(&locks, name, SESSION).await;
    let token = lease.token().unwrap();
    let state = locks.state(name).await.unwrap();
    assert_eq!(state.holder, holder_of(&lease));
    assert!(state.minted >= Some(token), "{state:?}");
    lease.release().await.unwrap();
    let bound = locks.minted(name).await.unwrap().expect("a bound");
    assert!(bound >= token);
    let next = held(&locks, name, SESSION).await;
    assert!(next.token().unwrap() > bound);
    next.release().await.unwrap();

    // The read-write lock answers the same.
    let rw = connect_rw(&cs).await;
    assert!(rw.minted(name).await.unwrap() > Some(token));
}
