//! The page-editing workload: edit a page through the gateway under a lock
//! from the lock library ([`fencelock`], in `locks/`), sending the grant's
//! fencing token with every read and write.
//!
//! # Layout
//! - [`config`]: the `worker` binary's command line (clap, env fallbacks).
//! - [`backend`]: from `--backend` to a running [`fencelock::LockService`].
//! - [`client`]: the gateway's HTTP API (fenced GET/PUT, typed errors).
//! - [`workload`]: the edit loop ([`run`]): acquire, read, append, work,
//!   lost-lock check, write, release.
//! - [`events`]: JSONL events on stdout and the human logs beside them.
//! - [`log_writer`]: the threads that write them, so an unread pipe never
//!   blocks the edit loop.
//! - [`hold`]: `worker lock` / `worker unlock`, a lock held from the command
//!   line (the tutorial's curl writes use its token).

pub mod backend;
pub mod client;
pub mod config;
pub mod events;
pub mod hold;
pub mod log_writer;
pub mod workload;

pub use workload::run;
