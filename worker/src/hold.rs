//! `worker lock` and `worker unlock`: a lock taken from the command line, so a
//! person can write with curl under a real grant (the README's tutorial).
//!
//! `worker lock` takes `page:<PAGE>` with the configured backend and client id
//! (every flag and variable of the edit loop applies; `--gateway` is not
//! needed), prints the grant on stdout as one line and holds the lock,
//! renewing it, until `--hold` elapses, SIGTERM or SIGINT arrives, or stdin
//! closes; then it releases it. The grant line:
//!
//! ```text
//! {"lock":"page:tutorial","issuer":"redis","token":1,"client_id":"alice"}
//! ```
//!
//! `--print token` prints the token alone instead, for
//! `TOKEN=$(worker lock ... --print token --detach)`.
//!
//! `--detach` starts the holder as a background process of its own (a new
//! session, stdin closed, its log in the state dir), prints the holder's grant
//! line once it has one and returns, so the shell gets the token while the
//! lock stays held; `worker unlock --client-id C --page P` later stops that
//! holder (SIGTERM), waits until it has released the lock and prints what it
//! released. The state dir is `$TMPDIR/worker-lock` (`/tmp/worker-lock`): one
//! pid file, log and result file per client and page, so `unlock` must run
//! where `lock --detach` ran (the same container, or the same
//! `scripts/stack exec` service).
//!
//! A holder whose lease is lost (renewal refused, lock service gone) says so
//! and exits 1: it no longer holds anything.

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, ValueEnum};
use serde::Serialize;

use crate::backend::{self, BackendError};
use crate::config::Config;
use fencelock::{Lease, LockError, Token};

/// Where `worker lock` without `--gateway` points the (unused) gateway setting.
const NO_GATEWAY: &str = "http://gateway.unused.invalid";

/// The edit loop's flags that mean nothing to `worker lock`: hidden from its help.
const EDIT_LOOP_ONLY: &[&str] = &[
    "gateway",
    "api_key",
    "edits",
    "duration",
    "work_ms",
    "if_match",
    "events",
    "stop_self_at",
];

/// The flags of `worker lock` beside the edit loop's.
#[derive(Debug, Clone, Args)]
pub struct HoldArgs {
    /// Release the lock after this long, e.g. 30s or 10m.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub hold: Duration,

    /// Hold the lock in a background process: print its grant and return at
    /// once (`worker unlock` ends it; stdin is not watched).
    #[arg(long)]
    pub detach: bool,

    /// What to print once granted: `json` (one line: lock, issuer, token,
    /// client_id) or `token` (the token alone).
    #[arg(long, value_enum, default_value_t = Print::Json)]
    pub print: Print,

    /// Internal: this process is the background holder that `--detach` started.
    #[arg(long, hide = true)]
    pub background: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Print {
    Json,
    Token,
}

/// `worker lock`: the edit loop's configuration plus [`HoldArgs`].
#[derive(Debug, Clone, Parser)]
pub struct LockCommand {
    #[command(flatten)]
    pub config: Config,
    #[command(flatten)]
    pub hold: HoldArgs,
}

impl LockCommand {
    /// The clap command: `--gateway` optional and the edit-only flags hidden.
    pub fn clap() -> clap::Command {
        let mut cmd = <LockCommand as CommandFactory>::command()
            .name("worker lock")
            .bin_name("worker lock")
            .about(
                "Take the lock page:<PAGE>, print the grant, and hold it (renewing) until \
                 --hold elapses, SIGTERM/SIGINT, or stdin closes; then release it",
            );
        for id in EDIT_LOOP_ONLY {
            cmd = cmd.mut_arg(*id, |a| a.hide(true));
        }
        cmd.mut_arg("gateway", |a| a.required(false).default_value(NO_GATEWAY))
    }

    /// Parse `worker lock ARGS...` (`args` starts with the program name).
    pub fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = Self::clap().try_get_matches_from(args)?;
        <Self as FromArgMatches>::from_arg_matches(&matches)
    }
}

