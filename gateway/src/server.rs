//! The accept loop: HTTP/1 connections served by hyper, with a header-read
//! timeout and a cap on concurrent connections, and a graceful shutdown.
//!
//! Why not `axum::serve`: it gives hyper no timer, so hyper's header-read
//! timeout is off, and it accepts every connection it can. A client that
//! sends half a request line and stops (slowloris) would hold its connection,
//! a task and a file descriptor forever, and enough of them would exhaust the
//! process's descriptors. Here:
//! - hyper's `header_read_timeout` (with a tokio timer) closes a connection
//!   whose request head has not arrived within the timeout. It also bounds
//!   how long an idle keep-alive connection waits for its next request.
//! - a semaphore in the accept loop bounds the connections being served. A
//!   connection beyond the cap is not refused: it waits in the kernel's
//!   listen backlog until one closes, then it is accepted and served.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::AppState;

/// Default for `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default for `--header-read-timeout`.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Connection limits of [`crate::serve_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// Most connections served at once (at least 1).
    pub max_connections: usize,
    /// How long a request's head (request line and headers) may take to
    /// arrive, counted from the first read of it; also how long an idle
    /// keep-alive connection is kept.
    pub header_read_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        }
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
    let metrics = state.metrics.clone();
    let draining = state.draining.clone();
    let router = crate::app(state);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    let permits = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);

    loop {
        // A permit first: beyond the cap, connections stay in the backlog.
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Responses are written whole; do not let Nagle hold the last segment.
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        let open = metrics.connection_opened();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                // Header-read timeouts land here, and clients that hang up.
                tracing::debug!("connection ended: {e}");
            }
            drop(open);
            drop(permit);
        });
    }
    drop(listener);
    // Responses that never end by themselves (the dashboard's event streams)
    // end now, so that the drain does not wait for them.
    draining.cancel();
    graceful.shutdown().await;
    Ok(())
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
