//! A worker's network held: a [`DelayProxy`] in front of each server it
//! talks to (the gateway, the lock servers, or some of them). While the
//! fault is in, everything the worker sends is held: a request leaves the
//! worker at once and arrives only when healed, in order. Other workers,
//! which reach the servers directly, go on.

use std::collections::HashMap;

use crate::proxy::{DelayProxy, Mode};

/// The proxies, passing until injected.
pub struct HeldLink {
    /// (server port, its proxy).
    proxies: Vec<(u16, DelayProxy)>,
}

impl HeldLink {
    /// A proxy in front of each of `ports` on 127.0.0.1.
    pub async fn start(ports: impl IntoIterator<Item = u16>) -> std::io::Result<Self> {
        let mut proxies = vec![];
        for port in ports {
            proxies.push((
                port,
                DelayProxy::start(([127, 0, 0, 1], port).into()).await?,
            ));
        }
        Ok(Self { proxies })
    }

    /// Server port to proxy port, for the worker's URLs (see
    /// [`crate::proxy::via_proxy`]).
    pub fn via(&self) -> HashMap<u16, u16> {
        self.proxies.iter().map(|(s, p)| (*s, p.port())).collect()
    }

    /// The proxy in front of server `port`.
    pub fn proxy_port(&self, port: u16) -> Option<u16> {
        self.proxies
            .iter()
            .find(|(s, _)| *s == port)
            .map(|(_, p)| p.port())
    }

    /// Bytes held so far on the way to server `port`.
    pub fn bytes_held(&self, port: u16) -> u64 {
        self.proxies
            .iter()
            .filter(|(s, _)| *s == port)
            .map(|(_, p)| p.bytes_delayed())
            .sum()
    }

    /// Hold everything the worker sends from now on.
    pub fn inject(&self) -> Held<'_> {
        self.set_mode(Mode::Hold);
        Held { link: self }
    }

    fn set_mode(&self, mode: Mode) {
        for (_, p) in &self.proxies {
            p.set_mode(mode);
        }
    }
}

/// What undoes a held link: pass again, releasing what was held.
#[must_use = "the worker's requests stay held until healed"]
pub struct Held<'a> {
    link: &'a HeldLink,
}

impl Held<'_> {
    pub fn heal(self) {
        self.link.set_mode(Mode::Pass);
    }
}
