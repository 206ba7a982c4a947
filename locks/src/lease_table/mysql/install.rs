//! Installing a lease table on MySQL/MariaDB: its tables, the queue's
//! trigger and the stored functions, and the grants of its lock clients
//! and readers.

use sqlx::mysql::{MySqlConnection, MySqlDatabaseError};
use sqlx::Executor;

use super::statements::Statements;
use crate::lease_table::install::{Install, Installed, Installer};
use crate::lease_table::ISSUER_MYSQL;
use crate::LockError;

/// Whether a trigger exists (bind: its name).
const HAS_TRIGGER: &str = include_str!("sql/has_trigger.sql");
/// The columns of the table and its queue, with their types (bind: the
/// table's name, twice).
const COLUMNS: &str = include_str!("sql/columns.sql");
/// Let the lock taken by [`Statements::install_lock`] go.
const UNLOCK: &str = "select release_all_locks()";

impl Installer for MySqlConnection {
    const ISSUER: &'static str = ISSUER_MYSQL;
    const INSTALL: &'static str = "install_mysql";

    /// Asks `<table>_version()`, which also says whether the queue's
    /// trigger is there.
    async fn installed(&mut self, table: &str) -> Result<(Installed, bool), sqlx::Error> {
        let version: Result<Option<String>, sqlx::Error> =
            sqlx::query_scalar(&format!("select {table}_version()"))
                .fetch_one(self)
                .await;
        Ok(match version {
            Ok(Some(v)) if v.starts_with(&Statements::version(table)) => {
                (Installed::Current, v.ends_with(" light"))
            }
            Ok(_) => (Installed::Other, false),
            Err(e) if number(&e) == Some(1305) => (Installed::Missing, false),
            Err(e) if Self::permission_denied(&e) => (Installed::NotExecutable, false),
            Err(e) => return Err(e),
        })
    }

    async fn missing_columns(&mut self, table: &str) -> Result<Vec<String>, sqlx::Error> {
        missing_columns(self, table).await
    }

    /// Concurrent installers of one table wait for each other on a user
    /// lock.
    async fn install(&mut self, install: &Install) -> Result<bool, sqlx::Error> {
        let table = install.table_name();
        let _: Option<i64> = sqlx::query_scalar(&Statements::install_lock(table))
            .fetch_one(&mut *self)
            .await?;
        let installed = install_locked(self, install).await;
        let _ = (&mut *self).execute(UNLOCK).await;
        installed
    }

    /// On the database, a table, a column or a routine, or one that
    /// creating or granting needs.
    fn permission_denied(e: &sqlx::Error) -> bool {
        matches!(
            number(e),
            Some(1044 | 1142 | 1143 | 1227 | 1370 | 1410 | 1419)
        )
    }

    fn install_error(table: &str, e: sqlx::Error) -> LockError {
        if Self::permission_denied(&e) || number(&e) == Some(1133) {
            LockError::InvalidConfig(format!(
                "install lease table {table}: {e} (run it as the user that may create the \
                 tables and functions and grant EXECUTE on them, for users that exist)"
            ))
        } else {
            LockError::unavailable(ISSUER_MYSQL, format!("install lease table {table}: {e}"))
        }
    }
}

/// The server's error number of `e`, if the server answered one.
fn number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(d) => d
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

