//! Proxies that stand between a client and a real server and misbehave on
//! purpose: the network faults that tc netem would make, in user space.
//!
//! - [`delay`]: any TCP stream, client→server bytes passed, delayed or held
//!   ([`DelayProxy`]).
//! - [`zookeeper`]: ZooKeeper's framing, one reply lost or one request sent
//!   twice ([`ZooKeeperProxy`]).

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};

pub mod delay;
pub mod zookeeper;

pub use delay::{via_proxy, DelayProxy, Mode};
pub use zookeeper::{Op, ZooKeeperProxy};

/// Accept connections on `listener` and relay each, once connected to
/// `upstream`, with `relay(client, server)`; a client that `admit` turns
/// away is dropped. Runs until its task is aborted.
async fn relay_connections<R, F>(
    listener: TcpListener,
    upstream: SocketAddr,
    admit: impl Fn() -> bool,
    relay: R,
) where
    R: Fn(TcpStream, TcpStream) -> F + Clone + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if !admit() {
            continue;
        }
        let relay = relay.clone();
        connections.spawn(async move {
            if let Ok(server) = TcpStream::connect(upstream).await {
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                relay(client, server).await;
            }
        });
        // Reap finished connections so the set does not grow without bound.
        while connections.try_join_next().is_some() {}
    }
}
