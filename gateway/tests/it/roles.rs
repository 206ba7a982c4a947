//! A page database as an operator sets it up: roles made by the
//! administrator (the test server's superuser), the database owned by the
//! owner's role, `gateway setup` run as the owner. Role names carry the
//! database's name: roles belong to the whole server, which the tests share.
//! The test server trusts 127.0.0.1, so logins need no password; the
//! privileges are enforced all the same.

use gateway::setup::{Roles, SetupOptions};
use sqlx::{Connection, Executor, PgConnection};

/// The logins of one page database.
pub struct RoleDb {
    /// The server's superuser, on this database.
    pub admin: String,
    pub owner: String,
    /// The fenced gateway's login.
    pub gateway: String,
    /// The unfenced gateway's login.
    pub unfenced: String,
    /// The issuer lookups' login.
    pub issuer: String,
    /// A worker: a login member of the lock clients' group.
    pub worker: String,
    pub roles: Roles,
}

/// `url` (`scheme://user@host/db`) logging in as `role` instead.
pub fn as_role(url: &str, role: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    format!("{scheme}://{role}@{host}")
}

/// A fresh database with its roles, set up by `gateway setup` as its owner.
pub async fn database_with_roles() -> RoleDb {
    let admin = harness::fresh_database().await;
    let db = admin.rsplit('/').next().unwrap().split('?').next().unwrap();
    let suffix = db.trim_start_matches("t_");
    let name = |role: &str| format!("fence_{role}_{suffix}");
    let roles = Roles {
        gateway: name("gateway"),
        unfenced: name("unfenced"),
        issuer: name("issuer"),
        lock_client: name("lock_client"),
    };
    let (owner, worker) = (name("owner"), name("worker"));
    let mut conn = PgConnection::connect(&admin).await.unwrap();
    for statement in [
        format!("create role {owner} login"),
        format!("create role {} login", roles.gateway),
        format!("create role {} login", roles.unfenced),
        format!("create role {} login", roles.issuer),
        format!("create role {} nologin", roles.lock_client),
        format!("create role {worker} login in role {}", roles.lock_client),
        format!("alter database {db} owner to {owner}"),
    ] {
        conn.execute(statement.as_str())
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    conn.close().await.unwrap();
    let options = SetupOptions {
        roles: roles.clone(),
        ..SetupOptions::default()
    };
    let owner_url = as_role(&admin, &owner);
    gateway::setup::run(&owner_url, &options)
        .await
        .expect("gateway setup as the owner");
    RoleDb {
        owner: owner_url,
        gateway: as_role(&admin, &roles.gateway),
        unfenced: as_role(&admin, &roles.unfenced),
        issuer: as_role(&admin, &roles.issuer),
        worker: as_role(&admin, &worker),
        admin,
        roles,
    }
}
