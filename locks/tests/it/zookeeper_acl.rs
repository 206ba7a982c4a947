//! Who may do what on a ZooKeeper whose roots an operator prepared
//! (`prepare_root`) and whose clients authenticate: every right the rights
//! matrix denies is refused by ZooKeeper itself (`NoAuth`), next to a
//! positive control that the same user can do what it must. One secured
//! server for this binary (`admin` is its superuser), each test on its own
//! lock names; fresh servers where a test changes what is prepared.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use fencelock::zookeeper::{prepare_root, Access, ZooKeeperLock, ELECTIONS_ROOT, LOCKS_ROOT};
use fencelock::{HolderLookup, LockError, LockService};
use harness::zookeeper::secured::{credentials, roles};
use harness::zookeeper::ZooKeeperEnsemble;
use harness::ZooKeeper;
use zookeeper_client as zk;

use crate::support::contract;
use crate::support::zookeeper::{
    gateway, lock_client, only_node, parent_of, raw_client, secured, SESSION,
};
use crate::support::{assert_timeout, held, holder_of};

/// ZooKeeper refused `what` for lack of rights.
#[track_caller]
fn assert_no_auth<T: Debug>(result: Result<T, zk::Error>, what: &str) {
    match result {
        Err(zk::Error::NoAuth) => {}
        other => panic!("{what}: expected NoAuth from zookeeper, got {other:?}"),
    }
}

/// What every write a client may not make looks like from the lock
/// library: `InvalidConfig` carrying ZooKeeper's `NoAuth`.
#[track_caller]
fn assert_refused_no_auth<T: Debug>(result: Result<T, LockError>, what: &str) {
    match result {
        Err(LockError::InvalidConfig(msg)) if msg.contains("NoAuth") => {}
        other => panic!("{what}: expected zookeeper's NoAuth, got {other:?}"),
    }
}

const EPHEMERAL: zk::CreateOptions<'static> =
    zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
const PERSISTENT: zk::CreateOptions<'static> =
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());

/// Lock `name` held by lock client `worker-a` on the secured server: the
/// server's connect string, the lease, its lock node and that node's parent.
async fn held_by_worker_a(name: &str) -> (String, fencelock::Lease, String, String) {
    let cs = secured().await.connect_string();
    let lease = held(&lock_client("worker-a").await, name, SESSION).await;
    let node = only_node(&cs, name).await;
    (cs, lease, node, parent_of(name))
}

