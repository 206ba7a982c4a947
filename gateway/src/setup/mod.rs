//! `gateway setup`: the operator's one-shot step, run with the page
//! database owner's URL before the gateways serve. Idempotent: run it again
//! after an upgrade, or to repair the grants.
//!
//! The steps, in order:
//! 1. the roles must exist (the database's administrator creates them and
//!    sets their passwords; setup names the one missing);
//! 2. the migrations ([`crate::schema::migrate`]): the page tables belong
//!    to the role that runs this;
//! 3. the grants ([`grants`]): exactly the rights of each role on the page
//!    tables, revoked and granted again in one transaction;
//! 4. the lease table of the page database, with its grants (`lease.rs`);
//! 5. with `--mysql-url`, MariaDB's lease table the same way;
//! 6. with `--zookeeper-url`, the ZooKeeper lock roots' ACLs, with the
//!    ZooKeeper admin's credentials (`zookeeper.rs`).
//!
//! The serving gateway applies none of this: its role cannot. It checks at
//! start that the schema is this version's ([`crate::schema::check`]).

mod grants;
mod lease;
mod zookeeper;

use std::time::Duration;

use anyhow::Context;
use fencelock::scrub_secrets_all;

use crate::config::SecretUrl;

pub use grants::quote_ident;

/// `gateway setup`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SetupConfig {
    /// A file of `NAME=VALUE` lines read into the environment before the
    /// other settings (the owners' URLs with their passwords).
    #[arg(long, env = "SECRETS_FILE", value_name = "FILE")]
    pub secrets_file: Option<std::path::PathBuf>,
    /// PostgreSQL URL of the role that owns the page tables (fence_owner):
    /// it runs the migrations and grants the other roles their rights.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: SecretUrl,
    /// The fenced gateways' role: reads and writes pages, appends history,
    /// reads the lease table.
    #[arg(long, env = "GATEWAY_ROLE", default_value = "fence_gateway")]
    pub gateway_role: String,
    /// The unfenced gateway's role (GATEWAY_FENCING=off): writes pages'
    /// bodies and appends history, but may not write a fence.
    #[arg(long, env = "GATEWAY_UNFENCED_ROLE", default_value = "fence_unfenced")]
    pub unfenced_role: String,
    /// The issuer lookups' role (a lease-postgres issuer's URL): reads the
    /// lease table, nothing else.
    #[arg(long, env = "GATEWAY_ISSUER_ROLE", default_value = "fence_issuer")]
    pub issuer_role: String,
    /// The workers' group role (each worker logs in as a member of it):
    /// takes and releases leases through the lease table's recipe.
    #[arg(
        long,
        env = "GATEWAY_LOCK_CLIENT_ROLE",
        default_value = "fence_lock_client"
    )]
    pub lock_client_role: String,
    /// The lease table's name, in the page database and in MariaDB.
    #[arg(long, env = "GATEWAY_LEASE_TABLE", default_value = "fencelock_leases")]
    pub lease_table: String,
    /// MariaDB URL of the locks database's owner: its lease table is
    /// installed too. Without it, MariaDB is left alone.
    #[arg(long, env = "GATEWAY_SETUP_MYSQL_URL", hide_env_values = true)]
    pub mysql_url: Option<SecretUrl>,
    /// ZooKeeper as its admin, zookeeper://admin:PW@h1:2181,h2:2181/: the
    /// lock roots' ACLs are set (the admin's id must be the one the lock
    /// clients name). Without it, ZooKeeper is left alone.
    #[arg(long, env = "GATEWAY_SETUP_ZOOKEEPER_URL", hide_env_values = true)]
    pub zookeeper_url: Option<SecretUrl>,
    /// The digest id every ZooKeeper lock client also authenticates as,
    /// `lock-clients:base64(sha1(lock-clients:PW))`: it may create locks.
    #[arg(
        long,
        env = "GATEWAY_SETUP_ZOOKEEPER_LOCK_CLIENTS_ID",
        requires = "zookeeper_url"
    )]
    pub zookeeper_lock_clients_id: Option<fencelock::zookeeper::DigestId>,
    /// Digest ids that may read every lock (the gateways' issuer user),
    /// comma-separated.
    #[arg(
        long,
        env = "GATEWAY_SETUP_ZOOKEEPER_READER_IDS",
        value_delimiter = ','
    )]
    pub zookeeper_reader_ids: Vec<fencelock::zookeeper::DigestId>,
}

/// The database roles setup grants rights to. Each must exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roles {
    pub gateway: String,
    pub unfenced: String,
    pub issuer: String,
    pub lock_client: String,
}

impl Default for Roles {
    fn default() -> Self {
        Roles {
            gateway: "fence_gateway".into(),
            unfenced: "fence_unfenced".into(),
            issuer: "fence_issuer".into(),
            lock_client: "fence_lock_client".into(),
        }
    }
}

impl Roles {
    /// The gateway's, the unfenced gateway's, the issuer's and the lock
    /// clients' role names, quoted for SQL.
    fn quoted(&self) -> [String; 4] {
        [
            &self.gateway,
            &self.unfenced,
            &self.issuer,
            &self.lock_client,
        ]
        .map(|r| quote_ident(r))
    }

    /// Each role with what it is for.
    fn all(&self) -> [(&'static str, &str); 4] {
        [
            ("gateway", &self.gateway),
            ("unfenced", &self.unfenced),
            ("issuer", &self.issuer),
            ("lock client", &self.lock_client),
        ]
    }
}

/// What [`run`] does besides the migrations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupOptions {
    pub roles: Roles,
    pub lease_table: String,
    /// MariaDB's owner URL: its lease table is installed too.
    pub mysql_url: Option<String>,
    /// ZooKeeper's admin URL, the lock clients' id and the readers' ids:
    /// the lock roots' ACLs are set.
    pub zookeeper: Option<ZooKeeperSetup>,
    /// How long to wait for the database to come up.
    pub patience: Duration,
}