async fn install_locked(
    conn: &mut MySqlConnection,
    install: &Install,
) -> Result<bool, sqlx::Error> {
    let table = install.table_name();
    let (found, mut light) = conn.installed(table).await?;
    if found != Installed::Current {
        // A `&str` goes by the text protocol, which `create function` needs.
        for ddl in Statements::table_ddl(table) {
            conn.execute(ddl.as_str()).await?;
        }
        // Looked up first: `alter table` takes the table's exclusive
        // metadata lock even when there is nothing to change.
        for alter in missing_columns(&mut *conn, table).await? {
            conn.execute(alter.as_str()).await?;
        }
        light = trigger(&mut *conn, table).await?;
        for ddl in Statements::function_ddl(table, light) {
            conn.execute(ddl.as_str()).await?;
        }
    }
    for client in install.lock_clients() {
        for function in Statements::function_names(table) {
            let grant = format!("grant execute on function {function} to {}", user(client));
            conn.execute(grant.as_str()).await?;
        }
    }
    for reader in install.readers() {
        for grant in [
            format!("grant select on {table} to {}", user(reader)),
            format!(
                "grant execute on function {table}_holder to {}",
                user(reader)
            ),
        ] {
            conn.execute(grant.as_str()).await?;
        }
    }
    Ok(light)
}

/// User `name` as MariaDB names it, `'name'@'%'` (the name was checked).
fn user(name: &str) -> String {
    format!("'{name}'@'%'")
}

/// The queue's trigger, created if missing; whether it is there. Without
/// it the lock works, only its uncontended fair grant is heavier (a server
/// with binary logging refuses triggers to users without SUPER unless
/// `log_bin_trust_function_creators` is on). Looked up first: `create
/// trigger if not exists` takes the tables' exclusive metadata lock even
/// when the trigger exists, so it would wait for every waiter blocked on a
/// bell, and every statement on the tables would queue behind it
/// (measured: a new service stalled the lock for a lease's whole TTL).
async fn trigger(conn: &mut MySqlConnection, table: &str) -> Result<bool, sqlx::Error> {
    let name = format!("{table}_queued");
    if has_trigger(conn, &name).await? {
        return Ok(true);
    }
    let created = conn
        .execute(Statements::queued_trigger(table).as_str())
        .await;
    if let Err(e) = created {
        tracing::warn!(
            issuer = ISSUER_MYSQL,
            "could not create the trigger {name}, so every fair grant looks at the queue \
             (slower, as safe): {e}"
        );
    }
    has_trigger(conn, &name).await
}

async fn has_trigger(conn: &mut MySqlConnection, name: &str) -> Result<bool, sqlx::Error> {
    let count: i64 = sqlx::query_scalar(HAS_TRIGGER)
        .bind(name)
        .fetch_one(conn)
        .await?;
    Ok(count == 1)
}

/// What tables made by an earlier version lack: `queued_until` and `login`,
/// and names compared byte for byte, as `alter table` statements. Empty
/// when the tables are current, or when this user sees none of their
/// columns.
pub(super) async fn missing_columns<'e>(
    db: impl sqlx::MySqlExecutor<'e>,
    table: &str,
) -> Result<Vec<String>, sqlx::Error> {
    let login = "add column login varchar(128) character set utf8mb4 collate utf8mb4_bin null";
    let name = "modify name varbinary(255) not null";
    // (table, column, the type it must have if any, the change)
    let wanted = [
        (
            "{table}",
            "queued_until",
            None,
            "add column queued_until datetime(6) null",
        ),
        ("{table}", "login", None, login),
        ("{table}_waiters", "login", None, login),
        ("{table}", "name", Some("varbinary"), name),
        ("{table}_waiters", "name", Some("varbinary"), name),
    ];
    let present: Vec<(String, String, String)> = sqlx::query_as(COLUMNS)
        .bind(table)
        .bind(table)
        .fetch_all(db)
        .await?;
    let seen = |target: &str| present.iter().any(|(t, _, _)| t == target);
    Ok(wanted
        .iter()
        .filter(|(target, column, ty, _)| {
            let target = target.replace("{table}", table);
            let found = present.iter().find(|(t, c, _)| *t == target && c == column);
            seen(&target)
                && match (found, ty) {
                    (None, _) => true,
                    (Some((_, _, data_type)), Some(ty)) => data_type != ty,
                    (Some(_), None) => false,
                }
        })
        .map(|(target, _, _, change)| Statements::alter(table, target, change))
        .collect())
}
