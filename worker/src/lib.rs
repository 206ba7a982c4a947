//! Lock backends with fencing tokens, and the page-editing workload on top.
//!
//! # Layout
//! - [`lock`]: the lock API ([`lock::LockService`], [`lock::Lease`],
//!   [`lock::Fencing`], [`lock::LockError`]) and one module per backend.
//! - [`config`]: the `worker` binary's command line (clap, env fallbacks).
//! - [`backend`]: from `--backend` to a running [`lock::LockService`].
//! - [`client`]: the gateway's HTTP API (fenced GET/PUT, typed errors).
//! - [`workload`]: the edit loop ([`run`]): acquire, read, append, work,
//!   lost-lock check, write, release.
//! - [`events`]: JSONL events on stdout and the human logs beside them.

pub mod backend;
pub mod client;
pub mod config;
pub mod events;
pub mod lock;
pub mod workload;

pub use workload::run;
