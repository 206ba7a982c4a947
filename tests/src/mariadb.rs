//! A private MariaDB from Debian's `mariadb-server` package.

use std::time::Duration;

use sqlx::{Connection, MySqlConnection};
use tempfile::TempDir;
use tokio::sync::OnceCell;

use crate::process::{find_binary, free_port, wait_until, Recipe, ServiceProcess};

/// A mariadbd on a free port with its data in a temp dir. Killed on drop.
pub struct MariaDb {
    process: ServiceProcess,
    port: u16,
    _dir: TempDir,
}

impl MariaDb {
    pub async fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("harness-mariadb-")
            .tempdir_in(crate::process::scratch_dir())
            .expect("temp dir");
        let data = dir.path().join("data");
        install_db(&data).await;
        let port = free_port();
        let recipe = Recipe {
            program: find_binary("mariadbd", &["/usr/sbin", "/usr/bin"]),
            args: vec![
                "--no-defaults".into(),
                format!("--datadir={}", data.display()),
                "--user=root".into(),
                format!("--port={port}"),
                "--bind-address=127.0.0.1".into(),
                format!("--socket={}", dir.path().join("sock").display()),
                "--skip-log-bin".into(),
                "--skip-name-resolve".into(),
                "--max-connections=300".into(),
                "--innodb-flush-log-at-trx-commit=2".into(),
                "--innodb-buffer-pool-size=64M".into(),
            ],
            env: vec![],
            user: None,
            log: dir.path().join("mariadb.log"),
        };
        let process = ServiceProcess::spawn("mariadb", recipe).expect("spawn mariadbd");
        let mut me = Self {
            process,
            port,
            _dir: dir,
        };
        me.wait_ready().await;
        me
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self, db: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{db}", self.port)
    }

    /// Create a new, empty database and return its URL.
    pub async fn create_database(&self) -> String {
        create_database_at(&self.url("mysql"), self.port).await
    }

    pub fn process(&mut self) -> &mut ServiceProcess {
        &mut self.process
    }

    pub fn kill(&mut self) {
        self.process.kill();
    }

    pub async fn start_again(&mut self) {
        self.process.start().expect("restart mariadbd");
        self.wait_ready().await;
    }

    async fn wait_ready(&mut self) {
        let url = self.url("mysql");
        let ready = wait_until(Duration::from_secs(60), || async {
            let mut conn = MySqlConnection::connect(&url).await?;
            sqlx::query("select 1").execute(&mut conn).await?;
            conn.close().await
        })
        .await;
        if let Err(e) = ready {
            panic!(
                "mariadb did not become ready on port {}: {e}\n--- log ---\n{}",
                self.port,
                self.process.log_tail(40)
            );
        }
    }
}

async fn create_database_at(admin_url: &str, _port: u16) -> String {
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let mut conn = MySqlConnection::connect(admin_url)
        .await
        .unwrap_or_else(|e| panic!("connect to {admin_url}: {e}"));
    sqlx::query(&format!("create database {name}"))
        .execute(&mut conn)
        .await
        .expect("create database");
    let _ = conn.close().await;
    let base = admin_url
        .rsplit_once('/')
        .map(|(b, _)| b)
        .unwrap_or(admin_url);
    format!("{base}/{name}")
}

/// `mariadb-install-db` into `data`. Tried twice: once, under heavy load from
/// a parallel test binary, it failed without a reproducible cause; the first
/// failure's output is printed, and a second failure panics with its output.
async fn install_db(data: &std::path::Path) {
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

enum Shared {
    External(String),
    Private(MariaDb),
}

static SHARED: OnceCell<Shared> = OnceCell::const_new();

/// A fresh, empty MySQL database for one test: on the server `MYSQL_URL` names
/// (its path is replaced), or else on a private MariaDB started on first use.
pub async fn fresh_mysql_database() -> String {
    let shared = SHARED
        .get_or_init(|| async {
            match std::env::var("MYSQL_URL") {
                Ok(url) if !url.is_empty() => Shared::External(url),
                _ => Shared::Private(MariaDb::start().await),
            }
        })
        .await;
    match shared {
        Shared::External(url) => create_database_at(url, 0).await,
        Shared::Private(db) => db.create_database().await,
    }
}
