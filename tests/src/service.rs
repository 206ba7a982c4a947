//! The lifecycle every single-server service shares, written once.
//!
//! A [`Service`] says only what is its own: how its files are laid out and
//! how it is run on a port ([`Service::prepare`]), and when it is ready for a
//! client ([`Service::probe`]). [`Server`] does the rest for each of them:
//! a free port, a temp dir, the bounded wait for readiness with the log in
//! the panic message, kill, start again, stop, pause and resume, and the kill
//! and reap on drop. [`Database`] adds what the SQL servers share: URLs and a
//! fresh database per test, on the server of the test binary.
//!
//! Groups of servers (a ZooKeeper ensemble, a Sentinel group, a replicated
//! PostgreSQL) are not one `Server`, but wait and report with the same
//! helpers: [`ready_or_panic`] and [`logs`].

use std::fmt::Display;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use sqlx::{Connection, Executor};
use tempfile::TempDir;
use tokio::sync::OnceCell;

use crate::process::{free_port, temp_dir, wait_until, Recipe, ServiceProcess};

/// What one kind of server knows about itself.
pub trait Service: Sized + Send + Sync + 'static {
    /// Names its process, its temp dir and its messages.
    const NAME: &'static str;
    /// How long it may take to be ready after a start.
    const READY_WITHIN: Duration;
    /// The signal of a clean stop; SIGKILL follows after [`Service::STOP_GRACE`].
    const STOP_SIGNAL: Signal = Signal::SIGTERM;
    /// How long a clean stop may take.
    const STOP_GRACE: Duration = Duration::from_secs(10);

    /// Lay out the server's files in `dir` (a data dir, a config file) and
    /// say how to run it on `port`.
    fn prepare(&self, dir: &Path, port: u16) -> impl Future<Output = Recipe> + Send;

    /// One readiness check of the server on `port`: `Ok` once it serves
    /// clients, not merely once it listens.
    fn probe(&self, port: u16) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// A running server of kind `S` on a free port, its files in a temp dir.
/// Killed and reaped on drop.
pub struct Server<S: Service> {
    service: S,
    process: ServiceProcess,
    port: u16,
    dir: TempDir,
}

impl<S: Service + Default> Server<S> {
    /// Start a server of the default kind on a free port; it is ready.
    pub async fn start() -> Self {
        Self::launch(S::default()).await
    }
}

impl<S: Service> Server<S> {
    /// Prepare and start `service` on a free port and wait until it is ready.
    pub async fn launch(service: S) -> Self {
        Self::launch_on(service, free_port()).await
    }

    /// [`Server::launch`] on a chosen port.
    pub async fn launch_on(service: S, port: u16) -> Self {
        let dir = temp_dir(S::NAME);
        let recipe = service.prepare(dir.path(), port).await;
        let process = ServiceProcess::spawn(S::NAME, recipe)
            .unwrap_or_else(|e| panic!("spawn {}: {e}", S::NAME));
        let me = Self {
            service,
            process,
            port,
            dir,
        };
        me.wait_ready().await;
        me
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// What this server was started as.
    pub fn service(&self) -> &S {
        &self.service
    }

    /// The temp dir with its files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn process(&mut self) -> &mut ServiceProcess {
        &mut self.process
    }

    /// Crash: SIGKILL to every process of the server. Nothing is flushed.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Start again on the same port and files, and wait until ready.
    pub async fn start_again(&mut self) {
        self.process
            .start()
            .unwrap_or_else(|e| panic!("restart {}: {e}", S::NAME));
        self.wait_ready().await;
    }

    /// Kill and start again at once.
    pub async fn restart(&mut self) {
        self.kill();
        self.start_again().await;
    }

    /// Clean stop: [`Service::STOP_SIGNAL`], then SIGTERM and SIGKILL if it
    /// takes longer than [`Service::STOP_GRACE`].
    pub async fn stop(&mut self) {
        self.process.signal(S::STOP_SIGNAL);
        self.process.stop(S::STOP_GRACE).await;
    }

    /// SIGSTOP: it keeps its sockets and answers nothing.
    pub fn pause(&mut self) {
        self.process.pause();
    }

    pub fn resume(&mut self) {
        self.process.resume();
    }

    async fn wait_ready(&self) {
        let what = format!("{} on port {}", S::NAME, self.port);
        ready_or_panic(
            &what,
            S::READY_WITHIN,
            || self.service.probe(self.port),
            || logs([&self.process], 40),
        )
        .await;
    }
}

