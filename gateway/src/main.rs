//! The gateway binary: configuration, tracing, pool, migrations, then serve.
//! Everything else is in the library, where the tests reach it.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use gateway::{AppState, Config, Trust};
use tracing_subscriber::EnvFilter;

/// How long to wait for PostgreSQL at startup (compose may start us first).
const CONNECT_PATIENCE: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new(gateway::DEFAULT_LOG_FILTER)),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();

    // Keys and issuers first: a bad configuration fails at once, before the
    // (possibly long) wait for the database. Issuers connect in the
    // background: one that is down does not keep the gateway from starting.
    let trust = match config
        .trust_options()
        .and_then(|o| Trust::start(o, config.fencing).map_err(anyhow::Error::msg))
    {
        Ok(trust) => trust,
        Err(e) => {
            // A configuration mistake, not a crash: the message, no backtrace.
            eprintln!("gateway: {e:#}");
            std::process::exit(2);
        }
    };
    // sqlx applies the migrations on a connection of its own; requests use
    // the gateway's pool (gateway::Db), opened lazily.
    let migrations = connect_with_retry(&config).await?;
    gateway::migrate(&migrations).await?;
    migrations.close().await;
    let db =
        gateway::Db::new(&config.database_url, config.pool_options()).context("database URL")?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("bind {}", config.listen))?;
    let limits = config.serve_options();
    tracing::info!(
        fencing = ?config.fencing,
        max_connections = limits.max_connections,
        header_read_timeout = ?limits.header_read_timeout,
        request_timeout = ?config.request_timeout,
        outcome_wait = ?config.outcome_wait,
        "listening on {}",
        listener.local_addr()?
    );
    gateway::serve_with(
        listener,
        AppState::with_trust(db.clone(), config.fencing, trust).with_deadlines(config.deadlines()),
        limits,
        shutdown_signal(),
    )
    .await?;
    db.close();
    tracing::info!("stopped");
    Ok(())
}

async fn connect_with_retry(config: &Config) -> anyhow::Result<sqlx::PgPool> {
    let start = Instant::now();
    let mut delay = Duration::from_millis(250);
    loop {
        match gateway::connect(&config.database_url, 1).await {
            Ok(db) => return Ok(db),
            Err(e) if start.elapsed() < CONNECT_PATIENCE => {
                tracing::warn!(error = %format!("{e:#}"), retry_in = ?delay, "database not reachable yet");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e.context(format!("gave up after {CONNECT_PATIENCE:?}"))),
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM; the server then drains in-flight requests.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutdown signal received, draining");
}
