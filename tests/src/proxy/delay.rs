//! A small TCP delay proxy: the network between one worker and a server.
//!
//! tc netem is not available on these machines, so the delay is made in
//! user space. The proxy accepts on a local port and forwards every connection
//! to one upstream address. Bytes going server→client always pass at once.
//! Bytes going client→server pass according to the [`Mode`] in force *when they
//! were received*:
//!
//! - [`Mode::Pass`]: forwarded at once;
//! - [`Mode::Delay`]: forwarded `d` after they were received;
//! - [`Mode::Hold`]: kept until the mode leaves `Hold` (the runner lifts it once
//!   it has seen the event it waits for, so the scenario does not hang on a guess).
//!
//! Besides the mode, [`DelayProxy::delay_setup`] makes every new connection's
//! first bytes wait: a slow connection set-up (name lookup, handshake), with
//! the requests after it at full speed.
//!
//! Order is kept per connection: a chunk never overtakes an earlier one.
//! A request written while the proxy is armed therefore *leaves* the client at
//! once and *arrives* later: Kleppmann's network-delay case.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What happens to client→server bytes received from now on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Delay(Duration),
    Hold,
}

/// A running proxy. Stops accepting (and drops its connections) on drop.
pub struct DelayProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    held: Arc<AtomicU64>,
    /// Milliseconds each new connection's first chunk waits.
    setup_ms: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl DelayProxy {
    /// Listen on 127.0.0.1 (a free port) and forward to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Pass);
        let held = Arc::new(AtomicU64::new(0));
        let setup_ms = Arc::new(AtomicU64::new(0));
        let relay = {
            let (mode, held, setup_ms) = (mode.clone(), held.clone(), setup_ms.clone());
            move |client, server| {
                let setup = Duration::from_millis(setup_ms.load(Ordering::Relaxed));
                pump(client, server, mode.subscribe(), held.clone(), setup)
            }
        };
        let task = tokio::spawn(super::relay_connections(listener, upstream, || true, relay));
        Ok(Self {
            addr,
            upstream,
            mode,
            held,
            setup_ms,
            task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Change the mode for bytes received from now on. Leaving `Hold` releases
    /// what was held (in order).
    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// Connections accepted from now on: their first client→server bytes
    /// wait `d` (on top of the mode), the rest pass as the mode says.
    pub fn delay_setup(&self, d: Duration) {
        self.setup_ms.store(
            d.as_millis().try_into().unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Client→server bytes that were delayed or held so far.
    pub fn bytes_delayed(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection: a delaying client→server direction, a plain server→client one.
async fn pump(
    client: TcpStream,
    server: TcpStream,
    mode: watch::Receiver<Mode>,
    held: Arc<AtomicU64>,
    setup: Duration,
) {
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Mode, Vec<u8>)>();

    let reader_mode = mode.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match client_rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let m = *reader_mode.borrow();
                    if tx.send((Instant::now(), m, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        // Dropping tx tells the writer that the client finished sending.
    };

    let mut writer_mode = mode;
    let writer = async move {
        let mut first = true;
        while let Some((received, m, chunk)) = rx.recv().await {
            if std::mem::take(&mut first) && !setup.is_zero() {
                tokio::time::sleep_until(received + setup).await;
            }
            match m {
                Mode::Pass => {}
                Mode::Delay(d) => {
                    held.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    tokio::time::sleep_until(received + d).await;
                }
                Mode::Hold => {
                    held.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    if writer_mode.wait_for(|m| *m != Mode::Hold).await.is_err() {
                        return;
                    }
                }
            }
            if server_wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = server_wr.shutdown().await;
    };

    let back = async move {
        let _ = tokio::io::copy(&mut server_rd, &mut client_wr).await;
        let _ = client_wr.shutdown().await;
    };

    tokio::join!(reader, writer, back);
}

/// Rewrite `url` so that it goes through a proxy: `:PORT` → `:PROXY_PORT` for
/// the first occurrence of the upstream port after the host.
pub fn via_proxy(url: &str, upstream_port: u16, proxy_port: u16) -> String {
    let needle = format!(":{upstream_port}");
    match url.find(&needle) {
        Some(i) => format!("{}:{proxy_port}{}", &url[..i], &url[i + needle.len()..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(proxy: &DelayProxy, msg: &[u8]) -> Duration {
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let start = Instant::now();
        s.write_all(msg).await.unwrap();
        let mut buf = vec![0u8; msg.len()];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, msg);
        start.elapsed()
    }

    #[tokio::test]
    async fn pass_mode_forwards_bytes_unchanged() {
        let proxy = DelayProxy::start(echo_server().await).await.unwrap();
        let took = round_trip(&proxy, b"hello").await;
        assert!(took < Duration::from_millis(200), "took {took:?}");
        assert_eq!(proxy.bytes_delayed(), 0);
    }

    #[tokio::test]
    async fn delay_mode_holds_client_bytes_for_the_delay() {
        let proxy = DelayProxy::start(echo_server().await).await.unwrap();
        proxy.set_mode(Mode::Delay(Duration::from_millis(300)));
        let took = round_trip(&proxy, b"late").await;
        assert!(took >= Duration::from_millis(300), "took {took:?}");
        assert_eq!(proxy.bytes_delayed(), 4);
    }

    #[tokio::test]
    async fn held_bytes_arrive_only_after_release_and_in_order() {
        let proxy = DelayProxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.set_mode(Mode::Hold);
        s.write_all(b"first ").await.unwrap();
        let mut buf = [0u8; 64];
        let early = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await;
        assert!(early.is_err(), "held bytes came back before release");
        proxy.set_mode(Mode::Pass);
        s.write_all(b"second").await.unwrap();
        let mut got = vec![0u8; 12];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"first second");
    }

    #[test]
    fn urls_are_rewritten_to_the_proxy_port() {
        assert_eq!(
            via_proxy("redis://127.0.0.1:6379/", 6379, 4000),
            "redis://127.0.0.1:4000/"
        );
        assert_eq!(
            via_proxy("postgres://postgres@127.0.0.1:5432/t_1", 5432, 4001),
            "postgres://postgres@127.0.0.1:4001/t_1"
        );
        assert_eq!(via_proxy("127.0.0.1:2181", 2181, 9), "127.0.0.1:9");
    }
}
