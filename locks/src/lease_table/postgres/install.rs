//! Installing a lease table on PostgreSQL: its tables and functions, and
//! the grants of its lock clients and readers.

use sqlx::postgres::PgConnection;
use sqlx::Connection;

use super::statements::{quote_ident, Statements};
use crate::lease_table::install::{Install, Installed, Installer};
use crate::lease_table::ISSUER_POSTGRES;
use crate::LockError;

/// Serialise the installers of one table.
const SERIALISE_CREATION: &str = include_str!("sql/serialise_creation.sql");
/// The columns of the table and its queue.
const COLUMNS: &str = include_str!("sql/columns.sql");
/// The source of a function (bind: its signature, e.g. `t_version()`) and
/// whether this login may execute it; no row when it does not exist.
/// Catalog reads only, which any login may make.
const INSTALLED: &str = include_str!("sql/installed.sql");

impl Installer for PgConnection {
    const ISSUER: &'static str = ISSUER_POSTGRES;
    const INSTALL: &'static str = "install_postgres";

    /// Catalog reads only: no privilege needed, nothing fails in a
    /// transaction. The light fair grant is always there.
    async fn installed(&mut self, table: &str) -> Result<(Installed, bool), sqlx::Error> {
        let found: Option<(String, bool)> = sqlx::query_as(INSTALLED)
            .bind(format!("{table}_version()"))
            .fetch_optional(self)
            .await?;
        let installed = match found {
            None => Installed::Missing,
            Some((source, _)) if !source.contains(&Statements::version(table)) => Installed::Other,
            Some((_, false)) => Installed::NotExecutable,
            Some((_, true)) => Installed::Current,
        };
        Ok((installed, true))
    }

    async fn missing_columns(&mut self, table: &str) -> Result<Vec<String>, sqlx::Error> {
        missing_columns(self, table).await
    }

    async fn install(&mut self, install: &Install) -> Result<bool, sqlx::Error> {
        install_on(self, install).await.map(|()| true)
    }

    /// SQLSTATE 42501.
    fn permission_denied(e: &sqlx::Error) -> bool {
        matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("42501"))
    }

    fn install_error(table: &str, e: sqlx::Error) -> LockError {
        match &e {
            sqlx::Error::Database(d) if d.code().as_deref() == Some("42704") => {
                LockError::InvalidConfig(format!("install lease table {table}: {d}"))
            }
            _ if Self::permission_denied(&e) => LockError::InvalidConfig(format!(
                "install lease table {table}: {e} (run it as the login that owns, or may \
                 create, the tables and their functions)"
            )),
            _ => {
                LockError::unavailable(ISSUER_POSTGRES, format!("install lease table {table}: {e}"))
            }
        }
    }
}

/// What `install` says, in one transaction: the tables and functions (when
/// they are not current), then the grants. Concurrent installers of one
/// table wait for each other on an advisory lock: concurrent `create ...
/// if not exists` can still collide in PostgreSQL's catalog (a unique
/// violation on pg_type).
async fn install_on(conn: &mut PgConnection, install: &Install) -> Result<(), sqlx::Error> {
    let table = install.table_name();
    let mut tx = conn.begin().await?;
    sqlx::query(SERIALISE_CREATION)
        .bind(format!("fencelock create {table}"))
        .execute(&mut *tx)
        .await?;
    let schema: String = sqlx::query_scalar("select current_schema()::text")
        .fetch_one(&mut *tx)
        .await?;
    if tx.installed(table).await?.0 != Installed::Current {
        let ddl = Statements::ddl_statements(table, &schema);
        let (tables, functions) = ddl.split_at(2);
        for ddl in tables {
            sqlx::query(ddl).execute(&mut *tx).await?;
        }
        // Tables made by an earlier version lack columns. Looked up first:
        // `alter table` takes the table's exclusive lock even when the
        // column exists.
        for alter in missing_columns(&mut tx, table).await? {
            sqlx::query(&alter).execute(&mut *tx).await?;
        }
        for ddl in functions {
            sqlx::query(ddl).execute(&mut *tx).await?;
        }
    }
    let all = Statements::signatures(table).join(", ");
    for role in install.lock_clients() {
        let role = quote_ident(role);
        let grant = format!("grant execute on function {all} to {role}");
        sqlx::query(&grant).execute(&mut *tx).await?;
    }
    for role in install.readers() {
        let role = quote_ident(role);
        let lookup = format!(
            "grant execute on function {} to {role}",
            Statements::holder_signature(table)
        );
        for grant in [format!("grant select on {table} to {role}"), lookup] {
            sqlx::query(&grant).execute(&mut *tx).await?;
        }
    }
    // A schema of its own (not `public`, whose USAGE every role has) must
    // let them see the functions.
    for role in install.lock_clients().iter().chain(install.readers()) {
        let usage: bool =
            sqlx::query_scalar("select has_schema_privilege($1, current_schema(), 'usage')")
                .bind(role)
                .fetch_one(&mut *tx)
                .await?;
        if !usage {
            let grant = format!(
                "grant usage on schema {} to {}",
                quote_ident(&schema),
                quote_ident(role)
            );
            sqlx::query(&grant).execute(&mut *tx).await?;
        }
    }
    tx.commit().await
}

/// A column of the lease table or its queue.
#[derive(sqlx::FromRow)]
struct Column {
    table_name: String,
    column_name: String,
}

/// The columns that tables made by an earlier version lack (the lease
/// table's `queued_until` and `login`; the queue's `client_id`, `ttl_secs`
/// and `login`, which the hand-over reads), as `alter table` statements.
/// Empty when the tables are current, or when this login sees none of
/// their columns (`information_schema` shows only what it has privileges
/// on). The table name is folded to lower case, as an unquoted name is.
async fn missing_columns(conn: &mut PgConnection, table: &str) -> Result<Vec<String>, sqlx::Error> {
    let wanted = [
        ("{table}", "queued_until", "timestamptz"),
        ("{table}", "login", "text"),
        ("{table}_waiters", "client_id", "text"),
        ("{table}_waiters", "ttl_secs", "float8"),
        ("{table}_waiters", "login", "text"),
    ];
    let present: Vec<Column> = sqlx::query_as(COLUMNS).bind(table).fetch_all(conn).await?;
    let seen = |target: &str| present.iter().any(|p| p.table_name == target);
    Ok(wanted
        .iter()
        .filter(|(target, column, _)| {
            let target = target.replace("{table}", table).to_lowercase();
            seen(&target)
                && !present
                    .iter()
                    .any(|p| p.table_name == target && p.column_name == *column)
        })
        .map(|(target, column, ty)| Statements::add_column(table, target, column, ty))
        .collect())
}
