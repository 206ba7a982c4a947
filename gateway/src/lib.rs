//! Fenced page storage: pages over HTTP on PostgreSQL that refuse stale
//! fencing tokens, atomically, in the database, and that take tokens only from
//! known writers and only when their lock service says they are current.
//!
//! Per page the database remembers the highest fencing token seen (and the
//! lock service that issued it). A write or a fenced read with an older token
//! is answered 409 and changes nothing. The check, the write and the history
//! row are one SQL statement, so any number of gateways can share a database.
//!
//! Before that statement, two checks keep the fence honest:
//! - **Authentication**: a PUT, and any request carrying `Fencing-Token`,
//!   needs `Authorization: Bearer <key>`; the key's client is the writer the
//!   history records. Keys are kept as SHA-256 digests, compared in constant
//!   time. Plain reads stay public.
//! - **The issuer check** (Chubby's `CheckSequencer`): the gateway asks the
//!   lock service named by `Fencing-Issuer` ([`fencelock::HolderLookup`])
//!   whether the lock `page:<id>` is held right now by this client with
//!   exactly this token. A guessed, copied or future token is refused, so the
//!   fence only moves to tokens that were really granted.
//!
//! The page database belongs to the gateway: `gateway setup` ([`setup`]),
//! run once by the operator with the tables' owner's URL, applies the
//! migrations and grants each role exactly its rights; the serving gateway
//! only checks the schema ([`schema::check`]). A gateway with fencing off
//! runs statements that never write a page's fence, under a role the
//! database refuses it to.
//!
//! # Layout
//! - `lib.rs`: [`AppState`], [`app`], [`serve`], [`migrate`], [`connect`] and
//!   [`spawn`] / [`spawn_with_options`] (a whole gateway on a free port).
//! - [`config`]: [`Cli`] and [`Config`] (the binary's flags) and
//!   [`GatewayOptions`] (the same, in-process).
//! - [`setup`]: `gateway setup`, the operator's step (migrations, grants,
//!   lease tables). [`schema`]: the migrations and the serving gateway's
//!   check of them.
//! - [`trust`]: [`TrustOptions`] and [`Trust`]: what is checked, the start-up
//!   rules and warnings. [`auth`]: API keys and the bearer check.
//!   [`issuers`]: the lock services asked, connected in the background.
//!   [`page_issuers`]: which of them guards which page.
//! - [`secrets`]: the secrets file; URLs in messages and logs go through
//!   [`fencelock::redact_url`] and [`fencelock::scrub_secrets`].
//! - [`server`]: the accept loop (hyper, header-read timeout, connection cap,
//!   graceful shutdown).
//! - [`db`]: the connection pool requests use (tokio-postgres; one round trip
//!   per statement; liveness check after idling, maximum lifetime, TCP
//!   keepalive), and the multi-host `DATABASE_URL` that follows the primary.
//! - [`store`]: the SQL. `sql/fenced_access.sql` is the statement of the
//!   common case, `sql/fenced_access_locked.sql` and
//!   `sql/fenced_access_insert.sql` its fallbacks; `sql/unfenced_access.sql`
//!   and `sql/unfenced_access_insert.sql` the same with fencing off; each
//!   carries its safety argument in its header comment.
//! - [`http`]: the routes by resource (pages, history, admin, health), each
//!   with its `router()`; header and body validation ([`http::extractors`]);
//!   the issuer check (`http/issuer_check.rs`, with why check-then-write is
//!   safe); the request deadline (`http/deadline.rs`: `outcome_unknown` once
//!   a statement was sent); the description assembled from those routes.
//! - [`error`]: [`ApiError`], every rejection with its status and JSON body;
//!   `ErrorCode`, the one list of codes the description enumerates.
//! - [`openapi`]: how the routes' annotations become the OpenAPI 3.1
//!   description (`GET /openapi.json`), the error responses, and Swagger UI
//!   (`GET /docs/`).
//! - [`metrics`]: the Prometheus registry behind `GET /metrics`.
//! - [`dashboard`]: the live page at `/dashboard` and its event stream (the
//!   page, the stream, the gateway's one tail of the history).
//! - [`limits`]: the caps on connections and streams, overall and per
//!   client address.
//!
//! # HTTP API
//! - `GET /pages/{id}`: `{"id","body","version","fence"}` with `ETag: "<version>"`.
//!   Public. With `Fencing-Token` it is a fenced read: it raises the fence
//!   like a write, and is authenticated and checked with the issuer like one.
//! - `PUT /pages/{id}` with `{"body": "..."}`: 201 on create, 200 on update.
//! - Headers: `Authorization: Bearer <key>`, `Fencing-Token`, `Fencing-Issuer`
//!   (default `default`), `Client-Id` (optional; must be the key's client),
//!   `If-Match`.
//! - `POST /admin/pages/{id}/fence` with `Authorization: Bearer <admin key>`
//!   and `{"issuer": "<name>"|null, "token": N|null, "reason": "...",
//!   "force": bool}`: sets (or, both null, clears) the page's fence; 200
//!   `{"id","version","fence","previous_fence"}`. The issuer must be
//!   configured (409 `unknown_issuer`); a token above what it has minted for
//!   the page's lock (or when it cannot say) needs `"force": true` (409
//!   `force_required`). See docs/OPERATIONS.md.
//! - `GET /pages/{id}/history?limit=N&before=SEQ`: `{"id", "history": [{"seq","at","method",
//!   "outcome","token","issuer","client_id","version","fence_token"}]}`, newest
//!   first; `seq` increases in commit order. Outcomes: `accepted`, `stale`
//!   (accepted with fencing off although older than the fence), `stale_token`,
//!   `issuer_mismatch`, `no_issuer_for_page`, `version_mismatch`,
//!   `token_not_current` (refused by the issuer; nothing else written),
//!   `suspected_forgery` (the issuer named the token, which it cannot have
//!   minted in turn; nothing else written),
//!   `fence_set` (an admin's change: method `ADMIN`, client `admin:<name>`,
//!   with its `reason` and `force`). Requests refused before
//!   reaching a page (400, 401, 403, 413, 415, 428, 429, 409 `unknown_issuer`, 503)
//!   leave no history.
//! - `GET /pages?limit=N&after=ID`: `{"pages": [{"id","version","fence"}]}`,
//!   by id. It and the history come a page at a time (`limit` 1 to 1000,
//!   default 100), with `Link: <next>; rel="next"` while a page is full.
//! - `GET /healthz`, `GET /readyz`, `GET /metrics`: public.
//! - `GET /` (redirect), `GET /dashboard`, `GET /dashboard/events?page=ID`
//!   (server-sent events): public, like the history they show.
//! - `GET /openapi.json` (this API as OpenAPI 3.1: every route, header,
//!   status and error code), `GET /docs/` (Swagger UI): public.
//!
//! A request whose deadline (`--request-timeout`) passes before its
//! statement was sent is answered 504 `timeout` (nothing written). Once the
//! statement was sent it runs to its end whatever happens to the request;
//! the request waits `--outcome-wait` more for it and answers its result, or
//! else 504 `outcome_unknown` (the write may land: read before retrying).
//!
//! Rejections of the authentication and the issuer check: 401 `unauthorized` (with `WWW-Authenticate:
//! Bearer`), 403 `client_id_mismatch` (and `forbidden` on the admin endpoint),
//! 409 `unknown_issuer`, 409 `token_not_current`, 409 `suspected_forgery` (a
//! Redis token above the issuer's counter, or more than
//! `GATEWAY_MAX_TOKEN_JUMP` above the page's fence), 503 `issuer_unavailable`
//! (an issuer unreachable, erroring or slower than the issuer timeout: fail
//! closed).

