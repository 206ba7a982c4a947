//! The lease tables of the `lease-postgres` and `lease-mysql` lock
//! backends, installed by their owner through the lock library, which owns
//! their definition; then who may read them.
//!
//! The readers: the issuer lookups' role, and the fenced gateway's own (its
//! issuer check reads the lease row). Nobody else but the lock clients,
//! whose rights are the library's to grant.

use fencelock::lease_table::{LeaseTable, LeaseTableOptions};
use sqlx::PgPool;

use super::Roles;

/// The page database's lease table: created (or brought up to date) by the
/// library, read by the issuer and the fenced gateway, taken and released
/// by the lock clients.
pub(super) async fn install_postgres(
    db: &PgPool,
    url: &str,
    table: &str,
    roles: &Roles,
) -> anyhow::Result<()> {
    // The library checks the name (it writes it into its SQL as it is).
    LeaseTable::postgres_with(
        url,
        LeaseTableOptions::default().table(table).max_connections(1),
    )
    .await?;
    let waiters = format!("{table}_waiters");
    let [gateway, unfenced, issuer, lock_client] = roles.quoted();
    let mut tx = db.begin().await?;
    for statement in [
        format!(
            "revoke all on {table}, {waiters} from {gateway}, {unfenced}, {issuer}, {lock_client}"
        ),
        format!("grant select on {table} to {gateway}, {issuer}"),
        // What the library's statements need today, run as the lock client.
        format!("grant select, insert, update, delete on {table}, {waiters} to {lock_client}"),
    ] {
        sqlx::query(&statement).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// MariaDB's lease table, created (or brought up to date) by the library.
pub(super) async fn install_mysql(url: &str, table: &str, _roles: &Roles) -> anyhow::Result<()> {
    LeaseTable::mysql_with(
        url,
        LeaseTableOptions::default().table(table).max_connections(1),
    )
    .await?;
    Ok(())
}