#[tokio::test]
async fn anonymous_clients_write_nowhere() {
    let name = "acl-anonymous";
    let (cs, lease, node, parent) = held_by_worker_a(name).await;
    let anonymous = raw_client(&cs, &[]).await;

    for path in [
        "/anywhere".to_string(),
        "/fencing/anywhere".into(),
        format!("{LOCKS_ROOT}/anywhere"),
        format!("{ELECTIONS_ROOT}/anywhere"),
        format!("{parent}/_c_00000000-0000-0000-0000-000000000000-lock-0000000000"),
    ] {
        assert_no_auth(
            anonymous.create(&path, b"x\nalice", &EPHEMERAL).await,
            &format!("anonymous create {path}"),
        );
    }
    for path in ["/", "/fencing", LOCKS_ROOT, &parent, &node] {
        assert_no_auth(
            anonymous.set_data(path, b"x\nalice", None).await,
            &format!("anonymous setData {path}"),
        );
        assert_no_auth(
            anonymous.set_acl(path, &zk::Acls::anyone_all(), None).await,
            &format!("anonymous setACL {path}"),
        );
    }
    assert_no_auth(anonymous.delete(&node, None).await, "anonymous delete");
    assert_no_auth(
        anonymous.get_data(&node).await,
        "anonymous read of a lock node",
    );
    assert_no_auth(anonymous.list_children(&parent).await, "anonymous listing");
    // The one thing anyone may do: read `/`.
    let top = anonymous.list_children("/").await.expect("anyone reads /");
    assert!(top.contains(&"fencing".to_string()), "{top:?}");

    // The lock library without credentials gets the same refusal.
    let open = ZooKeeperLock::connect(&cs, SESSION).await.unwrap();
    assert_refused_no_auth(
        open.acquire(name, SESSION, Duration::ZERO).await,
        "an anonymous acquire",
    );
    assert_refused_no_auth(
        open.acquire("acl-anonymous-new", SESSION, Duration::ZERO)
            .await,
        "an anonymous acquire of a new lock",
    );
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_lock_client_writes_no_other_clients_node_nor_the_roots() {
    let name = "acl-other-client";
    let (cs, lease, node, parent) = held_by_worker_a(name).await;
    let b = raw_client(&cs, &["worker-b", "lock-clients"]).await;

    assert_no_auth(
        b.set_data(&node, b"x\nworker-b", None).await,
        "setData on another client's node",
    );
    for path in [&node, &parent, LOCKS_ROOT, "/fencing", "/"] {
        assert_no_auth(
            b.set_acl(path, &zk::Acls::anyone_all(), None).await,
            &format!("setACL {path}"),
        );
    }
    for path in [&parent, LOCKS_ROOT, "/fencing", "/"] {
        assert_no_auth(
            b.set_data(path, b"", None).await,
            &format!("setData {path}"),
        );
    }
    assert_no_auth(b.delete(&parent, None).await, "delete a lock's parent");
    for path in ["/x", "/fencing/x"] {
        assert_no_auth(
            b.create(path, b"", &PERSISTENT).await,
            &format!("create {path}"),
        );
    }
    // Positive controls: it reads the queue, and creates and deletes nodes
    // in it, as the recipe must.
    let (data, _) = b
        .get_data(&node)
        .await
        .expect("lock clients read lock nodes");
    assert!(data.ends_with(b"\nworker-a"));
    let own = zk::CreateMode::Ephemeral.with_acls(zk::Acls::creator_all());
    b.create(&format!("{parent}/mine"), b"", &own)
        .await
        .expect("lock clients create in a lock's parent");
    b.delete(&format!("{parent}/mine"), None).await.unwrap();
    // Its creator may write it (the recipes never do); the holder lookup
    // then trusts its data no more.
    let holder = gateway().await;
    assert_eq!(
        holder.current_holder(name).await.unwrap(),
        holder_of(&lease)
    );
    let a = raw_client(&cs, &["worker-a"]).await;
    a.set_data(&node, b"x\nworker-b", None)
        .await
        .expect("its creator writes its node");
    assert_eq!(holder.current_holder(name).await.unwrap(), None);
    lease.release().await.unwrap();
}

/// A cell of the matrix ZooKeeper cannot close: delete rights live on the
/// parent, so the right to release one's own node is the right to delete
/// any. That is a release: the holder learns it at its next renewal.
#[tokio::test]
async fn a_lock_client_can_delete_another_clients_node_which_ends_that_lease() {
    let name = "acl-delete-other";
    let (cs, lease, node, _) = held_by_worker_a(name).await;
    let b = raw_client(&cs, &["worker-b", "lock-clients"]).await;
    b.delete(&node, None)
        .await
        .expect("the parent's delete right covers every node in it");
    assert!(matches!(
        lease.renew().await,
        Err(LockError::NotHeld { .. })
    ));
    assert_eq!(gateway().await.current_holder(name).await.unwrap(), None);
}

#[tokio::test]
async fn the_gateway_reads_the_holder_and_writes_nothing() {
    let name = "acl-gateway";
    let (cs, lease, node, parent) = held_by_worker_a(name).await;

    let gateway = gateway().await;
    assert_eq!(
        gateway.current_holder(name).await.unwrap(),
        holder_of(&lease)
    );
    let raw = raw_client(&cs, &["gateway"]).await;
    for path in [format!("{LOCKS_ROOT}/x"), format!("{parent}/lock")] {
        assert_no_auth(
            raw.create(&path, b"x\ngateway", &EPHEMERAL).await,
            &format!("the gateway's create {path}"),
        );
    }
    assert_no_auth(raw.delete(&node, None).await, "the gateway's delete");
    for path in [&node, &parent] {
        assert_no_auth(
            raw.set_data(path, b"x\ngateway", None).await,
            &format!("the gateway's setData {path}"),
        );
    }
    assert!(matches!(
        gateway.acquire(name, SESSION, Duration::ZERO).await,
        Err(LockError::InvalidConfig(_))
    ));

    // With a wrong password it authenticates as a user nobody named:
    // ZooKeeper refuses its reads.
    let wrong = fencelock::zookeeper::Credentials::new("gateway", "guessed").unwrap();
    let impostor = ZooKeeperLock::connect_with(&cs, SESSION, &Access::reader(wrong))
        .await
        .unwrap();
    assert_refused_no_auth(impostor.current_holder(name).await, "a wrong password");
    lease.release().await.unwrap();
}

/// The positive control of the whole matrix: with every client
/// authenticated and every node under its ACL, the locks keep their
/// guarantees.
#[tokio::test]
async fn lock_clients_with_credentials_meet_the_lock_contract() {
    let a = lock_client("worker-a").await;
    let svc: Arc<dyn LockService> = Arc::new(a.clone());
    contract::mutual_exclusion_under_contention(svc, "acl-contract-mutex", 4, 5).await;
    contract::tokens_strictly_increase(&a, "acl-contract-tokens", 3).await;
    contract::holder_lookup_names_the_client_and_token(
        &a,
        &gateway().await,
        "worker-a",
        "acl-contract-lookup",
        false,
    )
    .await;
    contract::dropped_lease_is_released_in_the_background(&a, "acl-contract-dropped").await;
    contract::bad_requests_are_invalid_config(&a).await;

    // Two clients of their own users share the queue.
    let b = lock_client("worker-b").await;
    let first = held(&a, "acl-contract-two", SESSION).await;
    assert_timeout(
        b.acquire("acl-contract-two", SESSION, Duration::from_millis(200))
            .await,
        "worker-b behind worker-a",
    );
    first.release().await.unwrap();
    held(&b, "acl-contract-two", SESSION)
        .await
        .release()
        .await
        .unwrap();

    // The read-write lock and the election (its own prepared root).
    let rw = a.read_write();
    let reader = held(&rw.read(), "acl-contract-rw", SESSION).await;
    assert_timeout(
        rw.write()
            .acquire("acl-contract-rw", SESSION, Duration::from_millis(200))
            .await,
        "a writer behind a reader",
    );
    reader.release().await.unwrap();
    let leader = a
        .election("acl-contract-election")
        .campaign("worker-a")
        .await
        .unwrap();
    let seen = b
        .election("acl-contract-election")
        .leader()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.epoch, leader.epoch());
    leader.abdicate().await.unwrap();
}