pub mod auth;
pub mod config;
pub mod dashboard;
pub mod db;
pub mod error;
pub mod http;
pub mod issuers;
pub mod limits;
pub mod metrics;
pub mod openapi;
pub mod page_issuers;
pub mod proxy_protocol;
pub mod rate;
pub mod schema;
pub mod secrets;
pub mod server;
pub mod setup;
pub mod store;
pub mod trust;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use fencelock::{redact_url, scrub_secrets};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

pub use db::{Db, DbError, PoolOptions};
pub use http::Deadlines;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use auth::AuthMode;
pub use config::{Cli, Command, Config, GatewayOptions};
pub use error::ApiError;
pub use metrics::Metrics;
pub use server::{serve_with, ServeOptions};
pub use trust::{Trust, TrustOptions};

/// The binary's log filter when `RUST_LOG` is not set.
pub const DEFAULT_LOG_FILTER: &str = "gateway=info,tower_http=info";

/// Default for `--db-pool-size` and [`spawn`].
pub const DEFAULT_POOL_SIZE: u32 = 10;
/// Default size of the public reads' pool (`GATEWAY_DB_READ_POOL_SIZE`).
pub const DEFAULT_READ_POOL_SIZE: u32 = 4;

/// Whether the gateway checks the fence (refuses stale tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FenceCheck {
    /// Refuse stale tokens (409) and writes without a token (428).
    Enforce,
    /// Accept everything, but mark writes older than the fence `stale` in the
    /// history: the damage fencing would have stopped.
    Off,
}

