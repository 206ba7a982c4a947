//! Who may do what on the lock nodes: digest credentials, the ACL of every
//! node the recipes create, and the operator's preparation of the roots.
//!
//! # The identities
//! ZooKeeper knows users (the `digest` scheme: a session authenticates with
//! `user:password`, and ACLs name it `user:base64(sha1(user:password))`, a
//! [`DigestId`]) and per-node ACLs, but no groups and no inheritance: a
//! node gets its ACL when it is created. A session may authenticate as
//! several users and holds the union of their rights. So:
//! - the **admin** (the operator) has every right on every node; it may
//!   also be the server's superDigest, which passes every ACL;
//! - every **lock client** authenticates twice: as itself (`worker-1`), and
//!   as the shared `lock-clients` user, which stands in for the group;
//! - **readers** (the gateway) read.
//!
//! # The ACLs
//! | node | admin | `lock-clients` | its creator | readers | anyone |
//! |---|---|---|---|---|---|
//! | `/` | all | | | | read |
//! | `/fencing` | all | read | | read | |
//! | the roots `/fencing/locks`, `/fencing/elections` | all | create, read | | read | |
//! | a lock's parent `<root>/<name>` (a container) | all | create, delete, read | | read | |
//! | a lock node (queued, or the non-fair one) | all | read | read, write | read | |
//!
//! [`prepare_root`] sets the first three rows (and the parents already
//! there); a lock client with an [`Access`] creates parents and lock nodes
//! with the last two. Without credentials ([`Access::open`]) every node is
//! open to anyone, as ZooKeeper's own default.
//!
//! # What ZooKeeper cannot refuse
//! Delete rights live on the parent: a lock client may delete its own lock
//! node, so it may delete any other client's too (that is a release: the
//! fence survives it, the lease's renewal notices). The create right says
//! nothing about the new node's name, its type (persistent, ephemeral) or
//! its ACL: a lock client can plant a persistent node named like a queue
//! node (which is why the recipes and the holder lookup count only
//! ephemeral nodes, in the order the server created them), or create a
//! lock's parent with an ACL that locks others out (an operator repairs it
//! with [`prepare_root`]).

use std::fmt;
use std::time::Duration;

use zookeeper_client as zk;

use super::credentials::{Credentials, DigestId};
use super::session::{new_session, retry, zk_error};
use super::{ELECTIONS_ROOT, LOCKS_ROOT};
use crate::LockError;

/// The parent of the two roots.
const FENCING: &str = "/fencing";
/// The session timeout of [`prepare_root`]'s own session.
const PREPARE_SESSION: Duration = Duration::from_secs(10);

/// The identities the ACLs name: the admin, the shared lock-clients user
/// and the readers. One set for the operator's [`prepare_root`] and every
/// lock client's [`Access`], so that the nodes they create agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roles {
    admin: DigestId,
    lock_clients: DigestId,
    readers: Vec<DigestId>,
}

impl Roles {
    pub fn new(admin: DigestId, lock_clients: DigestId) -> Self {
        Self {
            admin,
            lock_clients,
            readers: Vec::new(),
        }
    }

    /// Also let `reader` (the gateway) read every lock node.
    pub fn reader(mut self, reader: DigestId) -> Self {
        self.readers.push(reader);
        self
    }

    /// Also let each of `readers` read every lock node.
    pub fn readers(mut self, readers: impl IntoIterator<Item = DigestId>) -> Self {
        self.readers.extend(readers);
        self
    }

    /// Admin: all; lock-clients: `lock_clients`; readers: read; and `more`.
    fn acl(&self, lock_clients: zk::Permission, more: Option<zk::Acl>) -> Vec<zk::Acl> {
        let mut acl = vec![
            self.admin.acl(zk::Permission::ALL),
            self.lock_clients.acl(lock_clients),
        ];
        acl.extend(self.readers.iter().map(|r| r.acl(zk::Permission::READ)));
        acl.extend(more);
        acl
    }

    /// `/`: anyone may read, nobody but the admin write.
    fn top_acl(&self) -> Vec<zk::Acl> {
        vec![
            self.admin.acl(zk::Permission::ALL),
            zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone()),
        ]
    }

    fn fencing_acl(&self) -> Vec<zk::Acl> {
        self.acl(zk::Permission::READ, None)
    }

    /// The roots: lock clients create the locks' parents in them.
    fn root_acl(&self) -> Vec<zk::Acl> {
        self.acl(zk::Permission::CREATE | zk::Permission::READ, None)
    }

    /// A lock's parent: lock clients create, delete and list its nodes.
    fn parent_acl(&self) -> Vec<zk::Acl> {
        let queue = zk::Permission::CREATE | zk::Permission::DELETE | zk::Permission::READ;
        self.acl(queue, None)
    }

    /// A lock node: only its creator (`own`) may set its data.
    fn node_acl(&self, own: &DigestId) -> Vec<zk::Acl> {
        let creator = own.acl(zk::Permission::READ | zk::Permission::WRITE);
        self.acl(zk::Permission::READ, Some(creator))
    }
}

