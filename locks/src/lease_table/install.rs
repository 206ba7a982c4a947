//! What an operator installs for a lease table, on either database: the
//! tables and their functions, and who may call them ([`Install`]).

use super::{connect_error, validate_table, LeaseTableOptions, CONNECT_TIMEOUT, DEFAULT_TABLE};
use crate::LockError;

/// What [`install_postgres`] and [`install_mysql`] set up: the lease table
/// `table` (default [`DEFAULT_TABLE`]) and its queue, the functions that are
/// the only way to take, renew, wait for and release its leases, and the
/// logins that may use them:
///
/// - a *lock client* (a worker) gets EXECUTE on the functions and no
///   privilege on the tables: the database refuses its direct reads and
///   writes;
/// - a *reader* (a storage that asks who holds a lock, such as the gateway's
///   issuer check) gets SELECT on the lease table (and EXECUTE on the holder
///   lookup): it can look, not write.
///
/// Run it with the login that is to own the tables and functions (it needs
/// the right to create them in the database, and on MariaDB to grant
/// EXECUTE: `with grant option`). The functions run with their owner's
/// rights (PostgreSQL `SECURITY DEFINER`, MariaDB `SQL SECURITY DEFINER`).
/// Idempotent: what is missing or from another version is created (tables
/// made by an earlier version get their new columns), the grants are
/// applied again; concurrent installs of one table are serialised.
///
/// [`install_postgres`]: crate::lease_table::install_postgres
/// [`install_mysql`]: crate::lease_table::install_mysql
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    table: String,
    lock_clients: Vec<String>,
    readers: Vec<String>,
}

impl Default for Install {
    fn default() -> Self {
        Self::new()
    }
}

impl Install {
    /// The default table, nobody granted anything.
    pub fn new() -> Self {
        Install {
            table: DEFAULT_TABLE.into(),
            lock_clients: vec![],
            readers: vec![],
        }
    }

    /// The lease table's name (see [`LeaseTableOptions::table`]).
    ///
    /// [`LeaseTableOptions::table`]: crate::lease_table::LeaseTableOptions::table
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// A role (PostgreSQL; a group role serves its members) or user
    /// (MariaDB: `'name'@'%'`) that takes locks: EXECUTE on the lock
    /// functions.
    pub fn lock_client(mut self, role_or_user: impl Into<String>) -> Self {
        self.lock_clients.push(role_or_user.into());
        self
    }

    /// A role or user that looks up holders: SELECT on the lease table (and
    /// EXECUTE on the holder lookup). See [`LeaseTable::postgres_reader`].
    ///
    /// [`LeaseTable::postgres_reader`]: crate::lease_table::LeaseTable::postgres_reader
    pub fn reader(mut self, role_or_user: impl Into<String>) -> Self {
        self.readers.push(role_or_user.into());
        self
    }

    pub(super) fn table_name(&self) -> &str {
        &self.table
    }

    pub(super) fn lock_clients(&self) -> &[String] {
        &self.lock_clients
    }

    pub(super) fn readers(&self) -> &[String] {
        &self.readers
    }

    /// Check the table's name and the logins' (written into the grants:
    /// letters, digits, `_`, `-` and `.` only, at most 63 bytes).
    pub(super) fn validate(&self) -> Result<(), LockError> {
        validate_table(&self.table)?;
        for login in self.lock_clients.iter().chain(&self.readers) {
            let ok = (1..=63).contains(&login.len())
                && login
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
            if !ok {
                return Err(LockError::InvalidConfig(format!(
                    "login {login:?}: must be 1 to 63 letters, digits, `_`, `-` or `.`"
                )));
            }
        }
        Ok(())
    }
}

/// Install lease table `install.table` on the PostgreSQL database at
/// `url` (see [`Install`]), as the login of `url`, which owns what it
/// creates. Lock clients get EXECUTE on the functions (and USAGE on the
/// schema when they lack it), readers SELECT on the lease table and EXECUTE
/// on `<table>_holder`. Roles must exist.
#[cfg(feature = "lease-postgres")]
pub async fn install_postgres(url: &str, install: &Install) -> Result<(), LockError> {
    install_at::<sqlx::PgConnection>(url, install).await
}

/// Install lease table `install.table` in the MySQL/MariaDB database at
/// `url` (see [`Install`]), as the user of `url`, who defines what it
/// creates (and must hold `grant option` to grant EXECUTE). Lock clients and
/// readers are users `'<name>'@'%'`, which must exist: lock clients get
/// EXECUTE on the functions, readers SELECT on the lease table and EXECUTE
/// on `<table>_holder`.
#[cfg(feature = "lease-mysql")]
pub async fn install_mysql(url: &str, install: &Install) -> Result<(), LockError> {
    install_at::<sqlx::MySqlConnection>(url, install).await
}

