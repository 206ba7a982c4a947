//! The ZooKeeper server the ZooKeeper tests share (each uses its own lock
//! names), and plain looks at what the recipes wrote there.

use std::time::Duration;

use fencelock::zookeeper::{
    escape_name, prepare_root, Access, Credentials, Roles, ZooKeeperLock, ZooKeeperReadWriteLock,
    LOCKS_ROOT,
};
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

/// Each test user's credentials: `<user>:<user>-secret`.
pub fn creds(user: &str) -> Credentials {
    Credentials::new(user, format!("{user}-secret")).expect("test credentials")
}

/// The identities the secured server's ACLs name: `admin`, `lock-clients`,
/// and `gateway` reading.
pub fn roles() -> Roles {
    Roles::new(creds("admin").id(), creds("lock-clients").id()).reader(creds("gateway").id())
}

/// A ZooKeeper server as the stack runs it: `admin` is its superuser, and
/// its roots were prepared with [`roles`]. One for the whole binary (each
/// test uses its own lock names).
pub struct Secured {
    pub zk: ZooKeeper,
}

/// The [`Secured`] server.
pub async fn secured() -> &'static Secured {
    static SECURED: OnceCell<Secured> = OnceCell::const_new();
    SECURED
        .get_or_init(|| async {
            let zk = ZooKeeper::start_with_super_digest(creds("admin").id().to_string()).await;
            prepare_root(&zk.connect_string(), &creds("admin"), &roles())
                .await
                .expect("prepare the lock roots as admin");
            Secured { zk }
        })
        .await
}

impl Secured {
    pub fn connect_string(&self) -> String {
        self.zk.connect_string()
    }

    /// How lock client `user` authenticates: as itself and as `lock-clients`.
    pub fn access(&self, user: &str) -> Access {
        Access::lock_client(creds(user), creds("lock-clients"), &roles()).expect("access")
    }

    /// A lock service for lock client `user`, recording `user` as its id.
    pub async fn lock_client(&self, user: &str) -> ZooKeeperLock {
        ZooKeeperLock::connect_with(&self.connect_string(), SESSION, &self.access(user))
            .await
            .expect("connect as a lock client")
            .with_client_id(user)
            .unwrap()
    }

    /// The gateway's session: it reads, as `gateway`.
    pub async fn gateway(&self) -> ZooKeeperLock {
        ZooKeeperLock::connect_with(
            &self.connect_string(),
            SESSION,
            &Access::reader(creds("gateway")),
        )
        .await
        .expect("connect as the gateway")
    }
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
