//! A private PostgreSQL 15 from Debian's `postgresql` package.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tempfile::TempDir;
use tokio::sync::OnceCell;

use crate::process::{find_binary, free_port, wait_until, Recipe, ServiceProcess};

pub(crate) const PG_BIN: &[&str] = &["/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin"];

/// A PostgreSQL server on a free port, its data in a temp dir. Killed on drop.
pub struct Postgres {
    process: ServiceProcess,
    port: u16,
    _dir: TempDir,
}

impl Postgres {
    /// initdb, start, and wait until it answers queries.
    pub async fn start() -> Self {
        let (uid, gid) = postgres_user();
        let dir = tempfile::Builder::new()
            .prefix("harness-pg-")
            .tempdir_in(crate::process::scratch_dir())
            .expect("temp dir");
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown pg dir");
        let data = dir.path().join("data");
        initdb(&data).await;
        let port = free_port();
        let recipe = server_recipe(&data, port, dir.path(), &[]);
        let process = ServiceProcess::spawn("postgres", recipe).expect("spawn postgres");
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

    /// URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Create a new, empty database and return its URL.
    pub async fn create_database(&self) -> String {
        create_database_at(&self.url("postgres")).await
    }

    pub fn process(&mut self) -> &mut ServiceProcess {
        &mut self.process
    }

    /// Crash: SIGKILL to every PostgreSQL process. Recovery runs at the next start.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Clean stop (SIGTERM is PostgreSQL's "smart" shutdown; SIGINT would be "fast").
    pub async fn stop(&mut self) {
        self.process.signal(nix::sys::signal::Signal::SIGINT);
        self.process.stop(Duration::from_secs(10)).await;
    }

    /// Start again on the same port and data directory, and wait until ready.
    pub async fn start_again(&mut self) {
        self.process.start().expect("restart postgres");
        self.wait_ready().await;
    }

    async fn wait_ready(&mut self) {
        let url = self.url("postgres");
        let ready = wait_until(Duration::from_secs(30), || async {
            let mut conn = PgConnection::connect(&url).await?;
            sqlx::query("select 1").execute(&mut conn).await?;
            conn.close().await
        })
        .await;
        if let Err(e) = ready {
            panic!(
                "postgres did not become ready on port {}: {e}\n--- log ---\n{}",
                self.port,
                self.process.log_tail(40)
            );
        }
    }
}

/// `initdb` into `data` (its parent must be writable by the `postgres` user).
pub(crate) async fn initdb(data: &Path) {
    let (uid, gid) = postgres_user();
    let out = tokio::process::Command::new(find_binary("initdb", PG_BIN))
        .args([
            "-D",
            data.to_str().expect("utf-8 path"),
            "-A",
            "trust",
            "-U",
            "postgres",
        ])
        .args(["--no-sync", "-E", "UTF8", "--locale", "C"])
        .uid(uid)
        .gid(gid)
        .current_dir(data.parent().expect("data dir has a parent"))
        .output()
        .await
        .expect("run initdb");
    assert!(
        out.status.success(),
        "initdb failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How to run `postgres` on `data` and `port`, its log and socket in `dir`,
/// with `extra` settings (`name=value`) after the common ones.
pub(crate) fn server_recipe(data: &Path, port: u16, dir: &Path, extra: &[String]) -> Recipe {
    let mut args: Vec<String> = vec![
        "-D".into(),
        data.to_string_lossy().into_owned(),
        "-p".into(),
        port.to_string(),
        "-k".into(),
        dir.to_string_lossy().into_owned(),
        "-c".into(),
        "listen_addresses=127.0.0.1".into(),
        "-c".into(),
        "max_connections=300".into(),
        // Tests never survive an OS crash, so skip the fsyncs; a killed
        // postmaster still loses nothing that was committed.
        "-c".into(),
        "fsync=off".into(),
        "-c".into(),
        "full_page_writes=off".into(),
    ];
    for setting in extra {
        args.push("-c".into());
        args.push(setting.clone());
    }
    Recipe {
        program: find_binary("postgres", PG_BIN),
        args,
        env: vec![],
        user: Some(postgres_user()),
        log: dir.join("postgres.log"),
    }
}

pub(crate) async fn create_database_at(admin_url: &str) -> String {
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let mut conn = PgConnection::connect(admin_url)
        .await
        .unwrap_or_else(|e| panic!("connect to {admin_url}: {e}"));
    sqlx::query(&format!("create database {name}"))
        .execute(&mut conn)
        .await
        .expect("create database");
    let _ = conn.close().await;
    replace_database(admin_url, &name)
}

pub(crate) fn replace_database(url: &str, db: &str) -> String {
    // postgres://user@host:port/db?params -> same with another db
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

/// The server shared by the tests of one test binary: the one `DATABASE_URL`
/// names, or else a private one started on first use.
enum Shared {
    External(String),
    Private(Postgres),
}

static SHARED: OnceCell<Shared> = OnceCell::const_new();

/// A fresh, empty database for one test, on the shared server. Returns its URL.
pub async fn fresh_database() -> String {
    let shared = SHARED
        .get_or_init(|| async {
            match std::env::var("DATABASE_URL") {
                Ok(url) if !url.is_empty() => Shared::External(url),
                _ => Shared::Private(Postgres::start().await),
            }
        })
        .await;
    match shared {
        Shared::External(url) => create_database_at(url).await,
        Shared::Private(pg) => pg.create_database().await,
    }
}

pub(crate) fn postgres_user() -> (u32, u32) {
    let user = nix::unistd::User::from_name("postgres")
        .expect("look up user postgres")
        .expect("user `postgres` missing: install Debian's postgresql package");
    (user.uid.as_raw(), user.gid.as_raw())
}

/// Where pgbench lives.
pub fn pgbench() -> PathBuf {
    find_binary("pgbench", PG_BIN)
}

#[cfg(test)]
mod tests {
    use super::replace_database;

    #[test]
    fn database_name_is_replaced() {
        assert_eq!(
            replace_database("postgres://u@h:1/postgres", "x"),
            "postgres://u@h:1/x"
        );
        assert_eq!(
            replace_database("postgres://u@h:1/postgres?sslmode=disable", "x"),
            "postgres://u@h:1/x?sslmode=disable"
        );
        assert_eq!(
            replace_database("postgres://u@h:1", "x"),
            "postgres://u@h:1/x"
        );
    }
}
