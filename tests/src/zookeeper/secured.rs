//! A standalone ZooKeeper as the stack runs it: `admin` is its superuser
//! (superDigest), the lock roots are prepared with fencelock's ACLs, and
//! every user of the tests has a known password.

use fencelock::zookeeper::{prepare_root, Access, Credentials, Roles};

use super::ZooKeeper;

/// The credentials of test user `user`: `<user>:<user>-secret`.
pub fn credentials(user: &str) -> Credentials {
    Credentials::new(user, format!("{user}-secret")).expect("test credentials")
}

/// The identities the ACLs name: `admin`, the shared `lock-clients`, and
/// `gateway` reading.
pub fn roles() -> Roles {
    Roles::new(credentials("admin").id(), credentials("lock-clients").id())
        .reader(credentials("gateway").id())
}

/// A ZooKeeper server whose roots an operator prepared (see the module).
pub struct SecuredZooKeeper {
    server: ZooKeeper,
}

impl SecuredZooKeeper {
    /// Start the server with `admin` as its superuser, and prepare the lock
    /// roots as `admin` with [`roles`].
    pub async fn start() -> Self {
        let server =
            ZooKeeper::start_with_super_digest(credentials("admin").id().to_string()).await;
        prepare_root(&server.connect_string(), &credentials("admin"), &roles())
            .await
            .expect("prepare the lock roots as admin");
        Self { server }
    }

    pub fn connect_string(&self) -> String {
        self.server.connect_string()
    }

    pub fn server(&mut self) -> &mut ZooKeeper {
        &mut self.server
    }

    /// How lock client `user` authenticates: as itself and as `lock-clients`.
    pub fn lock_client_access(&self, user: &str) -> Access {
        Access::lock_client(credentials(user), credentials("lock-clients"), &roles())
            .expect("lock client access")
    }

    /// How `user` (the gateway) reads.
    pub fn reader_access(&self, user: &str) -> Access {
        Access::reader(credentials(user))
    }
}