/// What the ZooKeeper step needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZooKeeperSetup {
    pub url: String,
    pub lock_clients: fencelock::zookeeper::DigestId,
    pub readers: Vec<fencelock::zookeeper::DigestId>,
}

impl Default for SetupOptions {
    fn default() -> Self {
        SetupOptions {
            roles: Roles::default(),
            lease_table: fencelock::lease_table::DEFAULT_TABLE.into(),
            mysql_url: None,
            zookeeper: None,
            patience: Duration::ZERO,
        }
    }
}

impl SetupConfig {
    /// The options these flags say, with a wait of `patience` for the database.
    pub fn options(&self, patience: Duration) -> anyhow::Result<SetupOptions> {
        let zookeeper = match (&self.zookeeper_url, &self.zookeeper_lock_clients_id) {
            (Some(url), Some(lock_clients)) => Some(ZooKeeperSetup {
                url: url.expose().to_owned(),
                lock_clients: lock_clients.clone(),
                readers: self.zookeeper_reader_ids.clone(),
            }),
            (None, _) => None,
            (Some(_), None) => anyhow::bail!(
                "GATEWAY_SETUP_ZOOKEEPER_URL needs GATEWAY_SETUP_ZOOKEEPER_LOCK_CLIENTS_ID: the id every lock client shares"
            ),
        };
        Ok(SetupOptions {
            roles: Roles {
                gateway: self.gateway_role.clone(),
                unfenced: self.unfenced_role.clone(),
                issuer: self.issuer_role.clone(),
                lock_client: self.lock_client_role.clone(),
            },
            lease_table: self.lease_table.clone(),
            mysql_url: self.mysql_url.as_ref().map(|u| u.expose().to_owned()),
            zookeeper,
            patience,
        })
    }
}

/// What setup did, one line a step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetupReport {
    pub steps: Vec<String>,
}

/// Run the steps (see the module docs) against the page database at
/// `database_url`, as its owner. Errors name the step and never a password.
pub async fn run(database_url: &str, options: &SetupOptions) -> anyhow::Result<SetupReport> {
    let urls = std::iter::once(database_url)
        .chain(options.mysql_url.as_deref())
        .chain(options.zookeeper.as_ref().map(|z| z.url.as_str()));
    let urls: Vec<&str> = urls.collect();
    steps(database_url, options)
        .await
        .map_err(|e| anyhow::anyhow!("{}", scrub_secrets_all(&format!("{e:#}"), urls)))
}

/// `url` naming only the server `connected` reached, the one that accepts
/// writes: the lease table's install connects with sqlx, which does not
/// parse a multi-host URL (`h1:5432,h2:5432`). Other URLs stay as they are.
fn writable_url(url: &str, connected: &sqlx::postgres::PgConnectOptions) -> String {
    let reached = |server: &String| {
        server
            .parse::<sqlx::postgres::PgConnectOptions>()
            .is_ok_and(|o| {
                o.get_host() == connected.get_host() && o.get_port() == connected.get_port()
            })
    };
    match crate::db::split_url(url) {
        Ok((servers, _)) if servers.len() > 1 => servers
            .into_iter()
            .find(reached)
            .unwrap_or_else(|| url.to_owned()),
        _ => url.to_owned(),
    }
}

async fn steps(database_url: &str, options: &SetupOptions) -> anyhow::Result<SetupReport> {
    let mut report = SetupReport::default();
    let db = crate::connect_patiently(database_url, options.patience).await?;
    let result = async {
        grants::check_roles(&db, &options.roles).await?;
        crate::schema::migrate(&db).await?;
        report.steps.push(format!(
            "migrations: {} applied",
            crate::schema::MIGRATOR.iter().count()
        ));
        grants::grant(&db, &options.roles).await.context("grants")?;
        report
            .steps
            .push(format!("grants: {}", grants::summary(&options.roles)));
        let writable = writable_url(database_url, &db.connect_options());
        lease::install_postgres(&db, &writable, &options.lease_table, &options.roles)
            .await
            .with_context(|| format!("lease table {} (PostgreSQL)", options.lease_table))?;
        report.steps.push(format!(
            "lease table {}: installed in the page database",
            options.lease_table
        ));
        if let Some(mysql) = &options.mysql_url {
            lease::install_mysql(mysql, &options.lease_table, &options.roles)
                .await
                .with_context(|| format!("lease table {} (MariaDB)", options.lease_table))?;
            report.steps.push(format!(
                "lease table {}: installed in MariaDB at {}",
                options.lease_table,
                fencelock::redact_url(mysql)
            ));
        }
        if let Some(zk) = &options.zookeeper {
            let step = zookeeper::prepare(&zk.url, &zk.lock_clients, &zk.readers)
                .await
                .context("ZooKeeper lock roots")?;
            report.steps.push(step);
        }
        anyhow::Ok(())
    }
    .await;
    db.close().await;
    result.map(|()| report)
}

#[cfg(test)]
mod tests {
    use sqlx::postgres::PgConnectOptions;

    use super::writable_url;

    #[test]
    fn a_multi_host_url_names_the_server_that_was_reached() {
        let reached = PgConnectOptions::new().host("10.0.0.2").port(5433);
        assert_eq!(
            writable_url(
                "postgres://owner:pw@10.0.0.1:5432,10.0.0.2:5433/pages?target_session_attrs=read-write",
                &reached
            ),
            "postgres://owner:pw@10.0.0.2:5433/pages"
        );
        let single = "postgres://owner:pw@db:5432/pages";
        assert_eq!(writable_url(single, &reached), single);
    }
}
