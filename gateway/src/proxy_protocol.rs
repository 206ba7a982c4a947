//! The client's real address behind a balancer: the PROXY protocol v2
//! header (HAProxy's `send-proxy-v2`) that a trusted balancer sends before
//! each connection's first byte. Only the addresses in `--trusted-proxies`
//! may send one, and from them it is required: a connection that does not
//! start with a valid header is closed. Anybody else's connection is HTTP
//! from its first byte, so a client cannot claim another address.

use std::net::IpAddr;
use std::time::Duration;

use ppp::v2::{Addresses, Command, Header, PROTOCOL_PREFIX};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Most bytes of addresses and TLVs after the fixed part (HAProxy sends
/// far fewer); a larger length is refused.
const MAX_PAYLOAD: usize = 512;

/// The balancers whose connections carry a PROXY header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpAddr>);

impl TrustedProxies {
    /// Addresses separated by commas or spaces; empty: none.
    pub fn parse(list: &str) -> Result<Self, String> {
        list.split([',', ' '])
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<IpAddr>()
                    .map_err(|_| format!("trusted proxy {s:?} is not an IP address"))
            })
            .collect::<Result<_, _>>()
            .map(TrustedProxies)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn addresses(&self) -> &[IpAddr] {
        &self.0
    }
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
    fn the_list_takes_commas_and_spaces_and_refuses_names() {
        let t = TrustedProxies::parse("127.0.0.5, ::1").unwrap();
        assert!(t.contains("127.0.0.5".parse().unwrap()));
        assert!(t.contains("::1".parse().unwrap()));
        assert!(!t.contains("127.0.0.1".parse().unwrap()));
        assert!(TrustedProxies::parse("").unwrap().is_empty());
        assert!(TrustedProxies::parse("balancer").is_err());
    }
}
