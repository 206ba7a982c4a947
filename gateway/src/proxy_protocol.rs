//! The client's real address behind a balancer: the PROXY protocol v2
//! header (HAProxy's `send-proxy-v2`) that a trusted balancer sends before
//! each connection's first byte. Only the addresses in `--trusted-proxies`
//! (or those its host names resolve to) may send one, and from them it is required: a connection that does not
//! start with a valid header is closed. Anybody else's connection is HTTP
//! from its first byte, so a client cannot claim another address.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ppp::v2::{Addresses, Command, Header, PROTOCOL_PREFIX};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Most bytes of addresses and TLVs after the fixed part (HAProxy sends
/// far fewer); a larger length is refused.
const MAX_PAYLOAD: usize = 512;

/// How often trusted names are resolved again: a balancer that restarts may
/// come back with another address, as a container does.
pub const REFRESH: Duration = Duration::from_secs(2);

/// Longest one resolution of a trusted name may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The balancers whose connections carry a PROXY header: IP addresses, and
/// host names resolved at start and every [`REFRESH`] after. A name that
/// never resolved trusts nobody. One whose lookup fails keeps the addresses
/// of its last good one: a resolver that fails for a moment (podman's did,
/// for 2 s, while a container started) must not cut the balancer off.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    addresses: Vec<IpAddr>,
    names: Vec<String>,
    /// Each name's addresses at its last good resolution.
    resolved: Arc<RwLock<BTreeMap<String, Vec<IpAddr>>>>,
}

impl PartialEq for TrustedProxies {
    fn eq(&self, other: &Self) -> bool {
        self.addresses == other.addresses && self.names == other.names
    }
}

impl Eq for TrustedProxies {}

impl TrustedProxies {
    /// IP addresses and host names separated by commas or spaces; empty: none.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut trusted = TrustedProxies::default();
        for s in list.split([',', ' ']).filter(|s| !s.is_empty()) {
            if let Ok(ip) = s.parse::<IpAddr>() {
                trusted.addresses.push(ip);
            } else if is_host_name(s) {
                trusted.names.push(s.to_owned());
            } else {
                return Err(format!(
                    "trusted proxy {s:?} is neither an IP address nor a host name"
                ));
            }
        }
        Ok(trusted)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.addresses.contains(&ip)
            || self
                .resolved
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .any(|addresses| addresses.contains(&ip))
    }

    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty() && self.names.is_empty()
    }

    /// What the list says, for the log: addresses, then names.
    pub fn entries(&self) -> Vec<String> {
        let addresses = self.addresses.iter().map(ToString::to_string);
        addresses.chain(self.names.iter().cloned()).collect()
    }

    /// Resolve the names now: each one that resolves gets its new
    /// addresses; one whose lookup fails keeps its previous ones.
    pub async fn resolve(&self) {
        for name in &self.names {
            let lookup = tokio::net::lookup_host((name.as_str(), 0));
            let mut found: Vec<IpAddr> = match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
                Ok(Ok(addrs)) => addrs.map(|a| a.ip()).collect(),
                Ok(Err(e)) => {
                    tracing::debug!(name, "trusted proxy did not resolve: {e}");
                    continue;
                }
                Err(_) => {
                    tracing::debug!(name, "trusted proxy: no answer within {RESOLVE_TIMEOUT:?}");
                    continue;
                }
            };
            found.sort();
            found.dedup();
            let mut resolved = self.resolved.write().unwrap_or_else(|e| e.into_inner());
            if resolved.get(name) != Some(&found) {
                tracing::info!(name, addresses = ?found, "trusted proxy resolved");
                resolved.insert(name.clone(), found);
            }
        }
    }

    /// Resolve the names every [`REFRESH`] until dropped (none: nothing).
    pub fn keep_resolving(&self) -> Option<tokio::task::JoinHandle<()>> {
        if self.names.is_empty() {
            return None;
        }
        let this = self.clone();
        Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH).await;
                this.resolve().await;
            }
        }))
    }
}

/// Letters, digits, hyphens and dots, as DNS host names are spelt.
fn is_host_name(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// Read the PROXY v2 header at the start of `stream` within `limit`: the
/// client's address, or `None` for the balancer's own connections (the
/// `LOCAL` command: its health checks). Consumes exactly the header.
pub async fn read_header(
    stream: &mut TcpStream,
    peer: IpAddr,
    limit: Duration,
) -> Result<IpAddr, String> {
    let read = async {
        let mut fixed = [0u8; 16];
        stream
            .read_exact(&mut fixed)
            .await
            .map_err(|e| format!("read the PROXY header: {e}"))?;
        if fixed[..PROTOCOL_PREFIX.len()] != *PROTOCOL_PREFIX {
            return Err("no PROXY protocol v2 header".to_owned());
        }
        let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
        if len > MAX_PAYLOAD {
            return Err(format!("a PROXY header of {len} bytes"));
        }
        let mut whole = fixed.to_vec();
        whole.resize(16 + len, 0);
        stream
            .read_exact(&mut whole[16..])
            .await
            .map_err(|e| format!("read the PROXY header: {e}"))?;
        let header = Header::try_from(&whole[..]).map_err(|e| format!("PROXY header: {e}"))?;
        Ok(match (header.command, header.addresses) {
            (Command::Local, _) => peer,
            (Command::Proxy, Addresses::IPv4(a)) => IpAddr::V4(a.source_address),
            (Command::Proxy, Addresses::IPv6(a)) => IpAddr::V6(a.source_address),
            (Command::Proxy, other) => {
                return Err(format!("a PROXY header without an IP address: {other:?}"))
            }
        })
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| format!("no PROXY header within {limit:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_takes_commas_and_spaces_addresses_and_names() {
        let t = TrustedProxies::parse("127.0.0.5, ::1 balancer").unwrap();
        assert!(t.contains("127.0.0.5".parse().unwrap()));
        assert!(t.contains("::1".parse().unwrap()));
        assert!(!t.contains("127.0.0.1".parse().unwrap()));
        assert_eq!(t.entries(), ["127.0.0.5", "::1", "balancer"]);
        assert!(TrustedProxies::parse("").unwrap().is_empty());
        assert!(TrustedProxies::parse("bal_ancer").is_err());
        assert!(TrustedProxies::parse("10.0.0.0/8").is_err());
        assert!(TrustedProxies::parse("-x").is_err());
    }

    #[tokio::test]
    async fn a_name_whose_lookup_fails_keeps_its_last_addresses() {
        // `.invalid` never resolves (RFC 6761).
        let t = TrustedProxies::parse("balancer.invalid").unwrap();
        t.resolve().await;
        assert!(
            !t.contains("127.0.0.9".parse().unwrap()),
            "never resolved: nobody"
        );
        t.resolved.write().unwrap().insert(
            "balancer.invalid".into(),
            vec!["127.0.0.9".parse().unwrap()],
        );
        t.resolve().await;
        assert!(
            t.contains("127.0.0.9".parse().unwrap()),
            "a failed lookup keeps the last good addresses"
        );
    }

    #[tokio::test]
    async fn a_name_is_trusted_once_it_resolves() {
        let t = TrustedProxies::parse("localhost").unwrap();
        // Not resolved yet: nobody is trusted.
        assert!(!t.contains("127.0.0.1".parse().unwrap()));
        t.resolve().await;
        assert!(t.contains("127.0.0.1".parse().unwrap()));
        assert!(!t.contains("127.0.0.2".parse().unwrap()));
    }
}
