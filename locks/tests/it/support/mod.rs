//! Shared test bodies.

pub mod contract;