/// How a [`ZooKeeperLock`](super::ZooKeeperLock)'s session authenticates,
/// and the ACLs of the nodes it creates. See the [module](crate::zookeeper) for the
/// ACL of each node.
#[derive(Clone, Default)]
pub struct Access {
    auth: Vec<Credentials>,
    creates: Creates,
}

/// The ACLs of the nodes a session creates.
#[derive(Clone, Default)]
enum Creates {
    /// Every node open to anyone.
    #[default]
    Open,
    /// Takes no lock.
    Reader,
    Client {
        parent: Vec<zk::Acl>,
        node: Vec<zk::Acl>,
    },
}

impl Access {
    /// No credentials, every node open to anyone: ZooKeeper's default, and
    /// what [`ZooKeeperLock::connect`](super::ZooKeeperLock::connect) uses.
    pub fn open() -> Self {
        Self::default()
    }

    /// A lock client: authenticates as `own` and as the shared
    /// `lock_clients` user, and creates its nodes with `roles`' ACLs (only
    /// `own` may set its nodes' data). The lock roots must have been
    /// prepared ([`prepare_root`]). `own` must be a user of its own, and
    /// `lock_clients` the user `roles` names.
    pub fn lock_client(
        own: Credentials,
        lock_clients: Credentials,
        roles: &Roles,
    ) -> Result<Self, LockError> {
        if lock_clients.id() != roles.lock_clients {
            return Err(LockError::InvalidConfig(format!(
                "zookeeper lock-clients credentials of user {:?} do not match the id the ACLs name ({:?})",
                lock_clients.user(),
                roles.lock_clients.user()
            )));
        }
        if own.user() == lock_clients.user() {
            return Err(LockError::InvalidConfig(format!(
                "zookeeper user {:?} is both this client's own and the shared lock-clients user: \
                 every lock client could then set every lock node's data",
                own.user()
            )));
        }
        let node = roles.node_acl(&own.id());
        Ok(Self {
            auth: vec![own, lock_clients],
            creates: Creates::Client {
                parent: roles.parent_acl(),
                node,
            },
        })
    }

    /// A session that only reads (the gateway's holder lookup), as `me`.
    /// Its acquires are refused.
    pub fn reader(me: Credentials) -> Self {
        Self {
            auth: vec![me],
            creates: Creates::Reader,
        }
    }

    /// The users this session authenticates as.
    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.auth.iter().map(Credentials::user)
    }

    pub(super) fn credentials(&self) -> &[Credentials] {
        &self.auth
    }

    /// Whether missing roots are created here, open to anyone (no
    /// credentials), rather than prepared by an operator.
    pub(super) fn creates_roots(&self) -> bool {
        matches!(self.creates, Creates::Open)
    }

    pub(super) fn parent_acls(&self) -> zk::Acls<'_> {
        match &self.creates {
            Creates::Client { parent, .. } => zk::Acls::new(parent),
            Creates::Open | Creates::Reader => zk::Acls::anyone_all(),
        }
    }

    pub(super) fn node_acls(&self) -> zk::Acls<'_> {
        match &self.creates {
            Creates::Client { node, .. } => zk::Acls::new(node),
            Creates::Open | Creates::Reader => zk::Acls::anyone_all(),
        }
    }

    /// Refuse an acquire on a reader's session.
    pub(super) fn check_may_lock(&self) -> Result<(), LockError> {
        match self.creates {
            Creates::Reader => Err(LockError::InvalidConfig(
                "this zookeeper session only reads (Access::reader): it takes no locks".into(),
            )),
            Creates::Open | Creates::Client { .. } => Ok(()),
        }
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.creates {
            Creates::Open => "open",
            Creates::Reader => "reader",
            Creates::Client { .. } => "lock client",
        };
        f.debug_struct("Access")
            .field("kind", &kind)
            .field("users", &self.users().collect::<Vec<_>>())
            .finish()
    }
}

