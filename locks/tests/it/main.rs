//! The integration tests of the lock library, in one binary (one link, one
//! set of shared servers): a module per backend, against real servers
//! started by the `harness` crate, plus the generic lease logic on paused
//! time and the feature tree.
//!
//! The tests of this binary run in parallel threads of one process: each
//! uses its own database (lease tables), its own server (Redis, Redlock,
//! Sentinel) or its own lock names (the shared ZooKeeper server), and none
//! changes the process's environment. The one test that needs a process of
//! its own, the ZooKeeper holder that is SIGSTOPped, re-runs this binary
//! as a child.

mod feature_tree;
mod lease_table;
mod lock_api;
mod redis_acl;
mod redis_lock;
mod redis_sentinel;
mod redlock;
mod support;
mod zookeeper_acl;
mod zookeeper_lock;
mod zookeeper_planted;
mod zookeeper_recipes;
