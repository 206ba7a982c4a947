//! A private MariaDB from Debian's `mariadb-server` package.

use std::path::Path;
use std::time::Duration;

use sqlx::MySqlConnection;
use tokio::sync::OnceCell;

use crate::process::{find_binary, Recipe};
use crate::service::{
    execute_all, fresh_database_in, login_url, sql_ping_at, Database, Server, Service, Shared,
};

/// A MariaDB server: what is its own (`mariadb-install-db`, its settings,
/// `select 1` as readiness). The rest is [`Server`]'s.
#[derive(Debug, Clone, Copy, Default)]
pub struct MariaDbService;

/// A mariadbd on a free port with its data in a temp dir. Killed on drop.
pub type MariaDb = Server<MariaDbService>;

impl Service for MariaDbService {
    const NAME: &'static str = "mariadb";
    const READY_WITHIN: Duration = Duration::from_secs(60);

    async fn prepare(&self, dir: &Path, port: u16) -> Recipe {
        let data = dir.join("data");
        install_db(&data).await;
        // Its own tmpdir: a mariadbd starting deletes every `#sql*` file in
        // its tmpdir, so with a shared /tmp a second server's start deleted
        // the first one's internal temporary tables mid-statement.
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).expect("create mariadb tmpdir");
        Recipe::new(
            find_binary("mariadbd", &["/usr/sbin", "/usr/bin"]),
            vec![
                "--no-defaults".into(),
                format!("--datadir={}", data.display()),
                format!("--tmpdir={}", tmp.display()),
                "--user=root".into(),
                format!("--port={port}"),
                "--bind-address=127.0.0.1".into(),
                format!("--socket={}", dir.join("sock").display()),
                "--skip-log-bin".into(),
                "--skip-name-resolve".into(),
                "--max-connections=300".into(),
                "--innodb-flush-log-at-trx-commit=2".into(),
                "--innodb-buffer-pool-size=64M".into(),
            ],
            dir.join("mariadb.log"),
        )
    }

    async fn probe(&self, port: u16) -> anyhow::Result<()> {
        sql_ping_at::<Self>(port).await
    }
}

impl Database for MariaDbService {
    type Connection = MySqlConnection;
    const ADMIN_DB: &'static str = "mysql";
    const URL_VAR: &'static str = "MYSQL_URL";
    const SCHEME_AND_USER: &'static str = "mysql://root";
}

/// `mariadb-install-db` into `data`. Tried twice: once, under heavy load from
/// a parallel test binary, it failed without a reproducible cause; the first
/// failure's output is printed, and a second failure panics with its output.
async fn install_db(data: &Path) {
    let install = find_binary("mariadb-install-db", &["/usr/bin", "/usr/sbin"]);
    let mut last = String::new();
    for attempt in 1..=2 {
        let _ = std::fs::remove_dir_all(data);
        let out = tokio::process::Command::new(&install)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--user=root", "--auth-root-authentication-method=normal"])
            .args(["--skip-test-db", "--skip-name-resolve"])
            .output()
            .await
            .expect("run mariadb-install-db");
        if out.status.success() {
            return;
        }
        last = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("mariadb-install-db failed (attempt {attempt}): {last}");
    }
    panic!("mariadb-install-db failed twice: {last}");
}

static SHARED: OnceCell<Shared<MariaDbService>> = OnceCell::const_new();

/// A fresh, empty MySQL database for one test: on the server `MYSQL_URL` names
/// (its path is replaced), or else on a private MariaDB started on first use.
pub async fn fresh_mysql_database() -> String {
    fresh_database_in(&SHARED, MariaDbService).await
}

/// User `'name'@'%'` (password `name`) on the server of `url` (root's),
/// created if missing, without any privilege. Users belong to the whole
/// server, so tests name theirs after their database. The URL of `url`'s
/// database as that user.
pub async fn create_user(url: &str, name: &str) -> String {
    let create = format!("create user if not exists '{name}'@'%' identified by '{name}'");
    execute_all::<MySqlConnection>(url, &[create]).await;
    login_url(url, name, name)
}
