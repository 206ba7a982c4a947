//! Lock backends with fencing tokens, and the page-editing workload on top.
//!
//! # Layout
//! - [`lock`]: the lock API ([`lock::LockService`], [`lock::Lease`],
//!   [`lock::Fencing`], [`lock::LockError`]) and one module per backend.

pub mod lock;