/// Prepare ZooKeeper for lock clients with credentials, as `admin`
/// (idempotent: run it at every deployment): `/` read-only for anyone;
/// `/fencing` and the two roots created, or their ACLs set, as the
/// [module](crate::zookeeper) says; and the ACL of every lock's parent already in the
/// roots reset (a parent created before, open or by a client that chose
/// its own ACL).
///
/// `admin` needs the admin right on every one of those nodes: that of
/// `roles`' admin (the ACLs this sets name it), or the server's
/// superDigest (`zookeeper.DigestAuthenticationProvider.superDigest`),
/// which passes every ACL.
pub async fn prepare_root(
    connect: &str,
    admin: &Credentials,
    roles: &Roles,
) -> Result<(), LockError> {
    let client = new_session(connect, PREPARE_SESSION, std::slice::from_ref(admin)).await?;
    set_acl(&client, "/", &roles.top_acl()).await?;
    for (path, acl) in [
        (FENCING, roles.fencing_acl()),
        (LOCKS_ROOT, roles.root_acl()),
        (ELECTIONS_ROOT, roles.root_acl()),
    ] {
        let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acl));
        match retry(|| client.create(path, &[], &persistent)).await {
            Ok(_) => {}
            Err(zk::Error::NodeExists) => {
                set_acl(&client, path, &acl).await?;
            }
            Err(e) => return Err(refused(path, e)),
        }
    }
    let parent = roles.parent_acl();
    for root in [LOCKS_ROOT, ELECTIONS_ROOT] {
        let names = retry(|| client.list_children(root))
            .await
            .map_err(|e| refused(root, e))?;
        for name in names {
            // Gone meanwhile (an emptied container): nothing to repair.
            set_acl(&client, &format!("{root}/{name}"), &parent).await?;
        }
    }
    Ok(())
}

/// Set `path`'s ACL, whatever it was; `false` when there is no such node.
async fn set_acl(client: &zk::Client, path: &str, acl: &[zk::Acl]) -> Result<bool, LockError> {
    match retry(|| client.set_acl(path, acl, None)).await {
        Ok(_) => Ok(true),
        Err(zk::Error::NoNode) => Ok(false),
        Err(e) => Err(refused(path, e)),
    }
}

fn refused(path: &str, e: zk::Error) -> LockError {
    match zk_error(e) {
        LockError::InvalidConfig(detail) => {
            LockError::InvalidConfig(format!("preparing {path}: {detail}"))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::super::credentials::tests::creds;
    use super::*;

    #[test]
    fn passwords_never_show() {
        let roles = Roles::new(creds("admin:a").id(), creds("lock-clients:l").id());
        let access =
            Access::lock_client(creds("worker-1:hunter2"), creds("lock-clients:l"), &roles)
                .unwrap();
        assert!(!format!("{access:?}").contains("hunter2"), "{access:?}");
    }

    #[test]
    fn a_lock_client_needs_a_user_of_its_own_and_the_lock_clients_user() {
        let roles = Roles::new(creds("admin:a").id(), creds("lock-clients:l").id());
        let wrong = Access::lock_client(creds("w:1"), creds("lock-clients:other"), &roles);
        assert!(
            matches!(wrong, Err(LockError::InvalidConfig(_))),
            "{wrong:?}"
        );
        let shared = Access::lock_client(creds("lock-clients:l"), creds("lock-clients:l"), &roles);
        assert!(
            matches!(shared, Err(LockError::InvalidConfig(_))),
            "{shared:?}"
        );
        let access = Access::lock_client(creds("w:1"), creds("lock-clients:l"), &roles).unwrap();
        assert_eq!(access.users().collect::<Vec<_>>(), ["w", "lock-clients"]);
        assert!(!access.creates_roots());
        assert!(Access::reader(creds("gateway:g")).check_may_lock().is_err());
    }

    #[test]
    fn node_acls_let_only_the_creator_write() {
        let own = creds("w:1").id();
        let roles = Roles::new(creds("admin:a").id(), creds("lock-clients:l").id())
            .reader(creds("gateway:g").id());
        let rights = |acl: &[zk::Acl], user: &str| {
            acl.iter()
                .filter(|a| a.id().split(':').next() == Some(user))
                .fold(zk::Permission::NONE, |p, a| p | a.permission())
        };
        let node = roles.node_acl(&own);
        assert_eq!(
            rights(&node, "w"),
            zk::Permission::READ | zk::Permission::WRITE
        );
        assert_eq!(rights(&node, "lock-clients"), zk::Permission::READ);
        assert_eq!(rights(&node, "gateway"), zk::Permission::READ);
        assert_eq!(rights(&node, "admin"), zk::Permission::ALL);
        let parent = roles.parent_acl();
        assert_eq!(
            rights(&parent, "lock-clients"),
            zk::Permission::CREATE | zk::Permission::DELETE | zk::Permission::READ
        );
        assert_eq!(rights(&parent, "gateway"), zk::Permission::READ);
        assert!(roles
            .top_acl()
            .iter()
            .all(|a| a.scheme() != "world" || a.permission() == zk::Permission::READ));
    }
}