/// Wait until `probe` succeeds, for at most `within`; its value. Otherwise
/// panic with `what`, the last error, and `logs()` (the servers' logs).
pub async fn ready_or_panic<F, Fut, T, E>(
    what: &str,
    within: Duration,
    probe: F,
    logs: impl FnOnce() -> String,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Display,
{
    match wait_until(within, probe).await {
        Ok(v) => v,
        Err(e) => panic!("{what}: not ready after {within:?}: {e}\n{}", logs()),
    }
}

/// The last `n` lines of each process's log, each under its name.
pub fn logs<'a>(processes: impl IntoIterator<Item = &'a ServiceProcess>, n: usize) -> String {
    processes
        .into_iter()
        .map(|p| format!("--- {} log ---\n{}", p.name(), p.log_tail(n)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One server of a group (an ensemble's server, a sentinel, a replica) and
/// the port its clients reach it on.
pub(crate) struct Member {
    pub process: ServiceProcess,
    pub port: u16,
}

/// A SQL server: it holds databases, and hands out a fresh one per test.
pub trait Database: Service {
    /// sqlx's connection to it.
    type Connection: Connection;
    /// The database every server has, where others are created from.
    const ADMIN_DB: &'static str;
    /// The variable that names a server to use instead of a private one.
    const URL_VAR: &'static str;
    /// Its URLs' scheme and user (no password: the servers trust 127.0.0.1).
    const SCHEME_AND_USER: &'static str;

    /// The URL of database `db` on the server on `port`.
    fn url_at(port: u16, db: &str) -> String {
        format!("{}@127.0.0.1:{port}/{db}", Self::SCHEME_AND_USER)
    }
}

impl<S: Database> Server<S>
where
    for<'c> &'c mut S::Connection: Executor<'c, Database = <S::Connection as Connection>::Database>,
{
    /// URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        S::url_at(self.port, db)
    }

    /// Create a new, empty database and return its URL.
    pub async fn create_database(&self) -> String {
        create_database_at::<S::Connection>(&self.url(S::ADMIN_DB)).await
    }
}

/// [`sql_ping`] the admin database of the `S` server on `port`.
pub async fn sql_ping_at<S>(port: u16) -> anyhow::Result<()>
where
    S: Database,
    for<'c> &'c mut S::Connection: Executor<'c, Database = <S::Connection as Connection>::Database>,
{
    sql_ping::<S::Connection>(&S::url_at(port, S::ADMIN_DB)).await
}

/// Connect to `url`, run `select 1`, disconnect: the server serves queries.
pub async fn sql_ping<C>(url: &str) -> anyhow::Result<()>
where
    C: Connection,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
{
    let mut conn = C::connect(url).await?;
    conn.execute("select 1").await?;
    conn.close().await?;
    Ok(())
}

/// Create database `t_<uuid>` on the server `admin_url` names; its name.
pub async fn create_database_named<C>(admin_url: &str) -> String
where
    C: Connection,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
{
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let mut conn = C::connect(admin_url)
        .await
        .unwrap_or_else(|e| panic!("connect to {admin_url}: {e}"));
    conn.execute(format!("create database {name}").as_str())
        .await
        .unwrap_or_else(|e| panic!("create database {name}: {e}"));
    let _ = conn.close().await;
    name
}

/// Create a new, empty database beside `admin_url`'s and return its URL.
pub async fn create_database_at<C>(admin_url: &str) -> String
where
    C: Connection,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
{
    let name = create_database_named::<C>(admin_url).await;
    replace_database(admin_url, &name)
}

/// `url` with its database (the path) replaced by `db`, query kept.
pub(crate) fn replace_database(url: &str, db: &str) -> String {
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

/// The SQL server shared by the tests of one test binary: the one
/// [`Database::URL_VAR`] names, or a private one started on first use.
pub(crate) enum Shared<S: Service> {
    External(String),
    Private(Server<S>),
}

/// A fresh, empty database for one test on the server `shared` holds
/// (started from `service` on first use); its URL.
pub(crate) async fn fresh_database_in<S>(shared: &'static OnceCell<Shared<S>>, service: S) -> String
where
    S: Database,
    for<'c> &'c mut S::Connection: Executor<'c, Database = <S::Connection as Connection>::Database>,
{
    let shared = shared
        .get_or_init(|| async {
            match std::env::var(S::URL_VAR) {
                Ok(url) if !url.is_empty() => Shared::External(url),
                _ => Shared::Private(Server::launch(service).await),
            }
        })
        .await;
    match shared {
        Shared::External(url) => create_database_at::<S::Connection>(url).await,
        Shared::Private(server) => server.create_database().await,
    }
}

/// Run `statements` one after the other on one connection to `url`;
/// panics naming the one that failed.
pub(crate) async fn execute_all<C>(url: &str, statements: &[String])
where
    C: Connection,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
{
    let mut conn = C::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    for statement in statements {
        conn.execute(statement.as_str())
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let _ = conn.close().await;
}

/// `url` with its user and password replaced by `user` and `password`.
pub fn login_url(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}:{password}@{host}")
}

#[cfg(test)]
mod tests {
    use super::{login_url, replace_database};

    #[test]
    fn the_login_is_replaced() {
        assert_eq!(
            login_url("postgres://postgres@h:1/db", "w", "pw"),
            "postgres://w:pw@h:1/db"
        );
        assert_eq!(
            login_url("mysql://root:x@127.0.0.1:3306/t_1", "w", "pw"),
            "mysql://w:pw@127.0.0.1:3306/t_1"
        );
    }

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
        assert_eq!(
            replace_database("mysql://root@127.0.0.1:3306/mysql", "t_1"),
            "mysql://root@127.0.0.1:3306/t_1"
        );
    }
}
