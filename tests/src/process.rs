//! One child process of a real service, with the controls chaos tests need.
//!
//! Every child is spawned from one long-lived thread with `PR_SET_PDEATHSIG`, so
//! a test binary that exits (or panics, or is killed) takes its servers with it:
//! nothing is left listening after the suite. Each child leads its own process
//! group, so pause/resume reach every process of a service (PostgreSQL forks a
//! backend per connection).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The thread that spawns every child. Linux sends the parent-death signal when
/// the *thread* that forked the child exits, so it must be one that never does.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("harness-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(spawn_with_pdeathsig(&mut cmd));
                }
                // The channel lives in a static and is never closed; park just in case.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawn harness thread");
        Mutex::new(tx)
    })
}

/// Spawn `cmd` so that it dies with the test binary: it is forked by the
/// harness's long-lived spawner thread with `PR_SET_PDEATHSIG` set to SIGKILL.
pub fn spawn_tied_to_test(cmd: Command) -> std::io::Result<Child> {
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .expect("spawner lock")
        .send((cmd, tx))
        .expect("spawner thread alive");
    rx.recv().expect("spawner replies")
}

#[allow(unsafe_code)]
fn spawn_with_pdeathsig(cmd: &mut Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only calls prctl(2),
    // which is async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    cmd.spawn()
}

/// A recipe for starting a service's process again after it was stopped.
pub struct Recipe {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Run as this user (PostgreSQL refuses to run as root).
    pub user: Option<(u32, u32)>,
    pub log: PathBuf,
}

impl Recipe {
    /// `program args`, as root, its output appended to `log`.
    pub fn new(program: PathBuf, args: Vec<String>, log: PathBuf) -> Self {
        Recipe {
            program,
            args,
            env: vec![],
            user: None,
            log,
        }
    }

    fn command(&self) -> std::io::Result<Command> {
        use std::os::unix::process::CommandExt;
        let log = File::options().create(true).append(true).open(&self.log)?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        Ok(cmd)
    }
}

/// A running (or stopped) service process. Killed and reaped on drop.
pub struct ServiceProcess {
    name: String,
    recipe: Recipe,
    child: Option<Child>,
    paused: bool,
}

impl ServiceProcess {
    /// Start the process now. Readiness is the caller's business.
    pub fn spawn(name: impl Into<String>, recipe: Recipe) -> std::io::Result<Self> {
        let mut me = Self {
            name: name.into(),
            recipe,
            child: None,
            paused: false,
        };
        me.start()?;
        Ok(me)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn log_path(&self) -> &Path {
        &self.recipe.log
    }

    /// The last `n` lines of the service's log, for panic messages.
    pub fn log_tail(&self, n: usize) -> String {
        log_tail(&self.recipe.log, n)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Start the process again with the same arguments (same port, same data dir).
    pub fn start(&mut self) -> std::io::Result<()> {
        if self.is_running() {
            return Ok(());
        }
        self.child = Some(spawn_tied_to_test(self.recipe.command()?)?);
        self.paused = false;
        Ok(())
    }

    /// Send a signal to the whole process group of the service.
    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            let _ = killpg(Pid::from_raw(pid as i32), signal);
        }
    }

