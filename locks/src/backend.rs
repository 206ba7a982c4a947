//! The names of the lock services this crate speaks to, whether or not
//! their feature is on: what a command line, a config file or a report
//! calls them. Each name is also the issuer that the backend's leases carry
//! ([`Lease::issuer`](crate::Lease::issuer)).

use std::fmt;
use std::str::FromStr;

/// A lock service of this crate, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    /// One Redis server (feature `redis`).
    Redis,
    /// A Redis master found through Sentinel (feature `redis-sentinel`).
    RedisSentinel,
    /// N independent Redis masters (feature `redlock`); no token.
    Redlock,
    /// A ZooKeeper ensemble (feature `zookeeper`).
    Zookeeper,
    /// A lease table in PostgreSQL (feature `lease-postgres`).
    LeasePostgres,
    /// A lease table in MySQL/MariaDB (feature `lease-mysql`).
    LeaseMysql,
}

impl Backend {
    /// Every backend, in the order reports list them.
    pub const ALL: [Backend; 6] = [
        Backend::Redis,
        Backend::Redlock,
        Backend::Zookeeper,
        Backend::LeasePostgres,
        Backend::LeaseMysql,
        Backend::RedisSentinel,
    ];

    /// The names of [`Backend::ALL`], in the same order.
    pub const NAMES: [&'static str; 6] = [
        "redis",
        "redlock",
        "zookeeper",
        "lease-postgres",
        "lease-mysql",
        "redis-sentinel",
    ];

    /// The name, which is also the issuer of its leases: `redis`,
    /// `redis-sentinel`, `redlock`, `zookeeper`, `lease-postgres`,
    /// `lease-mysql`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::RedisSentinel => "redis-sentinel",
            Backend::Redlock => "redlock",
            Backend::Zookeeper => "zookeeper",
            Backend::LeasePostgres => "lease-postgres",
            Backend::LeaseMysql => "lease-mysql",
        }
    }

    /// Whether its grants carry a fencing token. Redlock's do not: its
    /// masters share no counter, so no number it could hand out is ordered
    /// across grants ([`Fencing::Unfenced`](crate::Fencing::Unfenced)).
    pub fn mints_tokens(self) -> bool {
        self != Backend::Redlock
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Backend::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown lock backend {0:?}: expected one of {names}", names = Backend::NAMES.join(", "))]
pub struct UnknownBackend(pub String);

impl FromStr for Backend {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| UnknownBackend(s.to_string()))
    }
}

#[cfg(feature = "clap")]
impl clap::ValueEnum for Backend {
    fn value_variants<'a>() -> &'a [Self] {
        &Backend::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

impl serde::Serialize for Backend {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Backend {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_the_order_of_all() {
        for (b, name) in Backend::ALL.into_iter().zip(Backend::NAMES) {
            assert_eq!(b.name(), name);
            assert_eq!(name.parse::<Backend>(), Ok(b));
        }
        assert!("zk".parse::<Backend>().is_err());
    }
}
