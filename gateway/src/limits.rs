//! What one client may hold at once: connections and dashboard streams,
//! overall and per client address. Beyond a limit the gateway refuses at
//! once, 503 with `Retry-After`, and never queues: a queue of refused work
//! is what let a flood of anonymous streams starve the writers.
//!
//! - **Connections** are counted in the accept loop ([`crate::server`]):
//!   past [`crate::ServeOptions::max_connections`] overall or
//!   `max_connections_per_address` from one address, the connection is
//!   answered 503 `too_many_connections` and closed.
//! - **Dashboard streams** ([`StreamLimits`]) never end by themselves, and
//!   each holds a connection: a stream's slot is taken before its response
//!   and held by its body until the stream ends (a concurrency limit on the
//!   handler would free it once the head is sent).
//!
//! The client's address is the connection's peer ([`ClientAddr`]).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Extension;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// Default for `--max-streams`.
pub const DEFAULT_MAX_STREAMS: usize = 256;
/// Default for `--max-streams-per-address`.
pub const DEFAULT_MAX_STREAMS_PER_ADDRESS: usize = 16;
/// Default for `--max-connections-per-address`.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
/// The `Retry-After` of a refusal by a limit.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// The address of the client that sent a request: its connection's peer,
/// put in each request's extensions by the accept loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

impl ClientAddr {
    /// Requests served without the accept loop (a router called directly,
    /// as tests do) share one unknown address.
    pub fn or_unknown(client: Option<Extension<ClientAddr>>) -> IpAddr {
        client.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |Extension(c)| c.0)
    }
}

/// How many of something each address holds, at most `max`.
#[derive(Debug)]
pub struct PerAddress {
    max: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One held by an address; given back on drop.
#[derive(Debug)]
pub struct AddressSlot {
    owner: Arc<PerAddress>,
    ip: IpAddr,
}

impl PerAddress {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            held: Mutex::new(HashMap::new()),
        })
    }

    /// One more for `ip`, unless it holds `max` already.
    pub fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(ip).or_default();
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            owner: self.clone(),
            ip,
        })
    }

    /// How many `ip` holds.
    pub fn held(&self, ip: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut held = self.owner.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// The dashboard streams' limits.
#[derive(Debug, Clone)]
pub struct StreamLimits {
    all: Arc<Semaphore>,
    max: usize,
    per_address: Arc<PerAddress>,
}

/// A stream's slot, overall and for its address: held by the stream's body.
#[derive(Debug)]
pub struct StreamPermit {
    _all: OwnedSemaphorePermit,
    _address: AddressSlot,
}

impl StreamLimits {
    /// At most `max` streams, `per_address` of them from one address.
    pub fn new(max: usize, per_address: usize) -> Self {
        let max = max.max(1);
        Self {
            all: Arc::new(Semaphore::new(max)),
            max,
            per_address: PerAddress::new(per_address),
        }
    }

    /// A slot for a stream from `ip`, or 503 `too_many_streams` at once.
    pub fn try_open(&self, ip: IpAddr) -> Result<StreamPermit, ApiError> {
        let address = self
            .per_address
            .try_take(ip)
            .ok_or(ApiError::TooManyStreams {
                limit: self.per_address.max,
                per_address: true,
            })?;
        let all = self
            .all
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::TooManyStreams {
                limit: self.max,
                per_address: false,
            })?;
        Ok(StreamPermit {
            _all: all,
            _address: address,
        })
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.max - self.all.available_permits()
    }
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_STREAMS, DEFAULT_MAX_STREAMS_PER_ADDRESS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_share_and_gets_it_back_on_drop() {
        let per = PerAddress::new(2);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let one = per.try_take(a).unwrap();
        let _two = per.try_take(a).unwrap();
        assert!(per.try_take(a).is_none());
        assert!(
            per.try_take(b).is_some(),
            "another address is not held back"
        );
        drop(one);
        assert_eq!(per.held(a), 1);
        assert!(per.try_take(a).is_some());
    }

    #[test]
    fn streams_beyond_either_limit_are_refused_with_which() {
        let limits = StreamLimits::new(3, 2);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let _a1 = limits.try_open(a).unwrap();
        let _a2 = limits.try_open(a).unwrap();
        let refused = limits.try_open(a).unwrap_err();
        assert!(matches!(
            refused,
            ApiError::TooManyStreams {
                limit: 2,
                per_address: true
            }
        ));
        let b1 = limits.try_open(b).unwrap();
        let refused = limits.try_open(b).unwrap_err();
        assert!(matches!(
            refused,
            ApiError::TooManyStreams {
                limit: 3,
                per_address: false
            }
        ));
        assert_eq!(limits.open(), 3);
        drop(b1);
        assert!(limits.try_open(b).is_ok());
    }
}
