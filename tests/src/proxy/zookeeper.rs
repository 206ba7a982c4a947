//! A TCP proxy that speaks just enough of ZooKeeper's wire protocol to lose
//! one reply on purpose, between a client and a real server.
//!
//! Every frame is a 4-byte big-endian length and a body. After the connect
//! handshake (the first frame each way), a request body starts with its xid
//! and op code, a reply body with the same xid. That is all the proxy reads:
//! it forwards everything else untouched.
//!
//! Two faults, each armed for the next request of one kind ([`Op`]):
//! - [`ZooKeeperProxy::lose_reply`]: the request reaches the server (which
//!   applies it), its reply is dropped, the connection is closed, and new
//!   connections are turned away until [`ZooKeeperProxy::reopen`]. The client
//!   sees a connection loss for a request that took effect: the case every
//!   retry must be written for.
//! - [`ZooKeeperProxy::duplicate`]: the request is sent to the server twice and
//!   the client sees only the second reply: a create applied twice, as after
//!   a lost reply whose recovery missed the first node.
//!
//! [`ZooKeeperProxy::fired`] waits until the armed fault has happened.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::process::free_port;

/// Kinds of request a fault can be armed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `create`, `create2`, `createContainer`, `createTTL`.
    Create,
    Delete,
}

impl Op {
    fn matches(self, op_code: i32) -> bool {
        match self {
            Op::Create => matches!(op_code, 1 | 15 | 19 | 21),
            Op::Delete => op_code == 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    LoseReply(Op),
    Duplicate(Op),
}

#[derive(Default)]
struct State {
    armed: Option<Fault>,
    /// Connections are turned away (after a lost reply, until reopened).
    closed: bool,
    /// How many armed faults have happened.
    fired: u64,
}

/// A running proxy on `127.0.0.1:<free port>`; stops on drop.
pub struct ZooKeeperProxy {
    port: u16,
    state: Arc<Mutex<State>>,
    fired: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl ZooKeeperProxy {
    /// Listen on a free port and forward every connection to
    /// `127.0.0.1:upstream_port`.
    pub async fn start(upstream_port: u16) -> Self {
        let mut bound = None;
        for _ in 0..20 {
            let port = free_port();
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)).await {
                bound = Some((port, listener));
                break;
            }
        }
        let (port, listener) = bound.expect("a free port for the zookeeper proxy");
        let state = Arc::new(Mutex::new(State::default()));
        let (fired, _) = watch::channel(0);
        let admit = {
            let state = state.clone();
            move || !state.lock().unwrap().closed
        };
        let relay = {
            let (state, fired) = (state.clone(), fired.clone());
            move |client, server| relay(client, server, state.clone(), fired.clone())
        };
        let task = tokio::spawn(super::relay_connections(
            listener,
            ([127, 0, 0, 1], upstream_port).into(),
            admit,
            relay,
        ));
        Self {
            port,
            state,
            fired,
            task,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connect string that goes through the proxy.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Lose the reply to the next `op`, close that connection and turn new
    /// ones away until [`reopen`](Self::reopen).
    pub fn lose_reply(&self, op: Op) {
        self.arm(Fault::LoseReply(op));
    }

    /// Send the next `op` to the server twice; the client sees the second reply.
    pub fn duplicate(&self, op: Op) {
        self.arm(Fault::Duplicate(op));
    }

    /// Accept connections again.
    pub fn reopen(&self) {
        self.state.lock().unwrap().closed = false;
    }

    /// Wait until the fault armed last has happened (at once if it has).
    pub async fn fired(&self) {
        let target = {
            let state = self.state.lock().unwrap();
            state.fired + u64::from(state.armed.is_some())
        };
        let mut rx = self.fired.subscribe();
        rx.wait_for(|n| *n >= target)
            .await
            .expect("the proxy task is alive");
    }

    fn arm(&self, fault: Fault) {
        self.state.lock().unwrap().armed = Some(fault);
    }
}

impl Drop for ZooKeeperProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the client→server half tells the server→client half to do with the
/// reply to one xid.
#[derive(Debug, Clone, Copy)]
enum OnReply {
    /// Drop it, close the connection, turn new ones away.
    LoseAndClose(i32),
    /// Drop the first reply with this xid (the duplicate's).
    SkipFirst(i32),
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    state: Arc<Mutex<State>>,
    fired: watch::Sender<u64>,
) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let (on_reply_tx, mut on_reply_rx) = tokio::sync::mpsc::unbounded_channel::<OnReply>();

    let upstream = async {
        let mut handshake = true;
        while let Some(frame) = read_frame(&mut client_rx).await {
            let mut copies = 1;
            if !handshake && frame.len() >= 8 {
                let xid = i32::from_be_bytes(frame[0..4].try_into().unwrap());
                let op_code = i32::from_be_bytes(frame[4..8].try_into().unwrap());
                let mut st = state.lock().unwrap();
                match st.armed {
                    Some(Fault::LoseReply(op)) if op.matches(op_code) => {
                        st.armed = None;
                        let _ = on_reply_tx.send(OnReply::LoseAndClose(xid));
                    }
                    Some(Fault::Duplicate(op)) if op.matches(op_code) => {
                        st.armed = None;
                        copies = 2;
                        let _ = on_reply_tx.send(OnReply::SkipFirst(xid));
                    }
                    _ => {}
                }
            }
            handshake = false;
            for _ in 0..copies {
                if write_frame(&mut server_tx, &frame).await.is_err() {
                    return;
                }
            }
        }
    };

    let downstream = async {
        let mut handshake = true;
        let mut pending: Vec<OnReply> = Vec::new();
        while let Some(frame) = read_frame(&mut server_rx).await {
            while let Ok(rule) = on_reply_rx.try_recv() {
                pending.push(rule);
            }
            if !handshake && frame.len() >= 4 {
                let xid = i32::from_be_bytes(frame[0..4].try_into().unwrap());
                let hit = pending.iter().position(|r| match r {
                    OnReply::LoseAndClose(x) | OnReply::SkipFirst(x) => *x == xid,
                });
                if let Some(i) = hit {
                    let rule = pending.remove(i);
                    let close = matches!(rule, OnReply::LoseAndClose(_));
                    {
                        let mut st = state.lock().unwrap();
                        st.fired += 1;
                        if close {
                            st.closed = true;
                        }
                        fired.send_replace(st.fired);
                    }
                    if close {
                        return;
                    }
                    continue;
                }
            }
            handshake = false;
            if write_frame(&mut client_tx, &frame).await.is_err() {
                return;
            }
        }
    };

    // Whichever half ends first ends the connection (both sockets drop).
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}

async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await.ok()?;
    let len = usize::try_from(i32::from_be_bytes(len)).ok()?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await.ok()?;
    Some(body)
}

async fn write_frame<W: AsyncWriteExt + Unpin>(w: &mut W, body: &[u8]) -> std::io::Result<()> {
    let len = i32::try_from(body.len()).expect("frame fits").to_be_bytes();
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len);
    buf.extend_from_slice(body);
    w.write_all(&buf).await
}
