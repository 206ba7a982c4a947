//! The accept loop: HTTP/1 connections served by hyper, with a header-read
//! timeout, caps on concurrent connections overall and per client address,
//! and a graceful shutdown.
//!
//! Why not `axum::serve`: it gives hyper no timer, so hyper's header-read
//! timeout is off, and it accepts every connection it can. A client that
//! sends half a request line and stops (slowloris) would hold its connection,
//! a task and a file descriptor forever, and enough of them would exhaust the
//! process's descriptors. Here:
//! - hyper's `header_read_timeout` (with a tokio timer) closes a connection
//!   whose request head has not arrived within the timeout. It also bounds
//!   how long an idle keep-alive connection waits for its next request.
//! - the accept loop bounds the connections being served, overall and from
//!   one address ([`crate::limits`]). A connection beyond a cap is accepted
//!   and answered at once, 503 `too_many_connections` with `Retry-After`,
//!   then closed; beyond [`REFUSING`] such answers in flight it is closed
//!   without one. It never waits in the listen backlog, where a client
//!   could not tell a full gateway from a dead one.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::error::ApiError;
use crate::limits::{self, ClientAddr, PerAddress};
use crate::proxy_protocol::{self, TrustedProxies};
use crate::AppState;

/// Default for `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default for `--header-read-timeout`.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Refusals being written at once; beyond, a refused connection is closed
/// without an answer.
pub const REFUSING: usize = 64;
/// How long a refusal may take to be written and its connection drained.
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// Connection and stream limits of [`crate::serve_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeOptions {
    /// Most connections served at once (at least 1).
    pub max_connections: usize,
    /// Most connections served at once from one client address.
    pub max_connections_per_address: usize,
    /// Most dashboard streams open at once (the state's: see
    /// [`AppState::with_limits`]).
    pub max_streams: usize,
    /// Most dashboard streams open at once from one client address.
    pub max_streams_per_address: usize,
    /// How long a request's head (request line and headers) may take to
    /// arrive, counted from the first read of it; also how long an idle
    /// keep-alive connection is kept. A trusted proxy's PROXY header too.
    pub header_read_timeout: Duration,
    /// Balancers whose connections start with a PROXY protocol v2 header
    /// naming the client ([`crate::proxy_protocol`]).
    pub trusted_proxies: TrustedProxies,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: limits::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            max_streams: limits::DEFAULT_MAX_STREAMS,
            max_streams_per_address: limits::DEFAULT_MAX_STREAMS_PER_ADDRESS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            trusted_proxies: TrustedProxies::default(),
        }
    }
}

/// Most connections of the probe listener at once: a balancer or two and an
/// orchestrator check it, a few connections each.
pub const PROBE_MAX_CONNECTIONS: usize = 64;

/// The probe listener's limits: [`PROBE_MAX_CONNECTIONS`], every address
/// alike (no PROXY header), and the main listener's header-read timeout.
pub fn probe_options(main: &ServeOptions) -> ServeOptions {
    ServeOptions {
        max_connections: PROBE_MAX_CONNECTIONS,
        max_connections_per_address: PROBE_MAX_CONNECTIONS,
        header_read_timeout: main.header_read_timeout,
        ..ServeOptions::default()
    }
}

/// Serve `state`'s router on `listener` until `shutdown` completes; then stop
/// accepting, let in-flight requests finish, close idle connections, return.
pub async fn serve_with(
    listener: TcpListener,
    state: AppState,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_router(
        listener,
        crate::app(state.clone()),
        &state,
        options,
        shutdown,
    )
    .await
}

/// Serve the probes alone ([`crate::http::probes`]) on `listener`, with
/// `options`' limits of their own, until `shutdown` completes.
pub async fn serve_probes(
    listener: TcpListener,
    state: AppState,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = crate::http::probes(state.clone());
    serve_router(listener, router, &state, options, shutdown).await
}

