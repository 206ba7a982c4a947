//! The gateway's integration tests, one binary: a module per concern,
//! `common` the helpers they share. Every test has its own database (or
//! servers of its own), so the tests run side by side in threads as they
//! did in processes.

mod common;

mod api;
mod auth;
mod contract;
mod dashboard;
mod deadline;
mod failover;
mod forgery;
mod issuers;
mod limits;
mod outage;
mod page_issuers;
mod pool;
mod privileges;
mod redaction;
mod roles;
mod unfenced;