/// The operator's step on a fresh server with no superuser (the admin's
/// rights come from the ACLs alone): lock clients with credentials are
/// refused until it ran; it closes `/` and reseals a lock parent that an
/// open client made before; and it can run again.
#[tokio::test]
async fn preparing_the_root_is_needed_idempotent_and_reseals_open_parents() {
    let zk = ZooKeeper::start().await;
    let cs = zk.connect_string();
    let access = Access::lock_client(
        credentials("worker-a"),
        credentials("lock-clients"),
        &roles(),
    )
    .unwrap();
    let a = ZooKeeperLock::connect_with(&cs, SESSION, &access)
        .await
        .unwrap();
    match a.acquire("early", SESSION, Duration::ZERO).await {
        Err(LockError::InvalidConfig(msg)) => assert!(msg.contains("prepare_root"), "{msg}"),
        other => panic!("acquire before the root is prepared: {other:?}"),
    }
    // An open client (as before credentials were used) makes an open parent.
    let open = ZooKeeperLock::connect(&cs, SESSION).await.unwrap();
    let lease = held(&open, "old", SESSION).await;

    for _ in 0..2 {
        prepare_root(&cs, &credentials("admin"), &roles())
            .await
            .expect("prepare as admin");
    }
    let admin = raw_client(&cs, &["admin"]).await;
    let (top, _) = admin.get_acl("/").await.unwrap();
    assert!(
        top.iter()
            .all(|a| a.scheme() != "world" || a.permission() == zk::Permission::READ),
        "{top:?}"
    );
    let (old, _) = admin.get_acl(&parent_of("old")).await.unwrap();
    assert!(old.iter().all(|a| a.scheme() == "digest"), "{old:?}");
    let anonymous = raw_client(&cs, &[]).await;
    assert_no_auth(
        anonymous
            .create(&format!("{}/x", parent_of("old")), b"", &EPHEMERAL)
            .await,
        "anonymous create in a resealed parent",
    );
    assert_no_auth(
        anonymous.create("/x", b"", &PERSISTENT).await,
        "anonymous create at /",
    );
    // The open client cannot even release now: its node goes with its session.
    assert_refused_no_auth(lease.release().await, "an anonymous release");
    drop(open);
    held(&a, "early", SESSION).await.release().await.unwrap();
}

/// Every server of an ensemble knows the superuser and enforces the ACLs
/// the operator set through one of them.
#[tokio::test]
async fn an_ensemble_enforces_the_acls_on_every_server() {
    let ensemble =
        ZooKeeperEnsemble::start_with_super_digest(credentials("admin").id().as_str()).await;
    ensemble
        .wait_all_serving(Duration::from_secs(60))
        .await
        .expect("all three serve");
    prepare_root(
        &ensemble.connect_string_to(0),
        &credentials("admin"),
        &roles(),
    )
    .await
    .expect("prepare through one server");
    let access = Access::lock_client(
        credentials("worker-a"),
        credentials("lock-clients"),
        &roles(),
    )
    .unwrap();
    let a = ZooKeeperLock::connect_with(&ensemble.connect_string_to(1), SESSION, &access)
        .await
        .unwrap()
        .with_client_id("worker-a")
        .unwrap();
    let lease = held(&a, "acl-ensemble", SESSION).await;
    let gateway = ZooKeeperLock::connect_with(
        &ensemble.connect_string_to(2),
        SESSION,
        &Access::reader(credentials("gateway")),
    )
    .await
    .unwrap();
    assert_eq!(
        gateway.current_holder("acl-ensemble").await.unwrap(),
        holder_of(&lease)
    );
    for i in 0..ensemble.len() {
        let anonymous = raw_client(&ensemble.connect_string_to(i), &[]).await;
        assert_no_auth(
            anonymous
                .create(&format!("{LOCKS_ROOT}/x"), b"", &PERSISTENT)
                .await,
            &format!("anonymous create through server {i}"),
        );
    }
    lease.release().await.unwrap();
}