/// `router` on `listener`, counting connections in `state`'s metrics and
/// ending its event streams on shutdown.
async fn serve_router(
    listener: TcpListener,
    router: axum::Router,
    state: &AppState,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (metrics, draining) = (state.metrics.clone(), state.draining.clone());
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    let max = options.max_connections.max(1);
    let permits = Arc::new(Semaphore::new(max));
    let per_address = PerAddress::new(options.max_connections_per_address);
    let refusing = Arc::new(Semaphore::new(REFUSING));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    options.trusted_proxies.resolve().await;
    let resolving = options.trusted_proxies.keep_resolving();

    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refuse(&refusing, stream, max, false);
            continue;
        };
        // Responses are written whole; do not let Nagle hold the last segment.
        let _ = stream.set_nodelay(true);
        let open = metrics.connection_opened();
        let trusted = options.trusted_proxies.contains(peer.ip());
        let (router, builder, per_address, refusing) = (
            router.clone(),
            builder.clone(),
            per_address.clone(),
            refusing.clone(),
        );
        let limit = options.max_connections_per_address;
        let timeout = options.header_read_timeout;
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let mut stream = stream;
            let ip = if trusted {
                match proxy_protocol::read_header(&mut stream, peer.ip(), timeout).await {
                    Ok(ip) => ip,
                    Err(e) => {
                        tracing::warn!(peer = %peer, "closed a trusted proxy's connection: {e}");
                        return;
                    }
                }
            } else {
                peer.ip()
            };
            let Some(address) = per_address.try_take(ip) else {
                drop((open, permit));
                refuse(&refusing, stream, limit, true);
                return;
            };
            let client = ClientAddr(ip);
            let service = router.map_request(move |mut req: Request<_>| {
                req.extensions_mut().insert(client);
                req
            });
            let service = TowerToHyperService::new(service);
            let connection = watcher.watch(builder.serve_connection(TokioIo::new(stream), service));
            if let Err(e) = connection.await {
                // Header-read timeouts land here, and clients that hang up.
                tracing::debug!("connection ended: {e}");
            }
            drop(open);
            drop((permit, address));
        });
    }
    drop(listener);
    // Responses that never end by themselves (the dashboard's event streams)
    // end now, so that the drain does not wait for them.
    draining.cancel();
    if let Some(resolving) = resolving {
        resolving.abort();
    }
    graceful.shutdown().await;
    Ok(())
}

/// Answer a connection beyond a cap with 503 `too_many_connections` and
/// close it, in a task of its own; or close it at once when [`REFUSING`]
/// answers are in flight already.
fn refuse(refusing: &Arc<Semaphore>, mut stream: TcpStream, limit: usize, per_address: bool) {
    let Ok(slot) = refusing.clone().try_acquire_owned() else {
        return; // dropped: closed
    };
    let refusal = refusal(&ApiError::TooManyConnections { limit, per_address });
    tokio::spawn(async move {
        let _ = tokio::time::timeout(REFUSAL_TIME, async {
            stream.write_all(&refusal).await?;
            stream.shutdown().await?;
            // Read what the client sent until it closes: closing with unread
            // bytes would reset the connection, and the client could lose
            // the answer.
            let mut sink = [0u8; 4096];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
        drop(slot);
    });
}

/// The whole HTTP/1.1 response of a refusal: the error's JSON body, as
/// [`ApiError`] writes it, with `Retry-After` and `Connection: close`.
fn refusal(e: &ApiError) -> Vec<u8> {
    let mut body = serde_json::Map::new();
    body.insert("error".into(), e.code().into());
    body.insert("message".into(), e.to_string().into());
    body.extend(e.details());
    let body = serde_json::Value::Object(body).to_string();
    let status = e.status();
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\nretry-after: {}\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        limits::RETRY_AFTER.as_secs(),
        body.len()
    )
    .into_bytes()
}

/// Like hyper 0.14's server (and axum's `serve`): an aborted connection is
/// nothing; anything else (EMFILE, ENFILE) is logged and accepting pauses a
/// second, so that the loop does not spin while descriptors are exhausted.
async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!("accept error: {e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
