//! The gateway binary: configuration, tracing, then `serve` (the default:
//! schema check, pool, serve) or `setup` (the operator's step). Everything
//! else is in the library, where the tests reach it.

use std::time::Duration;

use anyhow::Context;
use gateway::setup::SetupConfig;
use gateway::{AppState, Cli, Command, Config, Trust};
use tracing_subscriber::EnvFilter;

/// How long to wait for PostgreSQL at startup (compose may start us first).
const CONNECT_PATIENCE: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if let Err(e) = gateway::secrets::load_secrets_file() {
        refuse(e);
    }
    let command = Cli::parse_args(std::env::args_os().collect());
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new(gateway::DEFAULT_LOG_FILTER)),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    match command {
        Command::Serve(config) => serve(config).await,
        Command::Setup(config) => setup(config).await,
    }
}

/// A configuration mistake, not a crash: the message, no backtrace.
fn refuse(e: impl std::fmt::Display) -> ! {
    eprintln!("gateway: {e:#}");
    std::process::exit(2);
}

async fn setup(config: SetupConfig) -> anyhow::Result<()> {
    let options = config
        .options(CONNECT_PATIENCE)
        .unwrap_or_else(|e| refuse(format!("setup: {e:#}")));
    match gateway::setup::run(config.database_url.expose(), &options).await {
        Ok(report) => {
            for step in report.steps {
                println!("{step}");
            }
            Ok(())
        }
        Err(e) => refuse(format!("setup: {e:#}")),
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    // Keys and issuers first: a bad configuration fails at once, before the
    // (possibly long) wait for the database. Issuers connect in the
    // background: one that is down does not keep the gateway from starting.
    let trust = match config
        .trust_options()
        .and_then(|o| Trust::start(o, config.fencing).map_err(anyhow::Error::msg))
    {
        Ok(trust) => trust,
        Err(e) => refuse(e),
    };
    let limits = match config.serve_options() {
        Ok(limits) => limits,
        Err(e) => refuse(e),
    };
    let database_url = config.database_url.expose();
    // Read only: the gateway's role cannot migrate; `gateway setup` does.
    if let Err(e) = gateway::check_schema(database_url, CONNECT_PATIENCE).await {
        refuse(e);
    }
    let db = gateway::request_pool(database_url, config.pool_options())?;
    let reads = match config.db_read_pool_size {
        0 => db.clone(),
        _ => gateway::request_pool(database_url, config.read_pool_options())?,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("bind {}", config.listen))?;
    tracing::info!(
        fencing = ?config.fencing,
        max_connections = limits.max_connections,
        max_connections_per_address = limits.max_connections_per_address,
        max_streams = limits.max_streams,
        max_streams_per_address = limits.max_streams_per_address,
        write_rate_per_key = config.write_rate_per_key,
        trusted_proxies = ?limits.trusted_proxies.entries(),
        header_read_timeout = ?limits.header_read_timeout,
        request_timeout = ?config.request_timeout,
        outcome_wait = ?config.outcome_wait,
        "listening on {}",
        listener.local_addr()?
    );
    let state = AppState::with_trust(db.clone(), config.fencing, trust)
        .with_read_pool(reads.clone())
        .with_deadlines(config.deadlines())
        .with_limits(&limits)
        .with_write_rate(gateway::rate::WriteRate::new(
            config.write_rate_per_key,
            config.write_burst_per_key,
        ));
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown_signal().await;
            stop.cancel();
        }
    });
    let probes = match config.probe_listen {
        Some(addr) => {
            let probe_listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("bind the probes' {addr}"))?;
            tracing::info!("probes (/healthz, /readyz) also on {addr}");
            Some(tokio::spawn(gateway::server::serve_probes(
                probe_listener,
                state.clone(),
                gateway::server::probe_options(&limits),
                stop.clone().cancelled_owned(),
            )))
        }
        None => None,
    };
    gateway::serve_with(listener, state, limits, stop.cancelled_owned()).await?;
    if let Some(probes) = probes {
        probes.await??;
    }
    db.close();
    if config.db_read_pool_size > 0 {
        reads.close();
    }
    tracing::info!("stopped");
    Ok(())
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