/// Everything a handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The connections requests use (see [`db`]).
    pub db: Db,
    /// The public reads' connections (unfenced GETs, `/pages`, history, the
    /// dashboard): [`AppState::db`] itself unless a pool of their own is
    /// set ([`AppState::with_read_pool`]), which a flood of readers then
    /// cannot take from the writers.
    pub reads: Db,
    pub fencing: FenceCheck,
    pub metrics: Arc<Metrics>,
    /// Cancelled when [`serve`] starts draining: responses that never end by
    /// themselves (the dashboard's event streams) end then, so that the drain
    /// does not wait for them.
    pub draining: CancellationToken,
    /// Keys and issuers.
    pub trust: Arc<Trust>,
    /// The request deadline, and the wait for a statement already sent.
    pub deadlines: Deadlines,
    /// The dashboard's one tail of the history, shared by its streams.
    pub hub: Arc<dashboard::Hub>,
    /// How many dashboard streams may be open ([`AppState::with_limits`]).
    pub streams: limits::StreamLimits,
    /// Each client's rate of fenced requests (none by default).
    pub write_rate: rate::WriteRate,
}

impl AppState {
    /// No authentication, no issuer checks ([`Trust::off`]), default
    /// deadlines; see [`AppState::with_trust`]. Make `db` with [`Db::new`]
    /// (or [`connect_db`]); migrations run on an sqlx pool ([`migrate`]).
    pub fn new(db: Db, fencing: FenceCheck) -> Self {
        Self::with_trust(db, fencing, Trust::off())
    }

    /// With keys and issuers (from [`Trust::start`]).
    pub fn with_trust(db: Db, fencing: FenceCheck, trust: Trust) -> Self {
        Self {
            hub: dashboard::Hub::new(db.clone()),
            reads: db.clone(),
            db,
            fencing,
            metrics: Arc::new(Metrics::new()),
            draining: CancellationToken::new(),
            trust: Arc::new(trust),
            deadlines: Deadlines::default(),
            streams: limits::StreamLimits::default(),
            write_rate: rate::WriteRate::default(),
        }
    }

    /// With a pool of its own for the public reads (without one, they share
    /// the request pool).
    pub fn with_read_pool(mut self, reads: Db) -> Self {
        self.hub = dashboard::Hub::new(reads.clone());
        self.reads = reads;
        self
    }

    /// With the stream limits of `options` (the connection limits are the
    /// accept loop's, [`serve_with`]).
    pub fn with_limits(mut self, options: &ServeOptions) -> Self {
        self.streams =
            limits::StreamLimits::new(options.max_streams, options.max_streams_per_address);
        self
    }

    /// With a rate per client for fenced requests.
    pub fn with_write_rate(mut self, rate: rate::WriteRate) -> Self {
        self.write_rate = rate;
        self
    }

    /// With other deadlines than the defaults.
    pub fn with_deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    /// The same state, with a request pool (same [`PoolOptions`]) on
    /// `database_url`. [`Db::new`] already follows the primary when its URL
    /// names several hosts with `target_session_attrs=read-write` (see
    /// [`db`]); this is for a state whose pool was made for another URL.
    pub fn following(mut self, database_url: &str) -> anyhow::Result<Self> {
        self.db = request_pool(database_url, *self.db.options())?;
        let reads = request_pool(database_url, *self.reads.options())?;
        Ok(self.with_read_pool(reads))
    }
}

/// The router with all its layers, ready to serve or to drive in tests.
pub fn app(state: AppState) -> Router {
    http::router(state)
}

/// Apply the migrations in `migrations/postgres` (idempotent; safe to run from
/// several processes at once, sqlx takes an advisory lock): needs the
/// tables' owner, as `gateway setup` runs it ([`schema::migrate`]).
pub async fn migrate(db: &PgPool) -> anyhow::Result<()> {
    schema::migrate(db).await
}

/// The request pool for `database_url` with `max_connections` and the
/// default checks ([`PoolOptions::default`]). Opens nothing yet.
pub fn connect_db(database_url: &str, max_connections: u32) -> anyhow::Result<Db> {
    request_pool(
        database_url,
        PoolOptions {
            max_connections,
            ..PoolOptions::default()
        },
    )
}

/// The request pool ([`Db::new`]); its error names the URL without its
/// secrets.
pub fn request_pool(database_url: &str, options: PoolOptions) -> anyhow::Result<Db> {
    Db::new(database_url, options).map_err(|e| {
        anyhow::anyhow!(
            "database URL {}: {}",
            redact_url(database_url),
            scrub_secrets(&e.to_string(), database_url)
        )
    })
}

/// An sqlx pool, for [`migrate`] (requests use [`Db`]): fails fast (2 s to
/// get a connection).
pub fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(2))
        .test_before_acquire(false)
}

