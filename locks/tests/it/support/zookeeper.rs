//! The ZooKeeper server the ZooKeeper tests share (each uses its own lock
//! names), and plain looks at what the recipes wrote there.

use std::time::Duration;

use fencelock::zookeeper::{escape_name, ZooKeeperLock, ZooKeeperReadWriteLock, LOCKS_ROOT};
use harness::zookeeper::SecuredZooKeeper;
use harness::ZooKeeper;
use tokio::sync::OnceCell;
use zookeeper_client as zk;

/// The session timeout of the tests' clients.
pub const SESSION: Duration = Duration::from_secs(2);

/// One standalone server for the whole binary; it dies with the binary.
pub async fn zk_server() -> &'static ZooKeeper {
    static ZK: OnceCell<ZooKeeper> = OnceCell::const_new();
    ZK.get_or_init(ZooKeeper::start).await
}

/// The connect string of [`zk_server`].
pub async fn connect_string() -> String {
    zk_server().await.connect_string()
}

/// A lock service on `connect_string`, sessions of [`SESSION`].
pub async fn connect(connect_string: &str) -> ZooKeeperLock {
    ZooKeeperLock::connect(connect_string, SESSION)
        .await
        .expect("connect to zookeeper")
}

/// The connect string of [`zk_server`], and a lock service on it.
pub async fn connected() -> (String, ZooKeeperLock) {
    let cs = connect_string().await;
    let lock = connect(&cs).await;
    (cs, lock)
}

/// A read-write lock service on `connect_string`, sessions of [`SESSION`].
pub async fn connect_rw(connect_string: &str) -> ZooKeeperReadWriteLock {
    ZooKeeperReadWriteLock::connect(connect_string, SESSION)
        .await
        .expect("connect to zookeeper")
}

/// The nodes under a lock's parent, read with a plain client (as `admin`,
/// who may read them on the secured server too).
pub async fn lock_nodes(connect_string: &str, name: &str) -> Vec<String> {
    let client = raw_client(connect_string, &["admin"]).await;
    match client.list_children(&format!("{LOCKS_ROOT}/{name}")).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => vec![],
        Err(e) => panic!("list children: {e}"),
    }
}

/// The shared secured server ([`SecuredZooKeeper`]): `admin` its
/// superuser, the lock roots prepared. One for the whole binary (each test
/// uses its own lock names).
pub async fn secured() -> &'static SecuredZooKeeper {
    static SECURED: OnceCell<SecuredZooKeeper> = OnceCell::const_new();
    SECURED.get_or_init(SecuredZooKeeper::start).await
}

/// A lock service of lock client `user` on the [`secured`] server,
/// recording `user` as its id.
pub async fn lock_client(user: &str) -> ZooKeeperLock {
    let s = secured().await;
    ZooKeeperLock::connect_with(&s.connect_string(), SESSION, &s.lock_client_access(user))
        .await
        .expect("connect as a lock client")
        .with_client_id(user)
        .unwrap()
}

/// The gateway's session on the [`secured`] server: it reads, as `gateway`.
pub async fn gateway() -> ZooKeeperLock {
    let s = secured().await;
    ZooKeeperLock::connect_with(&s.connect_string(), SESSION, &s.reader_access("gateway"))
        .await
        .expect("connect as the gateway")
}

/// A plain client on `connect_string`, authenticated as each of `users`
/// (none: anonymous).
pub async fn raw_client(connect_string: &str, users: &[&str]) -> zk::Client {
    let mut connector = zk::Client::connector();
    for user in users {
        connector = connector.with_auth("digest", format!("{user}:{user}-secret").as_bytes());
    }
    connector.connect(connect_string).await.expect("connect")
}

/// The path of the one node under lock `name`.
pub async fn only_node(connect_string: &str, name: &str) -> String {
    let nodes = lock_nodes(connect_string, &escape_name(name).unwrap()).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    format!("{}/{}", parent_of(name), nodes[0])
}

/// Where the nodes of lock `name` go.
pub fn parent_of(name: &str) -> String {
    format!("{LOCKS_ROOT}/{}", escape_name(name).unwrap())
}

/// Wait until an acquire on `lock` is parked on a watch (queued).
pub async fn one_parked(lock: &ZooKeeperLock) {
    harness::wait_until(Duration::from_secs(10), || async {
        (lock.parked() == 1).then_some(()).ok_or(())
    })
    .await
    .expect("an acquire parks behind the holder");
}
