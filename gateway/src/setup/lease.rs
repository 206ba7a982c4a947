//! The lease tables of the `lease-postgres` and `lease-mysql` lock
//! backends, installed by their owner through the lock library, which owns
//! their definition and their functions; then who may use them.
//!
//! The lock clients (workers) take, renew and release leases through the
//! functions only: EXECUTE, no privilege on the tables. The readers: the
//! issuer lookups' role, and the fenced gateway's own (its issuer check
//! reads the lease row): SELECT on the lease table. Nobody else.

use fencelock::lease_table::{self, Install};
use sqlx::PgPool;

use super::Roles;

/// The page database's lease table and its functions, with their grants;
/// then what an earlier setup may have granted beyond them (the lock
/// clients' writes on the tables) is revoked, never a reader's SELECT.
pub(super) async fn install_postgres(
    db: &PgPool,
    url: &str,
    table: &str,
    roles: &Roles,
) -> anyhow::Result<()> {
    let install = Install::new()
        .table(table)
        .lock_client(&roles.lock_client)
        .reader(&roles.gateway)
        .reader(&roles.issuer);
    // The library checks the name (it writes it into its SQL as it is).
    lease_table::install_postgres(url, &install).await?;
    let waiters = format!("{table}_waiters");
    let [gateway, unfenced, issuer, lock_client] = roles.quoted();
    let mut tx = db.begin().await?;
    for statement in [
        format!("revoke all on {table}, {waiters} from {unfenced}, {lock_client}"),
        format!("revoke all on {waiters} from {gateway}, {issuer}"),
        format!(
            "revoke insert, update, delete, truncate, references, trigger on {table} \
             from {gateway}, {issuer}"
        ),
    ] {
        sqlx::query(&statement).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// MariaDB's lease table and its stored functions. The lock clients' and
/// the issuer's users are `'<role>'@'%'` there, and must exist.
pub(super) async fn install_mysql(url: &str, table: &str, roles: &Roles) -> anyhow::Result<()> {
    let install = Install::new()
        .table(table)
        .lock_client(&roles.lock_client)
        .reader(&roles.issuer);
    lease_table::install_mysql(url, &install).await?;
    Ok(())
}