/// Connect an sqlx pool once (no retry), for [`migrate`] and the schema
/// check. With several hosts (see [`db`]), to the one that accepts writes
/// now. Errors name the URL without its secrets.
pub async fn connect(database_url: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    let connected = async {
        let target = request_pool(database_url, PoolOptions::default())?
            .writable_target()
            .await?;
        Ok::<_, anyhow::Error>(pool_options(max_connections).connect_with(target).await?)
    };
    connected.await.map_err(|e| {
        anyhow::anyhow!(
            "connect to {}: {}",
            redact_url(database_url),
            scrub_secrets(&format!("{e:#}"), database_url)
        )
    })
}

/// [`connect`], retried with a growing pause while the database is not up,
/// for `patience` in all (compose may start us first).
pub async fn connect_patiently(database_url: &str, patience: Duration) -> anyhow::Result<PgPool> {
    let start = std::time::Instant::now();
    let mut delay = Duration::from_millis(250);
    loop {
        match connect(database_url, 1).await {
            Ok(db) => return Ok(db),
            Err(e) if start.elapsed() < patience => {
                tracing::warn!(error = %format!("{e:#}"), retry_in = ?delay, "database not reachable yet");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) if patience.is_zero() => return Err(e),
            Err(e) => return Err(e.context(format!("gave up after {patience:?}"))),
        }
    }
}

/// The serving gateway's start: the schema must be this version's (read
/// only: its role cannot migrate; `gateway setup` does).
pub async fn check_schema(database_url: &str, patience: Duration) -> anyhow::Result<()> {
    let db = connect_patiently(database_url, patience).await?;
    let checked = schema::check(&db).await;
    db.close().await;
    checked.map_err(|e| anyhow::anyhow!("{}", scrub_secrets(&e.to_string(), database_url)))
}

/// Serve until `shutdown` completes, then drain in-flight requests; with the
/// default connection limits ([`ServeOptions::default`]; see [`serve_with`]).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, state, ServeOptions::default(), shutdown).await
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
/// for tests and benchmarks, on a database whose URL may migrate it (a
/// superuser's or the owner's). Authentication off and no issuer checks (the
/// gateway without authentication); see [`spawn_with_options`] for keys and
/// issuers, and for a gateway on its own role ([`GatewayOptions::migrate`]).
pub async fn spawn(database_url: &str, fencing: FenceCheck) -> anyhow::Result<RunningGateway> {
    spawn_with_options(database_url, GatewayOptions::new(fencing)).await
}

/// [`spawn`] with a chosen pool size.
pub async fn spawn_with(
    database_url: &str,
    fencing: FenceCheck,
    pool_size: u32,
) -> anyhow::Result<RunningGateway> {
    spawn_with_options(
        database_url,
        GatewayOptions::new(fencing).pool_size(pool_size),
    )
    .await
}

/// A whole gateway with keys, issuers and limits, on 127.0.0.1 and a free
/// port. Fails like the binary on a bad configuration (no key while
/// authentication is required, a malformed key or issuer, a page issuer not
/// configured). Issuers are connected in the background: one that is down
/// answers 503 until it is up. Migrates first with `database_url` unless
/// [`GatewayOptions::migrate`] is off; then it checks the schema, as the
/// binary does.
pub async fn spawn_with_options(
    database_url: &str,
    options: GatewayOptions,
) -> anyhow::Result<RunningGateway> {
    let trust =
        Trust::start(options.checked_trust()?, options.fencing).map_err(anyhow::Error::msg)?;
    if options.migrate {
        // sqlx runs the migrations on a connection of its own, then goes.
        let migrations = connect(database_url, 1).await?;
        let migrated = migrate(&migrations).await;
        migrations.close().await;
        migrated?;
    } else {
        check_schema(database_url, Duration::ZERO).await?;
    }
    let db = request_pool(database_url, options.pool_options_resolved())?;
    let reads = match options.read_pool_size {
        0 => db.clone(),
        _ => request_pool(database_url, options.read_pool_options_resolved())?,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.context("bind")?;
    let addr = listener.local_addr()?;
    // Db::new follows the primary of a multi-host URL itself.
    let state = AppState::with_trust(db, options.fencing, trust)
        .with_read_pool(reads)
        .with_deadlines(options.deadlines)
        .with_limits(&options.serve)
        .with_write_rate(rate::WriteRate::new(
            options.write_rate.0,
            options.write_rate.1,
        ));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_with(listener, state.clone(), options.serve, async {
        let _ = stopped.await;
    }));
    Ok(RunningGateway {
        addr,
        state,
        stop: Some(stop),
        task: Some(task),
    })
}
