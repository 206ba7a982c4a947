//! A private ZooKeeper 3.8 from Debian's `zookeeper` package: standalone
//! ([`ZooKeeper`]) or a three-server ensemble on loopback
//! ([`ZooKeeperEnsemble`]); [`crate::zookeeper_hosts`] puts the same
//! ensemble on three network namespaces.
//!
//! - [`node`]: one server's config file and command, and the four-letter
//!   words that tell whether it serves.
//! - [`standalone`]: one server, as a [`crate::service::Service`].
//! - [`ensemble`]: three servers forming one quorum, wherever they run.
//! - [`secured`]: a standalone server with a superuser and the lock roots
//!   prepared, as the stack runs it.

pub mod ensemble;
pub mod node;
pub mod secured;
pub mod standalone;

pub use ensemble::{Ensemble, Loopback, ZooKeeperEnsemble};
pub use node::{four_letter, java_args};
pub use secured::SecuredZooKeeper;
pub use standalone::{ZooKeeper, ZooKeeperService};
