//! A private PostgreSQL 15 from Debian's `postgresql` package.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use sqlx::PgConnection;
use tokio::sync::OnceCell;

use crate::process::{find_binary, Recipe};
use crate::service::{
    execute_all, fresh_database_in, login_url, sql_ping_at, Database, Server, Service, Shared,
};

pub(crate) const PG_BIN: &[&str] = &["/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin"];

/// A PostgreSQL server: what is its own (initdb as the `postgres` user,
/// its settings, `select 1` as readiness). The rest is [`Server`]'s.
#[derive(Debug, Clone, Copy, Default)]
pub struct PostgresService;

/// A PostgreSQL server on a free port, its data in a temp dir. Killed on drop.
pub type Postgres = Server<PostgresService>;

impl Service for PostgresService {
    const NAME: &'static str = "postgres";
    const READY_WITHIN: Duration = Duration::from_secs(30);
    /// SIGINT is PostgreSQL's "fast" shutdown (SIGTERM would be "smart",
    /// waiting for every client to leave).
    const STOP_SIGNAL: Signal = Signal::SIGINT;

    async fn prepare(&self, dir: &Path, port: u16) -> Recipe {
        let (uid, gid) = postgres_user();
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).expect("chown pg dir");
        let data = dir.join("data");
        initdb(&data).await;
        server_recipe(&data, port, dir, &[])
    }

    async fn probe(&self, port: u16) -> anyhow::Result<()> {
        sql_ping_at::<Self>(port).await
    }
}

impl Database for PostgresService {
    type Connection = PgConnection;
    const ADMIN_DB: &'static str = "postgres";
    const URL_VAR: &'static str = "DATABASE_URL";
    const SCHEME_AND_USER: &'static str = "postgres://postgres";
}

/// `initdb` into `data` (its parent must be writable by the `postgres` user).
pub(crate) async fn initdb(data: &Path) {
    let mut args = vec!["-D".into(), data.as_os_str().to_owned()];
    args.extend(["-A", "trust", "-U", "postgres", "--no-sync"].map(Into::into));
    args.extend(["-E", "UTF8", "--locale", "C"].map(Into::into));
    run_tool("initdb", &args, data, String::new).await;
}

/// Run PostgreSQL's `tool` with `args` as the `postgres` user, in the dir
/// above `data`. Panics with its output, and `context()`, when it fails.
pub(crate) async fn run_tool(
    tool: &str,
    args: &[OsString],
    data: &Path,
    context: impl FnOnce() -> String,
) {
    let (uid, gid) = postgres_user();
    let out = tokio::process::Command::new(find_binary(tool, PG_BIN))
        .args(args)
        .uid(uid)
        .gid(gid)
        .current_dir(data.parent().expect("data dir has a parent"))
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {tool}: {e}"));
    assert!(
        out.status.success(),
        "{tool} failed: {}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        context()
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

static SHARED: OnceCell<Shared<PostgresService>> = OnceCell::const_new();

/// A fresh, empty database for one test, on the server `DATABASE_URL` names
/// or else on a private one started on first use. Returns its URL.
pub async fn fresh_database() -> String {
    fresh_database_in(&SHARED, PostgresService).await
}

/// Role `name` on the server of `url` (a superuser's), created if missing:
/// a login (password `name`) unless `login` is false (a group), member of
/// `groups`. Roles belong to the whole server, so tests name theirs after
/// their database. The URL of `url`'s database as that role.
pub async fn create_role(url: &str, name: &str, login: bool, groups: &[&str]) -> String {
    let login_clause = if login {
        format!("login password '{name}'")
    } else {
        "nologin".into()
    };
    let mut statements = vec![format!(
        "do $$ begin create role \"{name}\" {login_clause}; \
         exception when duplicate_object then null; end $$"
    )];
    statements.extend(
        groups
            .iter()
            .map(|g| format!("grant \"{g}\" to \"{name}\"")),
    );
    execute_all::<PgConnection>(url, &statements).await;
    login_url(url, name, name)
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
