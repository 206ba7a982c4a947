//! The `worker` binary: read the configuration, log to stderr (stdout carries
//! the JSONL events), and run the edit loop until done or told to stop.

use std::io::IsTerminal;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use worker::config::Config;

// One edit at a time: a single-threaded runtime fits, and it spares the lock
// round trips the cross-thread wake-ups of the multi-threaded one (the Redis
// backend measured 1.37x redis-benchmark's rate here against 0.86x on the
// multi-threaded runtime; docs/BENCHMARKS.md, "Lock backends").
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let config = Config::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("worker=info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    match worker::run(config, shutdown_signal()).await {
        Ok(_) => {}
        Err(e) => {
            tracing::error!("{e}");
            std::process::exit(e.exit_code());
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
