//! Real services for tests, never mocks.
//!
//! Each service runs from its Debian package on a free port with its data in a
//! temp dir, is waited for with a bounded retry (its log goes into the panic
//! message when it does not come up), and is killed and reaped on drop. Every
//! one offers the controls chaos tests need: kill (a crash), start again on the
//! same port and data, and pause/resume (SIGSTOP/SIGCONT of its process group).
//!
//! # Layout
//! - [`process`]: one child process, spawned so that it dies with the test binary.
//! - [`service`]: the lifecycle every server shares ([`Server`]), and the
//!   [`Service`] trait by which each says only what is its own; [`Database`]
//!   for the SQL servers (a fresh database per test).
//! - [`postgres`]: PostgreSQL, plus [`fresh_database`] (one new database per test).
//! - [`replication`]: a PostgreSQL primary with a streaming standby (async or
//!   sync), a cuttable replication link, promotion.
//! - [`haproxy`]: HAProxy balancing HTTP over gateways, health-checked on `/readyz`.
//! - [`redis`]: redis-server, with or without persistence, open or with
//!   ACL users ([`redis_acl`]: one user per role, their rules and test
//!   passwords).
//! - [`mariadb`]: MariaDB, plus [`fresh_mysql_database`].
//! - [`zookeeper`]: ZooKeeper, standalone, or a three-node ensemble on loopback.
//! - [`zookeeper_hosts`]: a three-node ensemble whose servers each live in
//!   their own network namespace, so that one can be cut off ([`netns`]).
//! - [`proxy`]: proxies between a client and a server that delay or hold its
//!   bytes, or lose one ZooKeeper reply (or send one request twice), on purpose.
//! - [`sentinel`]: a Redis master, its replica and three sentinels.
//! - [`stack`]: `scripts/stack`, the whole demo topology, on free ports.
//! - [`transcript`]: the README's checked ```` ```console ```` transcripts and
//!   the checker that runs them (against `scripts/stack` or the containers).
//! - [`procs`]: the project's own binaries (worker, gateway) as processes,
//!   and the log of the workers' JSONL events.
//! - [`worker_proc`]: one worker process, its events as a stream.
//! - [`faults`]: the fault catalogue of the chaos rows and the soak, each
//!   fault with its inject and its heal.
//! - [`python`]: Python tools (schemathesis, the benchmark's peers) in venvs under `target/`.

pub mod faults;
pub mod haproxy;
pub mod mariadb;
pub mod netns;
pub mod postgres;
pub mod process;
pub mod procs;
pub mod proxy;
pub mod python;
pub mod redis;
pub mod redis_acl;
pub mod replication;
pub mod sentinel;
pub mod service;
pub mod stack;
pub mod transcript;
pub mod worker_proc;
pub mod zookeeper;
pub mod zookeeper_hosts;

pub use haproxy::Haproxy;
pub use mariadb::{fresh_mysql_database, MariaDb};
pub use postgres::{fresh_database, Postgres};
pub use process::{free_port, scratch_dir, wait_until, ServiceProcess};
pub use proxy::{DelayProxy, ZooKeeperProxy};
pub use redis::{Persistence, Redis};
pub use replication::{PostgresPair, Replication};
pub use sentinel::SentinelGroup;
pub use service::{Database, Server, Service};
pub use zookeeper::ZooKeeper;
pub use zookeeper_hosts::ZooKeeperHosts;
