//! The `worker` binary end to end: real lock services, a real gateway on a real
//! PostgreSQL, and worker processes whose JSONL events the tests follow.
//!
//! Trust is on as in the demo: the gateway requires API keys (one per test
//! client; each worker sends its own) and, with its fence on, checks tokens
//! with the lock service the workers use (unless a test says otherwise).
//!
//! Build the binaries first (`cargo build --workspace --bins`; `scripts/test`
//! does it): the tests spawn `target/<profile>/worker`.
//!
//! - [`support`]: the lock service, the gateway and the workers of a test
//!   ([`support::Scene`]), and a finished worker's summary
//!   ([`support::Ran`]);
//! - [`edits`]: three workers on one page, every backend;
//! - [`pauses`]: a worker stopped past its TTL, with and without fencing;
//! - [`lifecycle`]: SIGTERM, `--duration`, refused configurations, services
//!   that are not there yet, an unknown write outcome;
//! - [`trust`]: keys, issuers, and `worker lock` for a person with curl;
//! - [`undrained`]: two workers whose output nobody reads until they exit.

mod edits;
mod lifecycle;
mod pauses;
mod support;
mod trust;
mod undrained;
