//! Network namespaces as throwaway "hosts", for partitions (needs root).
//!
//! A namespace here has no name: it is held by a `sleep` started under
//! `unshare --net` (spawned like every harness process, so it dies with the
//! test binary), and reached through `/proc/PID/ns/net`. It disappears, with
//! its interfaces, veth pairs and iptables rules, as soon as the holder and
//! the processes started in it are gone: nothing global is created, so
//! parallel tests and other users of the machine never collide with it, and a
//! killed test binary leaves nothing behind.
//!
//! Processes are started inside with `nsenter --net=/proc/PID/ns/net`
//! ([`NetNs::wrap`]). The test process itself reaches into a namespace with
//! [`NsConnector`]: a thread that entered the namespace (`setns`) opens the
//! TCP connections, which then carry traffic between both worlds
//! ([`Forwarder`]). Addresses used inside namespaces never exist outside them.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::process::{find_binary, Recipe, ServiceProcess};

/// A network namespace held by a process; gone when it and its processes are.
pub struct NetNs {
    holder: ServiceProcess,
    label: String,
    _log: tempfile::NamedTempFile,
}

impl NetNs {
    /// A fresh namespace with `lo` up. `label` only names it in messages.
    pub fn new(label: &str) -> io::Result<Self> {
        let log = tempfile::Builder::new()
            .prefix("harness-netns-")
            .tempfile()?;
        let recipe = Recipe {
            program: find_binary("unshare", &["/usr/bin", "/bin"]),
            args: vec!["--net".into(), "sleep".into(), "infinity".into()],
            env: vec![],
            user: None,
            log: log.path().to_path_buf(),
        };
        let holder = ServiceProcess::spawn(format!("netns-{label}"), recipe)?;
        let me = Self {
            holder,
            label: label.to_string(),
            _log: log,
        };
        // The holder enters its namespace a moment after it is spawned.
        let ours = std::fs::read_link("/proc/self/ns/net")?;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::read_link(me.path()) {
                Ok(theirs) if theirs != ours => break,
                _ if std::time::Instant::now() > deadline => {
                    return Err(io::Error::other(format!(
                        "namespace {label}: the holder never left our network namespace \
                         (is this root? is `unshare --net` allowed?)"
                    )))
                }
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        me.ip(&["link", "set", "lo", "up"])?;
        Ok(me)
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// The holder's pid (what `ip link set DEV netns PID` takes).
    pub fn pid(&self) -> u32 {
        self.holder.pid().expect("namespace holder running")
    }

    /// `/proc/PID/ns/net`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.pid()))
    }

    /// Run `program args` inside and wait for it; its output, or an error
    /// with its stderr.
    pub fn run(&self, program: &str, args: &[&str]) -> io::Result<String> {
        let out = Command::new(find_binary("nsenter", &["/usr/bin", "/bin"]))
            .arg(format!("--net={}", self.path().display()))
            .arg(program)
            .args(args)
            .output()?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(io::Error::other(format!(
                "in namespace {}: `{program} {}` failed ({}): {}",
                self.label,
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// `ip ARGS` inside.
    pub fn ip(&self, args: &[&str]) -> io::Result<String> {
        self.run("ip", args)
    }

    /// `iptables ARGS` inside (its rules exist only in this namespace).
    pub fn iptables(&self, args: &[&str]) -> io::Result<String> {
        self.run("iptables", args)
    }

    /// The same recipe, started inside this namespace (`nsenter` execs the
    /// program, so signals and the pid are the program's own).
    pub fn wrap(&self, recipe: Recipe) -> Recipe {
        let mut args = vec![
            format!("--net={}", self.path().display()),
            recipe.program.display().to_string(),
        ];
        args.extend(recipe.args);
        Recipe {
            program: find_binary("nsenter", &["/usr/bin", "/bin"]),
            args,
            ..recipe
        }
    }

    /// A point-to-point link to `other`: `dev_here` with `addr_here` (CIDR)
    /// here, `dev_there` with `addr_there` there, both up.
    pub fn link_to(
        &self,
        other: &NetNs,
        (dev_here, addr_here): (&str, &str),
        (dev_there, addr_there): (&str, &str),
    ) -> io::Result<()> {
        let pid = other.pid().to_string();
        self.ip(&[
            "link", "add", dev_here, "type", "veth", "peer", "name", dev_there, "netns", &pid,
        ])?;
        self.ip(&["addr", "add", addr_here, "dev", dev_here])?;
        self.ip(&["link", "set", dev_here, "up"])?;
        other.ip(&["addr", "add", addr_there, "dev", dev_there])?;
        other.ip(&["link", "set", dev_there, "up"])?;
        Ok(())
    }
}

type ConnectRequest = (SocketAddr, oneshot::Sender<io::Result<std::net::TcpStream>>);

/// Opens TCP connections from inside a namespace: a thread that `setns`ed
/// into it and connects on request. The sockets it returns stay in that
/// namespace wherever they are used. The thread ends when this is dropped.
#[derive(Clone)]
pub struct NsConnector {
    tx: Arc<Mutex<mpsc::Sender<ConnectRequest>>>,
}

impl NsConnector {
    pub fn new(ns: &NetNs) -> io::Result<Self> {
        let path = ns.path();
        let file = std::fs::File::open(&path)?;
        let (tx, rx) = mpsc::channel::<ConnectRequest>();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("netns-connect-{}", ns.label()))
            .spawn(move || {
                // setns affects this thread only.
                let entered = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(io::Error::from);
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if !ok {
                    return;
                }
                for (addr, reply) in rx {
                    let stream =
                        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                            .and_then(|s| s.set_nonblocking(true).map(|()| s));
                    let _ = reply.send(stream);
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| io::Error::other("connector thread died"))??;
        Ok(Self {
            tx: Arc::new(Mutex::new(tx)),
        })
    }

    /// A connection to `addr` as seen from inside the namespace.
    pub async fn connect(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .lock()
            .expect("connector lock")
            .send((addr, reply))
            .map_err(|_| io::Error::other("connector thread gone"))?;
        let std_stream = answer
            .await
            .map_err(|_| io::Error::other("connector thread gone"))??;
        TcpStream::from_std(std_stream)
    }
}

/// A TCP port on 127.0.0.1 of the test's own namespace that forwards every
/// connection to `target` inside a namespace. Bytes are relayed as they come;
/// when the path inside is cut, the connection stalls as a real one would.
pub struct Forwarder {
    port: u16,
    task: tokio::task::JoinHandle<()>,
    accepted: Arc<AtomicU64>,
}

impl Forwarder {
    pub async fn start(connector: NsConnector, target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let accepted = Arc::new(AtomicU64::new(0));
        let counter = accepted.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                let connector = connector.clone();
                tokio::spawn(async move {
                    // A refused or timed-out connect closes the client's
                    // connection: what a client sees from a host that is down.
                    if let Ok(mut server) = connector.connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Ok(Self {
            port,
            task,
            accepted,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether this process may create network namespaces (root, and `unshare`
/// present). Tests that need them say why they cannot run otherwise.
pub fn available() -> bool {
    nix::unistd::geteuid().is_root() && Path::new("/usr/bin/unshare").exists()
}
