//! The `worker` binary: read the configuration, log to stderr (stdout carries
//! the JSONL events), and run the edit loop until done or told to stop.
//! `worker lock` and `worker unlock` (see [`worker::hold`]) take and end a
//! lock from the command line instead.

use std::io::IsTerminal;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use worker::config::Config;
use worker::hold::{LockCommand, UnlockCommand};
use worker::log_writer::LogWriter;

fn main() {
    if let Err(e) = worker::config::load_secrets_file() {
        eprintln!("worker: {e}");
        std::process::exit(2);
    }
    // The flat command (`worker` with flags or variables only) is the edit
    // loop, as always; a first argument `lock` or `unlock` picks the others.
    let first = std::env::args_os().nth(1);
    match first.as_ref().and_then(|a| a.to_str()) {
        Some("lock") => {
            let cmd = LockCommand::try_parse_args(std::env::args_os().skip(1))
                .unwrap_or_else(|e| e.exit());
            let log = init_tracing();
            exit_on(
                runtime().block_on(worker::hold::lock(cmd, shutdown_signal())),
                |e| e.exit_code(),
                log,
            )
        }
        Some("unlock") => {
            let cmd = UnlockCommand::parse_from(std::env::args_os().skip(1));
            let log = init_tracing();
            exit_on(
                runtime().block_on(worker::hold::unlock(cmd)),
                |e| e.exit_code(),
                log,
            )
        }
        _ => {
            let config = Config::parse();
            let log = init_tracing();
            exit_on(
                runtime()
                    .block_on(worker::run(config, shutdown_signal()))
                    .map(|_| ()),
                |e| e.exit_code(),
                log,
            )
        }
    }
}

/// Exit with `code(e)` on an error, once the log is written out.
fn exit_on<E: std::fmt::Display>(result: Result<(), E>, code: impl Fn(&E) -> i32, log: LogWriter) {
    if let Err(e) = result {
        tracing::error!("{e}");
        drop(log);
        std::process::exit(code(&e));
    }
}

/// Logs to stderr from a thread of their own (see [`worker::log_writer`]).
fn init_tracing() -> LogWriter {
    let log = LogWriter::new(std::io::stderr(), "worker-log");
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("worker=info")),
        )
        .with_writer({
            let queue = log.writer();
            move || queue.clone()
        })
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    log
}

// One edit at a time: a single-threaded runtime fits, and it spares the lock
// round trips the cross-thread wake-ups of the multi-threaded one (the Redis
// backend measured 1.37x redis-benchmark's rate here against 0.86x on the
// multi-threaded runtime; docs/BENCHMARKS.md, "Lock backends").
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime")
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