/// Where the functions of a lease table stand for the login that connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Installed {
    /// This version's, and this login may execute them.
    Current,
    /// No `<table>_version()`.
    Missing,
    /// From another version of the library.
    Other,
    /// This version's, but this login may not execute them.
    NotExecutable,
}

impl Installed {
    fn describe(&self) -> &'static str {
        match self {
            Installed::Current => "current",
            Installed::Missing => "missing",
            Installed::Other => "from another version of fencelock",
            Installed::NotExecutable => "not executable by this login (no EXECUTE)",
        }
    }
}

/// The refusal of a service whose login may not install what is missing
/// (`installed`; `cause`: what the database said): what to run instead.
fn not_installed(table: &str, installed: &Installed, install: &str, cause: &str) -> LockError {
    LockError::InvalidConfig(format!(
        "the functions of lease table {table} are {}, and this login may not install \
         them ({cause}): have their owner run fencelock::lease_table::{install} (the \
         operator's setup step, e.g. `gateway setup`) with this login, or a role it belongs \
         to, as a lock client (Install::lock_client)",
        installed.describe()
    ))
}

/// The refusal of a service told not to create anything
/// (`LeaseTableOptions::create_table(false)`) whose functions are not
/// current: `missing` columns (the `alter table`s, when this login can see
/// them) and what to run.
fn not_created(table: &str, installed: &Installed, missing: &[String], install: &str) -> LockError {
    let alter = if missing.is_empty() {
        String::new()
    } else {
        format!(
            "; the tables, made by an earlier version, lack columns: `{}`",
            missing.join("; ")
        )
    };
    LockError::InvalidConfig(format!(
        "the functions of lease table {table} are {}{alter}: run \
         fencelock::lease_table::{install} (or the DDL of Statements::ddl), or let the library \
         do it (LeaseTableOptions::create_table)",
        installed.describe()
    ))
}

/// What each database's install does, on one connection of it.
pub(super) trait Installer: sqlx::Connection {
    /// Its issuer, and its install function's name (for the messages).
    const ISSUER: &'static str;
    const INSTALL: &'static str;

    /// Where the functions of `table` stand for this login, and whether
    /// the light fair grant can be used.
    async fn installed(&mut self, table: &str) -> Result<(Installed, bool), sqlx::Error>;

    /// The `alter table`s that tables made by an earlier version need
    /// (those this login can see).
    async fn missing_columns(&mut self, table: &str) -> Result<Vec<String>, sqlx::Error>;

    /// What `install` says: the tables and functions (unless current), the
    /// grants; whether the light fair grant can be used.
    async fn install(&mut self, install: &Install) -> Result<bool, sqlx::Error>;

    /// Whether the database denied a privilege.
    fn permission_denied(e: &sqlx::Error) -> bool;

    /// The error of an install that failed with `e`.
    fn install_error(table: &str, e: sqlx::Error) -> LockError;
}

/// The constructors': a pool on `url`, and (unless read only) the
/// functions of the table as this version's, or installed now when
/// creation is on and the login may; whether the light fair grant can be
/// used.
pub(super) async fn ready<C: Installer>(
    options: &LeaseTableOptions,
    url: &str,
) -> Result<(sqlx::Pool<C::Database>, bool), LockError>
where
    C::Database: sqlx::Database<Connection = C>,
{
    let table = options.table.as_str();
    let pool = options.pool::<C::Database>(C::ISSUER, url).await?;
    if options.read_only {
        return Ok((pool, false));
    }
    let unavailable = |e| LockError::unavailable(C::ISSUER, e);
    let mut conn = pool.acquire().await.map_err(unavailable)?;
    let (found, light) = conn.installed(table).await.map_err(unavailable)?;
    if found == Installed::Current {
        drop(conn);
        return Ok((pool, light));
    }
    if !options.create_table {
        let missing = conn.missing_columns(table).await.map_err(unavailable)?;
        return Err(not_created(table, &found, &missing, C::INSTALL));
    }
    let light = match conn.install(&Install::new().table(table)).await {
        Ok(light) => light,
        Err(e) if C::permission_denied(&e) => {
            let cause = e.to_string();
            return Err(not_installed(table, &found, C::INSTALL, &cause));
        }
        Err(e) => return Err(C::install_error(table, e)),
    };
    drop(conn);
    Ok((pool, light))
}

/// `install` on the database at `url`, on a connection of its own.
pub(super) async fn install_at<I: Installer>(
    url: &str,
    install: &Install,
) -> Result<(), LockError> {
    install.validate()?;
    let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, I::connect(url))
        .await
        .map_err(|_| LockError::unavailable(I::ISSUER, "connect: timed out"))?
        .map_err(|e| connect_error(I::ISSUER, url, e))?;
    let installed = conn.install(install).await;
    let _ = conn.close().await;
    installed
        .map(drop)
        .map_err(|e| I::install_error(install.table_name(), e))
}
