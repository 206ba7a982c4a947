//! Fenced page storage: pages over HTTP on PostgreSQL that refuse stale
//! fencing tokens, atomically, in the database.
//!
//! Per page the database remembers the highest fencing token seen (and the
//! lock service that issued it). A write or a fenced read with an older token
//! is answered 409 and changes nothing. The check, the write and the history
//! row are one SQL statement, so any number of gateways can share a database.
//!
//! # Layout
//! - `lib.rs`: [`Config`], [`AppState`], [`app`], [`serve`], [`migrate`],
//!   [`connect`] and [`spawn`] (a whole gateway on a free port, for tests).
//! - [`db`]: the connection pool requests use (one round trip per request),
//!   and the multi-host `DATABASE_URL` that follows the primary.
//! - [`store`]: the SQL. `sql/fenced_access.sql` is the one statement that
//!   carries the safety argument; read its header comment.
//! - [`http`]: routes, header and body validation, responses.
//! - [`error`]: [`ApiError`], every rejection with its status and JSON body.
//! - [`metrics`]: the Prometheus registry behind `GET /metrics`.
//!
//! # HTTP API
//! - `GET /pages/{id}`: `{"id","body","version","fence"}` with `ETag: "<version>"`.
//!   With `Fencing-Token` it is a fenced read: it raises the fence like a write.
//! - `PUT /pages/{id}` with `{"body": "..."}`: 201 on create, 200 on update.
//! - Headers: `Fencing-Token`, `Fencing-Issuer` (default `default`), `Client-Id`, `If-Match`.
//! - `GET /pages/{id}/history?limit=N`: `{"id", "history": [{"seq","at","method",
//!   "outcome","token","issuer","client_id","version","fence_token"}]}`, newest
//!   first; `seq` increases in commit order. Outcomes: `accepted`, `stale`
//!   (accepted with fencing off although older than the fence), `stale_token`,
//!   `issuer_mismatch`, `version_mismatch`. Requests refused before reaching a
//!   page (400, 413, 415, 428) leave no history.
//! - `GET /pages`, `GET /healthz`, `GET /readyz`, `GET /metrics`.

pub mod db;
pub mod error;
pub mod http;
pub mod metrics;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use error::ApiError;
pub use metrics::Metrics;

/// Default for `--db-pool-size` and [`spawn`].
pub const DEFAULT_POOL_SIZE: u32 = 10;

/// Whether the gateway checks the fence (refuses stale tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FenceCheck {
    /// Refuse stale tokens (409) and writes without a token (428).
    Enforce,
    /// Accept everything, but mark writes older than the fence `stale` in the
    /// history: the damage fencing would have stopped.
    Off,
}

/// The gateway's configuration: flags, with environment fallbacks.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "gateway",
    about = "Page storage over HTTP that rejects stale fencing tokens"
)]
pub struct Config {
    /// PostgreSQL URL, e.g. postgres://postgres@127.0.0.1:5432/pages; with a
    /// standby: postgres://postgres@db1:5432,db2:5432/pages?target_session_attrs=read-write
    /// (requests go to whichever server accepts writes).
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// Address to listen on.
    #[arg(long, env = "GATEWAY_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// `enforce` refuses stale tokens; `off` accepts them and marks them stale in the history.
    #[arg(long, env = "GATEWAY_FENCING", value_enum, default_value = "enforce")]
    pub fencing: FenceCheck,
    /// Maximum PostgreSQL connections (a few per core is where PostgreSQL
    /// is fastest; HTTP connections are multiplexed onto them).
    #[arg(long, env = "GATEWAY_DB_POOL_SIZE", default_value_t = DEFAULT_POOL_SIZE)]
    pub db_pool_size: u32,
}

/// Everything a handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Connections for requests, opened like `pool`'s and as many.
    pub db: db::Db,
    /// The sqlx pool it was made from (migrations, shutdown).
    pub pool: PgPool,
    pub fencing: FenceCheck,
    pub metrics: Arc<Metrics>,
}

impl AppState {
    /// Requests use their own connections (see [`db`]), with `pool`'s
    /// connect options and size.
    pub fn new(pool: PgPool, fencing: FenceCheck) -> Self {
        Self {
            db: db::Db::like(&pool),
            pool,
            fencing,
            metrics: Arc::new(Metrics::new()),
        }
    }

    /// [`AppState::new`], with request connections that go wherever
    /// `database_url` says: with several hosts and
    /// `target_session_attrs=read-write`, to whichever accepts writes, so
    /// requests follow a failover to the promoted standby (see [`db`]).
    pub fn for_url(pool: PgPool, database_url: &str, fencing: FenceCheck) -> anyhow::Result<Self> {
        let max = pool.options().get_max_connections();
        let mut state = Self::new(pool, fencing);
        state.db = db::Db::from_url(database_url, max)
            .with_context(|| format!("database URL {}", redact(database_url)))?;
        Ok(state)
    }
}

/// The router with all its layers, ready to serve or to drive in tests.
pub fn app(state: AppState) -> Router {
    http::router(state)
}

/// Apply the migrations in `migrations/postgres` (idempotent; safe to run from
/// several processes at once, sqlx takes an advisory lock).
pub async fn migrate(db: &PgPool) -> anyhow::Result<()> {
    sqlx::migrate!("../migrations/postgres")
        .run(db)
        .await
        .context("run migrations")
}

/// The sqlx pool behind [`AppState`]: fails fast (2 s to get a connection).
/// Requests go through [`db::Db`] instead, which avoids sqlx's ping on release.
pub fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(2))
        .test_before_acquire(false)
}

/// Connect once (no retry). With several hosts (see [`db`]), to the one that
/// accepts writes now.
pub async fn connect(database_url: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    let target = db::Db::from_url(database_url, 1)
        .with_context(|| format!("database URL {}", redact(database_url)))?
        .writable_target()
        .await
        .with_context(|| format!("connect to {}", redact(database_url)))?;
    pool_options(max_connections)
        .connect_with(target)
        .await
        .with_context(|| format!("connect to {}", redact(database_url)))
}

/// The URL without its password, for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Serve until `shutdown` completes, then drain in-flight requests.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// A gateway serving in a tokio task of this process. Aborted on drop.
pub struct RunningGateway {
    addr: SocketAddr,
    state: AppState,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl RunningGateway {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Stop accepting, finish in-flight requests, close the pool.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.context("gateway task")?.context("serve")?;
        }
        self.state.db.close();
        self.state.pool.close().await;
        Ok(())
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Connect, migrate, bind 127.0.0.1:0 and serve in a task: a whole gateway
/// for tests and benchmarks.
pub async fn spawn(database_url: &str, fencing: FenceCheck) -> anyhow::Result<RunningGateway> {
    spawn_with(database_url, fencing, DEFAULT_POOL_SIZE).await
}

/// [`spawn`] with a chosen pool size.
pub async fn spawn_with(
    database_url: &str,
    fencing: FenceCheck,
    pool_size: u32,
) -> anyhow::Result<RunningGateway> {
    let db = connect(database_url, pool_size).await?;
    migrate(&db).await?;
    let listener = TcpListener::bind("127.0.0.1:0").await.context("bind")?;
    let addr = listener.local_addr()?;
    let state = AppState::for_url(db, database_url, fencing)?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, state.clone(), async {
        let _ = stopped.await;
    }));
    Ok(RunningGateway {
        addr,
        state,
        stop: Some(stop),
        task: Some(task),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            super::redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(super::redact("postgres://u@h/db"), "postgres://u@h/db");
    }
}