    /// SIGKILL: a crash. Nothing is flushed, nothing is said to clients.
    pub fn kill(&mut self) {
        if self.paused {
            self.signal(Signal::SIGCONT);
        }
        // Children that left the process group (PostgreSQL's backends call
        // setsid) would outlive a group kill for a moment and keep answering:
        // kill them first, so the crash is one instant for every client. The
        // parent is stopped before they are listed, so that it forks none
        // after the list; and they are waited for, so that a server started
        // again at once finds none of them (PostgreSQL refused to start while
        // a backend of the killed one still held its shared memory: CI saw
        // "pre-existing shared memory block is still in use").
        if let Some(pid) = self.pid() {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
            let children = children_of(pid);
            for &child in &children {
                let _ = nix::sys::signal::kill(Pid::from_raw(child as i32), Signal::SIGKILL);
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            // Polled: /proc offers no event for the exit of a process that
            // is not ours to wait for. A millisecond apart, not a spin, so
            // the polling leaves the kernel's teardown its CPU.
            while children.iter().any(|&c| alive(c)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.signal(Signal::SIGKILL);
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// SIGTERM and wait up to `grace` for a clean exit, then SIGKILL.
    pub async fn stop(&mut self, grace: Duration) {
        if self.paused {
            self.resume();
        }
        self.signal(Signal::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        while self.is_running() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill();
    }

    /// SIGSTOP on every process of the service: it keeps its sockets but answers nothing.
    pub fn pause(&mut self) {
        self.signal(Signal::SIGSTOP);
        self.paused = true;
    }

    pub fn resume(&mut self) {
        self.signal(Signal::SIGCONT);
        self.paused = false;
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `n` lines of the file at `path` (empty when it cannot be read).
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The fields of `/proc/<pid>/stat` after the command name (field 2, which
/// may hold spaces and ends at the last ')'): the state first, then the
/// parent's pid. `None` when the process is gone.
fn stat_after_name(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Whether process `pid` still runs (not gone, not a zombie: a zombie has
/// let go of its memory, shared memory included).
fn alive(pid: u32) -> bool {
    stat_after_name(pid)
        .and_then(|fields| fields.first().map(|state| state != "Z" && state != "X"))
        .unwrap_or(false)
}

/// Pids whose parent is `parent`, read from /proc.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            stat_after_name(pid).and_then(|fields| fields.get(1)?.parse::<u32>().ok())
                == Some(parent)
        })
        .collect()
}

/// A port that was free a moment ago on 127.0.0.1, for a server a test is
/// about to start.
///
/// Not one of the kernel's ephemeral ports (`ip_local_port_range`, 32768 to
/// 60999 by default): those are also the source ports of outgoing
/// connections, so a port that was free when asked could be taken by any
/// client connection (of this test or another) before the server binds it.
/// CI saw exactly that: `scripts/stack up` refused a sentinel port that an
/// outgoing connection had taken meanwhile. The ports handed out here come
/// from below that range, each once per process (a counter), starting at a
/// place that depends on the process id so that two test processes at once
/// rarely meet; a port something else listens on is skipped.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 27_000; // above the default ports of scripts/stack
    const LAST: u32 = 32_700; // below the default ephemeral range
    const SPAN: u32 = LAST - FIRST;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(7919)) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        // Free on the loopback address and on the wildcard one (a server may
        // bind either).
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::TcpListener::bind(("0.0.0.0", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free port between {FIRST} and {LAST}")
}

/// Poll `probe` until it succeeds or `timeout` passes. Returns the last error on timeout.
pub async fn wait_until<F, Fut, T, E>(timeout: Duration, mut probe: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = Duration::from_millis(20);
    loop {
        match probe().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(250));
            }
        }
    }
}

/// Run `command` to its end; its output. Panics, naming the command and
/// showing its stderr, when it cannot run or does not succeed.
#[track_caller]
pub fn run_ok(command: &mut Command) -> std::process::Output {
    let args: Vec<_> = command.get_args().collect();
    let shown = format!(
        "`{} {}`",
        command.get_program().display(),
        args.join(" ".as_ref()).display()
    );
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("run {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Find an executable: on PATH, or in one of the fallback directories Debian uses.
pub fn find_binary(name: &str, fallbacks: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    for dir in fallbacks {
        let candidate = Path::new(dir).join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "`{name}` not found on PATH or in {fallbacks:?}; install the Debian package \
         (see .ci/run, which installs everything the tests need)"
    )
}

/// Where this test process keeps its services' temp dirs:
/// `<tmp>/harness-run-<pid>/`, readable by the `postgres` user.
///
/// A service shared by a whole test binary lives in a `static`, which Rust
/// never drops, so its `TempDir` is never removed and every run used to leave
/// its data dirs behind (gigabytes after a day of test runs). The services
/// themselves die with the test binary (`PR_SET_PDEATHSIG`), so the first call
/// here removes the scratch dirs of harness processes that no longer exist.
pub fn scratch_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = std::env::temp_dir();
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("harness-run-"))
                    .and_then(|p| p.parse::<u32>().ok())
                else {
                    continue;
                };
                if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let dir = tmp.join(format!("harness-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the harness scratch dir");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .expect("make the harness scratch dir traversable");
        dir
    })
}

/// A fresh temp dir `harness-<label>-XXXX` in [`scratch_dir`], removed on drop.
pub fn temp_dir(label: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("harness-{label}-"))
        .tempdir_in(scratch_dir())
        .unwrap_or_else(|e| panic!("temp dir for {label}: {e}"))
}
