//! The project's own binaries as child processes: the worker (whose JSONL
//! events scripts wait on) and the gateway.
//!
//! Scripts spawn the real binaries rather than linking the libraries, so a
//! SIGSTOP stops a whole client, a SIGKILL is a real crash, and a worker can
//! run under libfaketime. Build them first: `cargo build --workspace --bins`
//! (`scripts/test` does).
//!
//! - [`binary`](mod@binary): where the binaries are, pinned for the whole run.
//! - [`events`]: the workers' events and the log scripts wait on.
//! - [`worker`]: one worker process ([`WorkerProc`], started from a [`WorkerSpec`]).
//! - [`gateway`]: one gateway process ([`GatewayProc`]), the test clients and their keys.

pub mod binary;
pub mod events;
pub mod gateway;
pub mod worker;

pub use binary::binary;
pub use events::{now_ms, Event, EventLog};
pub use gateway::{api_key, GatewayProc, CLIENTS};
pub use worker::{WorkerProc, WorkerSpec};
