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
use std::str::FromStr;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use sha1::{Digest, Sha1};
use zookeeper_client as zk;

use super::session::{new_session, retry, zk_error};
use super::{ELECTIONS_ROOT, LOCKS_ROOT};
use crate::LockError;

/// The parent of the two roots.
const FENCING: &str = "/fencing";
/// The session timeout of [`prepare_root`]'s own session.
const PREPARE_SESSION: Duration = Duration::from_secs(10);

/// A digest user and its password: what a session authenticates with.
/// Its `Debug` shows the user only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    user: String,
    password: String,
}

impl Credentials {
    /// `user` (not empty, no `:`) and `password` (not empty).
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Result<Self, LockError> {
        let (user, password) = (user.into(), password.into());
        check_user(&user)?;
        if password.is_empty() {
            return Err(LockError::InvalidConfig(format!(
                "zookeeper user {user:?}: the password is empty"
            )));
        }
        Ok(Self { user, password })
    }

    pub fn user(&self) -> &str {
        &self.user
    }

    /// How ACLs name this user.
    pub fn id(&self) -> DigestId {
        let digest = Sha1::digest(self.auth());
        DigestId(format!("{}:{}", self.user, BASE64.encode(digest)))
    }

    /// The digest scheme's auth packet: `user:password`.
    pub(super) fn auth(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password).into_bytes()
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials({}:***)", self.user)
    }
}

/// `user:password` (the password may hold `:`). Errors never show it.
impl FromStr for Credentials {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self, LockError> {
        match s.split_once(':') {
            Some((user, password)) => Self::new(user, password),
            None => Err(LockError::InvalidConfig(
                "zookeeper credentials: expected user:password".into(),
            )),
        }
    }
}

fn check_user(user: &str) -> Result<(), LockError> {
    if user.is_empty() || user.contains(':') || user.chars().any(char::is_whitespace) {
        return Err(LockError::InvalidConfig(format!(
            "zookeeper user {user:?}: must be non-empty, without ':' or spaces"
        )));
    }
    Ok(())
}

/// How an ACL names a digest user: `user:base64(sha1(user:password))`.
/// Not a secret: lock clients name the gateway's and the admin's this way
/// without knowing their passwords.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DigestId(String);

impl DigestId {
    pub fn user(&self) -> &str {
        self.0.split_once(':').map_or(&*self.0, |(user, _)| user)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn acl(&self, rights: zk::Permission) -> zk::Acl {
        zk::Acl::new(rights, zk::AuthId::new("digest", &self.0))
    }
}

impl fmt::Display for DigestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for DigestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DigestId({})", self.0)
    }
}

/// `user:<base64 of a 20-byte SHA-1>`, as [`Credentials::id`] writes it.
impl FromStr for DigestId {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self, LockError> {
        let bad = || {
            LockError::InvalidConfig(format!(
                "zookeeper digest id {s:?}: expected user:base64(sha1(user:password))"
            ))
        };
        let (user, hash) = s.trim().split_once(':').ok_or_else(bad)?;
        check_user(user)?;
        match BASE64.decode(hash) {
            Ok(digest) if digest.len() == 20 => Ok(Self(format!("{user}:{hash}"))),
            _ => Err(bad()),
        }
    }
}

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
/// and the ACLs of the nodes it creates. See the [module](self) for the
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
/// [module](self) says; and the ACL of every lock's parent already in the
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

/// `zookeeper://[user:password@]host:port[,host:port...][/]` (or `zk://`):
/// the connect string and the credentials, percent-decoded. Errors never
/// show the password.
pub fn parse_url(url: &str) -> Result<(String, Option<Credentials>), LockError> {
    let rest = url
        .split_once("://")
        .filter(|(scheme, _)| matches!(&*scheme.to_ascii_lowercase(), "zookeeper" | "zk"))
        .map(|(_, rest)| rest)
        .ok_or_else(|| {
            LockError::InvalidConfig("a zookeeper URL starts with zookeeper:// or zk://".into())
        })?;
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, rest),
    };
    let hosts = hosts.trim_end_matches('/').to_string();
    if hosts.split(',').all(|h| h.trim().is_empty()) {
        return Err(LockError::InvalidConfig(
            "zookeeper://host:port[,host:port...] names no server".into(),
        ));
    }
    let credentials = match userinfo {
        None => None,
        Some(userinfo) => {
            let (user, password) = userinfo.split_once(':').ok_or_else(|| {
                LockError::InvalidConfig(
                    "zookeeper URL: the user needs a password (user:password@)".into(),
                )
            })?;
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8()
                    .map(|d| d.into_owned())
                    .map_err(|_| {
                        LockError::InvalidConfig(
                            "zookeeper URL: the credentials are not UTF-8 once decoded".into(),
                        )
                    })
            };
            Some(Credentials::new(decode(user)?, decode(password)?)?)
        }
    };
    Ok((hosts, credentials))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(s: &str) -> Credentials {
        s.parse().unwrap()
    }

    #[test]
    fn digest_ids_are_what_zookeeper_computes() {
        // `printf 'admin:secret' | openssl sha1 -binary | base64`
        let id = creds("admin:secret").id();
        assert_eq!(id.as_str(), "admin:fvr2cB/fjGeAiX8g1aGhUm3ZICk=");
        assert_eq!(id.user(), "admin");
        assert_eq!(id.as_str().parse::<DigestId>().unwrap(), id);
        // The password may hold a colon; the user may not.
        assert_eq!(creds("u:a:b").user(), "u");
        for bad in ["", "user", ":pw", "user:", "a b:pw"] {
            assert!(bad.parse::<Credentials>().is_err(), "{bad:?}");
        }
        for bad in [
            "admin",
            "admin:secret",
            "admin:AAAA",
            ":fvr2cB/fjGeAiX8g1aGhUm3ZICk=",
        ] {
            assert!(bad.parse::<DigestId>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn passwords_never_show() {
        let c = creds("worker-1:hunter2");
        assert!(!format!("{c:?}").contains("hunter2"));
        let e = "worker-1:".parse::<Credentials>().unwrap_err();
        assert!(!e.to_string().contains("hunter2"));
        let roles = Roles::new(creds("admin:a").id(), creds("lock-clients:l").id());
        let access = Access::lock_client(c, creds("lock-clients:l"), &roles).unwrap();
        assert!(!format!("{access:?}").contains("hunter2"), "{access:?}");
        for bad in [
            "zookeeper://gw:hunter2@/",
            "zookeeper://g w:hunter2@h:2181/",
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
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

    #[test]
    fn urls_give_the_hosts_and_the_decoded_credentials() {
        let (hosts, c) = parse_url("zookeeper://gw:p%40ss%3Aword@h1:2181,h2:2181/").unwrap();
        assert_eq!(hosts, "h1:2181,h2:2181");
        let c = c.unwrap();
        assert_eq!(c.user(), "gw");
        assert_eq!(c, Credentials::new("gw", "p@ss:word").unwrap());
        assert_eq!(parse_url("zk://h1:2181").unwrap(), ("h1:2181".into(), None));
        for bad in ["zookeeper:///", "zookeeper://gw@h1:2181", "redis://h1:6379"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}
