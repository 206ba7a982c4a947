//! The rights of each role on the page tables, granted by their owner.
//!
//! | role | pages | page_history (+ its sequence) | _sqlx_migrations |
//! |---|---|---|---|
//! | gateway (fenced) | select, insert, update | select, insert (usage) | select |
//! | unfenced | select; insert and update of id/body/version/last_outcome/updated_at only | select, insert (usage) | select |
//! | issuer | nothing | nothing | nothing |
//! | lock client | nothing | nothing | nothing |
//!
//! Nobody but the owner deletes, runs DDL, or updates the history; the
//! unfenced gateway's role cannot write `fence_issuer` nor `fence_token`,
//! so the database itself refuses it the fence. Every run revokes what
//! each role has on these tables and grants the above again, in one
//! transaction: the rights are exactly these after it, whatever they were.

use sqlx::PgPool;

use super::Roles;

/// The columns of `pages` the unfenced gateway may write: not the fence.
pub const UNFENCED_COLUMNS: &str = "body, version, last_outcome, updated_at";

/// `name` as an SQL identifier, quoted.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Every role must exist: the administrator creates them (with their
/// passwords); setup only grants.
pub(super) async fn check_roles(db: &PgPool, roles: &Roles) -> anyhow::Result<()> {
    for (what, name) in roles.all() {
        if name.is_empty() || name.len() > 63 {
            anyhow::bail!("the {what} role {name:?} must be 1 to 63 bytes");
        }
    }
    let names: Vec<String> = roles.all().iter().map(|(_, n)| (*n).to_owned()).collect();
    let missing: Vec<String> = sqlx::query_scalar(
        "select r from unnest($1::text[]) r where not exists (select from pg_roles where rolname = r)",
    )
    .bind(&names)
    .fetch_all(db)
    .await?;
    if let Some(first) = missing.first() {
        let what = roles
            .all()
            .iter()
            .find(|(_, n)| n == first)
            .map_or("", |(w, _)| *w);
        anyhow::bail!(
            "role {first:?} (the {what} role) does not exist{}: the database's administrator \
             creates the roles (CREATE ROLE {first} LOGIN PASSWORD '...'; the lock client's \
             NOLOGIN, its workers' roles members of it), then `gateway setup` grants them \
             their rights",
            if missing.len() > 1 {
                format!(" (nor do {:?})", &missing[1..])
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// The statements that give each role exactly its rights (see the module
/// docs), `history_seq` the history ids' sequence.
fn statements(roles: &Roles, history_seq: &str) -> Vec<String> {
    let [gateway, unfenced, issuer, lock_client] = roles.quoted();
    let everyone = format!("{gateway}, {unfenced}, {issuer}, {lock_client}");
    vec![
        // Table-level revokes take the column privileges with them.
        format!("revoke all on pages, page_history, _sqlx_migrations from {everyone}"),
        format!("revoke all on sequence {history_seq} from {everyone}"),
        format!("grant select, insert, update on pages to {gateway}"),
        format!("grant select on pages to {unfenced}"),
        format!("grant insert (id, {UNFENCED_COLUMNS}) on pages to {unfenced}"),
        format!("grant update ({UNFENCED_COLUMNS}) on pages to {unfenced}"),
        format!("grant select, insert on page_history to {gateway}, {unfenced}"),
        format!("grant usage on sequence {history_seq} to {gateway}, {unfenced}"),
        // The serving gateway's schema check (crate::schema::check).
        format!("grant select on _sqlx_migrations to {gateway}, {unfenced}"),
    ]
}

/// Grant (see the module docs), in one transaction.
pub(super) async fn grant(db: &PgPool, roles: &Roles) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    let seq: String = sqlx::query_scalar("select pg_get_serial_sequence('page_history', 'id')")
        .fetch_one(&mut *tx)
        .await?;
    for statement in statements(roles, &seq) {
        sqlx::query(&statement).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    refuse_ddl(db, roles).await
}

/// No role but the owner may create objects in the tables' schema. On
/// PostgreSQL 15 and later nobody else may by default; a database made by an
/// older version lets PUBLIC create in `public`, which its owner revokes.
async fn refuse_ddl(db: &PgPool, roles: &Roles) -> anyhow::Result<()> {
    let creators: Vec<String> = sqlx::query_scalar(
        "select r from unnest($1::text[]) r
         where has_schema_privilege(r, (select nspname from pg_class c
                                        join pg_namespace n on n.oid = c.relnamespace
                                        where c.oid = 'pages'::regclass), 'create')",
    )
    .bind(
        roles
            .all()
            .iter()
            .map(|(_, n)| (*n).to_owned())
            .collect::<Vec<_>>(),
    )
    .fetch_all(db)
    .await?;
    if !creators.is_empty() {
        anyhow::bail!(
            "the roles {creators:?} may create tables in the page tables' schema: revoke it \
             (e.g. REVOKE CREATE ON SCHEMA public FROM PUBLIC, PostgreSQL 15's default), then \
             run `gateway setup` again"
        );
    }
    Ok(())
}

/// One line saying who may do what.
pub(super) fn summary(roles: &Roles) -> String {
    format!(
        "{} reads and writes pages, appends history; {} writes pages' {} only, appends history; \
         {} and {} have no right on the page tables",
        roles.gateway, roles.unfenced, UNFENCED_COLUMNS, roles.issuer, roles.lock_client
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_statement_lets_the_unfenced_role_write_the_fence_or_anybody_delete() {
        let roles = Roles {
            gateway: "gw".into(),
            unfenced: "unf".into(),
            issuer: "iss".into(),
            lock_client: "locks".into(),
        };
        let all = statements(&roles, "page_history_id_seq").join("\n");
        assert!(
            !all.contains("fence_issuer") && !all.contains("fence_token"),
            "{all}"
        );
        assert!(
            !all.contains("delete") && !all.contains("truncate"),
            "{all}"
        );
        assert!(!all.contains("grant all"), "{all}");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