/// `worker unlock`: end the background holder of `worker lock --detach`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "worker unlock",
    bin_name = "worker unlock",
    about = "Stop the holder that `worker lock --detach` left running here, wait until it has \
             released the lock, and print what it released"
)]
pub struct UnlockCommand {
    /// The client that holds the lock.
    #[arg(long, env = "WORKER_CLIENT_ID")]
    pub client_id: String,

    /// The page whose lock (`page:<id>`) it holds.
    #[arg(long, env = "WORKER_PAGE", default_value = "demo")]
    pub page: String,

    /// How long to wait for the holder to release and exit.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub timeout: Duration,
}

/// What `worker lock` prints once granted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Grant {
    pub lock: String,
    pub issuer: String,
    pub token: Option<Token>,
    pub client_id: String,
}

/// What a background holder leaves behind when it ends, and `worker unlock` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Ended {
    pub released: String,
    pub issuer: String,
    pub token: Option<Token>,
    pub client_id: String,
    /// `released` (told the lock service), `lost` (the lease had already
    /// ended), or `release_failed`.
    pub outcome: String,
}

/// Why `worker lock` or `worker unlock` failed.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    /// A configuration that cannot work (`BackendError::Config`), or a
    /// lock service that cannot be reached.
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("could not take {lock}: {source}")]
    Acquire { lock: String, source: LockError },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Failed(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl HoldError {
    /// 2 for what the user must fix, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            HoldError::Usage(_) => 2,
            HoldError::Backend(e) => e.exit_code(),
            HoldError::Acquire {
                source: LockError::InvalidConfig(_),
                ..
            } => 2,
            _ => 1,
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> HoldError {
    let what = what.into();
    move |source| HoldError::Io { what, source }
}

/// The files of one client's holder of one page.
#[derive(Debug, Clone)]
pub struct StateFiles {
    pub pid: PathBuf,
    pub log: PathBuf,
    pub ended: PathBuf,
}

impl StateFiles {
    /// `$TMPDIR/worker-lock/<client>@<page>.{pid,log,ended}`.
    pub fn new(client_id: &str, page: &str) -> Self {
        let dir = std::env::temp_dir().join("worker-lock");
        let stem = format!("{}@{}", file_safe(client_id), file_safe(page));
        Self {
            pid: dir.join(format!("{stem}.pid")),
            log: dir.join(format!("{stem}.log")),
            ended: dir.join(format!("{stem}.ended")),
        }
    }

    fn dir(&self) -> &Path {
        self.pid.parent().expect("state files live in a dir")
    }
}

/// A name that is safe as a file name: `[A-Za-z0-9._-]` kept, the rest `%XX`.
fn file_safe(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"._-".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `worker lock`: take the lock and hold it (or, with `--detach`, have a
/// background process do it).
pub async fn lock<F>(cmd: LockCommand, shutdown: F) -> Result<(), HoldError>
where
    F: std::future::Future<Output = ()>,
{
    cmd.config.validate().map_err(BackendError::Config)?;
    if cmd.hold.detach && !cmd.hold.background {
        return detach(&cmd).await;
    }
    hold(cmd, shutdown).await
}

/// Start the background holder and hand its grant line on.
async fn detach(cmd: &LockCommand) -> Result<(), HoldError> {
    let client_id = cmd.config.client_id();
    let files = StateFiles::new(&client_id, &cmd.config.page);
    std::fs::create_dir_all(files.dir()).map_err(io(format!(
        "create the state dir {}",
        files.dir().display()
    )))?;
    if let Some(pid) = live_holder(&files) {
        return Err(HoldError::Usage(format!(
            "a holder of {} for `{client_id}` is already running here (pid {pid}); \
             `worker unlock --client-id {client_id} --page {}` ends it",
            cmd.config.lock_name(),
            cmd.config.page
        )));
    }
    let _ = std::fs::remove_file(&files.ended);
    let log =
        std::fs::File::create(&files.log).map_err(io(format!("create {}", files.log.display())))?;
    let exe = std::env::current_exe().map_err(io("find the worker binary"))?;
    // The same arguments (the environment is inherited too), minus --detach.
    let mut args: Vec<OsString> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--detach")
        .collect();
    args.push("--background".into());
    let mut child = tokio::process::Command::new(exe)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(io("start the background holder"))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    // Connecting, then waiting up to --wait for the lock.
    let patience = cmd.config.wait + Duration::from_secs(60);
    let first = tokio::time::timeout(patience, lines.next_line()).await;
    match first {
        Ok(Ok(Some(line))) => {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{line}")
                .and_then(|()| out.flush())
                .map_err(io("write the grant"))?;
            // The holder goes on alone; nobody reads its stdout any more.
            Ok(())
        }
        other => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            let why = match other {
                Err(_) => format!("no grant within {patience:?}"),
                Ok(Err(e)) => format!("reading its output: {e}"),
                Ok(Ok(None)) => "it exited without a grant".into(),
                Ok(Ok(Some(_))) => unreachable!(),
            };
            Err(HoldError::Failed(format!(
                "the background holder did not get the lock ({why}); its log ({}):\n{}",
                files.log.display(),
                tail(&files.log, 15)
            )))
        }
    }
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Take the lock, print the grant, hold until told to stop, release.
async fn hold<F>(cmd: LockCommand, shutdown: F) -> Result<(), HoldError>
where
    F: std::future::Future<Output = ()>,
{
    let LockCommand { config, hold } = cmd;
    let client_id = config.client_id();
    let lock = config.lock_name();
    let files = StateFiles::new(&client_id, &config.page);
    if hold.background {
        // Out of the caller's session: its terminal's hangup and Ctrl-C are
        // not ours. (Fails only for a group leader, which we are not.)
        let _ = nix::unistd::setsid();
    }
    let locks = connect(&config).await?;
    let lease = locks
        .acquire(&lock, config.ttl, config.wait)
        .await
        .map_err(|source| HoldError::Acquire {
            lock: lock.clone(),
            source,
        })?;
    let grant = Grant {
        lock: lock.clone(),
        issuer: lease.issuer().to_string(),
        token: lease.token(),
        client_id: client_id.clone(),
    };
    if hold.print == Print::Token && grant.token.is_none() {
        let _ = lease.release().await;
        return Err(HoldError::Usage(format!(
            "{} grants carry no fencing token: --print token has nothing to print",
            grant.issuer
        )));
    }
    if hold.background {
        write_pid_file(&files)?;
    }
    let line = match hold.print {
        Print::Json => serde_json::to_string(&grant).expect("a grant serializes"),
        Print::Token => grant.token.map(|t| t.to_string()).unwrap_or_default(),
    };
    {
        let mut out = std::io::stdout().lock();
        // With --detach, the reader goes away after this line: later writes
        // would fail, and none come.
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    }
    tracing::info!(
        lock = %lock,
        issuer = %grant.issuer,
        token = ?grant.token,
        client = %client_id,
        "holding the lock for up to {}",
        humantime::format_duration(hold.hold)
    );

    let why = wait_for_the_end(&lease, hold.hold, !hold.background, shutdown).await;
    let outcome = match &why {
        End::Lost(reason) => {
            tracing::error!("lost the lock {lock}: {reason}");
            drop(lease);
            "lost"
        }
        other => {
            tracing::info!("{}: releasing {lock}", other.describe());
            match tokio::time::timeout(Duration::from_secs(10), lease.release()).await {
                Ok(Ok(())) => "released",
                Ok(Err(LockError::NotHeld { .. })) => "lost",
                Ok(Err(e)) => {
                    tracing::error!("release of {lock} failed: {e}; it expires by itself");
                    "release_failed"
                }
                Err(_) => {
                    tracing::error!("release of {lock} timed out; it expires by itself");
                    "release_failed"
                }
            }
        }
    };
    if hold.background {
        let ended = Ended {
            released: lock.clone(),
            issuer: grant.issuer.clone(),
            token: grant.token,
            client_id: client_id.clone(),
            outcome: outcome.to_string(),
        };
        let _ = std::fs::write(
            &files.ended,
            serde_json::to_string(&ended).expect("serializes") + "\n",
        );
        let _ = std::fs::remove_file(&files.pid);
    }
    match outcome {
        "released" => {
            tracing::info!("released {lock}");
            Ok(())
        }
        "lost" => Err(HoldError::Failed(format!(
            "the lease on {lock} ended before it was released ({})",
            why.describe()
        ))),
        _ => Err(HoldError::Failed(format!("could not release {lock}"))),
    }
}

/// Connect to the lock service, retrying while it is unreachable (it may be
/// restarting: `docker compose restart redis`) for up to `--wait`.
async fn connect(config: &Config) -> Result<std::sync::Arc<dyn fencelock::LockService>, HoldError> {
    let deadline = tokio::time::Instant::now() + config.wait;
    let mut delay = Duration::from_millis(50);
    loop {
        match backend::connect(config).await {
            Ok(locks) => return Ok(locks),
            Err(e) if e.is_transient() && tokio::time::Instant::now() + delay < deadline => {
                tracing::warn!("lock service not reachable yet, retrying: {e}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Why holding stopped.
enum End {
    Elapsed(Duration),
    Signal,
    StdinClosed,
    Lost(String),
}

impl End {
    fn describe(&self) -> String {
        match self {
            End::Elapsed(d) => format!("--hold {} elapsed", humantime::format_duration(*d)),
            End::Signal => "SIGTERM/SIGINT".into(),
            End::StdinClosed => "stdin closed".into(),
            End::Lost(reason) => format!("lost: {reason}"),
        }
    }
}

async fn wait_for_the_end<F>(lease: &Lease, hold: Duration, watch_stdin: bool, shutdown: F) -> End
where
    F: std::future::Future<Output = ()>,
{
    let mut lost = lease.lost_signal();
    let (stdin_tx, stdin_rx) = tokio::sync::oneshot::channel::<()>();
    if watch_stdin {
        // A plain thread: a blocking read that tokio's runtime would wait for
        // at exit. It is not joined; the process ends without it.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let stdin = std::io::stdin();
            let mut lock = stdin.lock();
            while matches!(lock.read_until(b'\n', &mut sink), Ok(n) if n > 0) {
                sink.clear();
            }
            let _ = stdin_tx.send(());
        });
    } else {
        std::mem::forget(stdin_tx);
    }
    // A background holder ignores the hangup of the terminal it came from.
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let hangups = async {
        match hangup.as_mut() {
            Some(h) => loop {
                h.recv().await;
            },
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(hold) => End::Elapsed(hold),
        _ = shutdown => End::Signal,
        Ok(()) = stdin_rx => End::StdinClosed,
        reason = lost.lost() => End::Lost(reason),
        _ = hangups => unreachable!("loops forever"),
    }
}

/// `<pid> <start time>`: the start time (clock ticks since boot, from
/// /proc) tells a live holder from a later process that reused its pid.
fn write_pid_file(files: &StateFiles) -> Result<(), HoldError> {
    let pid = std::process::id();
    let start = start_time(pid).unwrap_or(0);
    std::fs::write(&files.pid, format!("{pid} {start}\n"))
        .map_err(io(format!("write {}", files.pid.display())))
}

/// Field 22 of /proc/PID/stat, and whether the process is a zombie.
fn proc_stat(pid: u32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // after ")": state is field 3, start time field 22 (1-based in proc(5)).
    let zombie = matches!(fields.first(), Some(&"Z") | Some(&"X"));
    Some((fields.get(19)?.parse().ok()?, zombie))
}

fn start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(t, _)| t)
}

/// The pid of the running holder named by the pid file, if it still runs.
fn live_holder(files: &StateFiles) -> Option<u32> {
    let text = std::fs::read_to_string(&files.pid).ok()?;
    let mut words = text.split_whitespace();
    let pid: u32 = words.next()?.parse().ok()?;
    let start: u64 = words.next()?.parse().ok()?;
    match proc_stat(pid) {
        Some((t, false)) if t == start => Some(pid),
        _ => None,
    }
}

/// `worker unlock`: SIGTERM the background holder, wait until it is gone,
/// print what it released.
pub async fn unlock(cmd: UnlockCommand) -> Result<(), HoldError> {
    let files = StateFiles::new(&cmd.client_id, &cmd.page);
    let lock = format!("page:{}", cmd.page);
    let Some(pid) = live_holder(&files) else {
        let _ = std::fs::remove_file(&files.pid);
        let last = std::fs::read_to_string(&files.ended)
            .map(|t| format!(" Its last holder ended: {}", t.trim()))
            .unwrap_or_default();
        return Err(HoldError::Failed(format!(
            "no holder of {lock} for `{}` is running here ({} has none).{last}",
            cmd.client_id,
            files.dir().display()
        )));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .map_err(|e| HoldError::Failed(format!("signal the holder (pid {pid}): {e}")))?;
    let deadline = tokio::time::Instant::now() + cmd.timeout;
    // The holder is not our child: poll /proc until it is gone.
    while live_holder(&files) == Some(pid) {
        if tokio::time::Instant::now() > deadline {
            return Err(HoldError::Failed(format!(
                "the holder (pid {pid}) did not exit within {:?}; its log: {}",
                cmd.timeout,
                files.log.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = std::fs::read_to_string(&files.ended).map_err(|e| {
        HoldError::Failed(format!(
            "the holder (pid {pid}) exited without saying what it released ({e}); its log: {}",
            files.log.display()
        ))
    })?;
    let ended: Ended = serde_json::from_str(text.trim())
        .map_err(|e| HoldError::Failed(format!("{}: {e}", files.ended.display())))?;
    println!("{}", text.trim());
    if ended.outcome == "released" {
        Ok(())
    } else {
        Err(HoldError::Failed(format!(
            "{lock} was not released cleanly: {}",
            ended.outcome
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_needs_no_gateway_and_takes_every_edit_loop_flag() {
        let c = LockCommand::try_parse_args([
            "worker lock",
            "--backend",
            "redis",
            "--redis-url",
            "redis://r",
            "--client-id",
            "alice",
            "--page",
            "tutorial",
            "--hold",
            "30s",
            "--print",
            "token",
            "--detach",
        ])
        .expect("parses");
        assert_eq!(c.config.page, "tutorial");
        assert_eq!(c.config.client_id(), "alice");
        assert_eq!(c.hold.hold, Duration::from_secs(30));
        assert_eq!(c.hold.print, Print::Token);
        assert!(c.hold.detach && !c.hold.background);
        assert_eq!(c.config.validate(), Ok(()));
        assert_eq!(c.config.lock_name(), "page:tutorial");
    }

    #[test]
    fn lock_help_hides_the_edit_loop_flags() {
        let help = LockCommand::clap().render_help().to_string();
        assert!(help.contains("--hold"), "{help}");
        assert!(help.contains("--backend"), "{help}");
        assert!(!help.contains("--work-ms"), "{help}");
        assert!(!help.contains("--gateway"), "{help}");
    }

    #[test]
    fn state_file_names_are_safe_for_any_client_id() {
        let f = StateFiles::new("a/b c", "tutorial");
        let name = f.pid.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, "a%2Fb%20c@tutorial.pid");
        assert_eq!(f.pid.parent(), f.ended.parent());
    }

    #[test]
    fn grant_line_has_the_agreed_fields_in_order() {
        let g = Grant {
            lock: "page:tutorial".into(),
            issuer: "zookeeper".into(),
            token: Token::new(4294967310),
            client_id: "alice".into(),
        };
        assert_eq!(
            serde_json::to_string(&g).unwrap(),
            r#"{"lock":"page:tutorial","issuer":"zookeeper","token":4294967310,"client_id":"alice"}"#
        );
    }

    #[test]
    fn our_own_start_time_is_readable() {
        let (start, zombie) = proc_stat(std::process::id()).expect("/proc/self/stat");
        assert!(start > 0 && !zombie);
    }
}
