//! [`LeaseTableOptions`]: the table's name, whether the constructor
//! installs it, the pool's size, read-only lookups.

use super::{DEFAULT_TABLE, MAX_CONNECTIONS};

/// How to set up a [`LeaseTable`](crate::lease_table::LeaseTable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTableOptions {
    pub(super) table: String,
    pub(super) create_table: bool,
    pub(super) max_connections: u32,
    pub(super) read_only: bool,
}

impl Default for LeaseTableOptions {
    fn default() -> Self {
        Self {
            table: DEFAULT_TABLE.into(),
            create_table: true,
            max_connections: MAX_CONNECTIONS,
            read_only: false,
        }
    }
}

impl LeaseTableOptions {
    /// The table's name: `[A-Za-z_][A-Za-z0-9_]*`, at most 49 bytes (checked
    /// by the constructor, since it is written into the SQL; its queue table
    /// adds `_waiters`, its functions `_<verb>`, up to `_release_light`).
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// Whether the constructor installs the tables and their functions when
    /// they are missing or from another version (default true; see "The
    /// tables and their functions"). Turn it off when your own migrations
    /// create them from [`postgres::Statements::ddl`](crate::lease_table::postgres::Statements::ddl) or
    /// [`mysql::Statements::ddl`](crate::lease_table::mysql::Statements::ddl), or [`install_postgres`](crate::lease_table::install_postgres) /
    /// [`install_mysql`](crate::lease_table::install_mysql) does.
    pub fn create_table(mut self, on: bool) -> Self {
        self.create_table = on;
        self
    }

    /// Size of the connection pool (default 16). Waiting takes connections
    /// too: PostgreSQL keeps one for `LISTEN` once somebody waited; on
    /// MariaDB every held lease keeps one (its bell) and every waiter uses
    /// one while it waits.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// A holder lookup for a login that may only read the lease table
    /// (default false; SELECT, as [`Install::reader`](crate::lease_table::Install::reader) grants): the table's
    /// own `select`, nothing created; until the table exists it answers
    /// that nothing was granted (and warns). Not for taking locks: the
    /// database refuses them. See [`LeaseTable::postgres_reader`](crate::lease_table::LeaseTable::postgres_reader),
    /// [`LeaseTable::mysql_reader`](crate::lease_table::LeaseTable::mysql_reader).
    pub fn read_only(mut self, on: bool) -> Self {
        self.read_only = on;
        self
    }
}
