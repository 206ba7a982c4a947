//! The ZooKeeper lock roots' ACLs, prepared with the ZooKeeper admin's
//! credentials: only authenticated lock clients may create under them, the
//! readers (the gateways' issuer user) may read, nobody else may write.
//! Idempotent; the library owns the ACLs ([`fencelock::zookeeper::prepare_root`]).

use anyhow::Context;
use fencelock::zookeeper::{parse_url, prepare_root, DigestId, Roles};

/// Prepare the roots at `url` (`zookeeper://admin:PW@h1:2181,h2:2181/`).
pub(super) async fn prepare(
    url: &str,
    lock_clients: &DigestId,
    readers: &[DigestId],
) -> anyhow::Result<String> {
    let (hosts, admin) = parse_url(url)?;
    let admin = admin.context("the ZooKeeper URL needs the admin's user:password@")?;
    let roles = Roles::new(admin.id(), lock_clients.clone()).readers(readers.iter().cloned());
    prepare_root(&hosts, &admin, &roles).await?;
    Ok(format!(
        "zookeeper: lock roots writable by {} only, readable by {}",
        lock_clients.user(),
        readers
            .iter()
            .map(DigestId::user)
            .collect::<Vec<_>>()
            .join(", ")
    ))
}
