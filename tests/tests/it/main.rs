//! The harness crate's integration tests, in one binary (one link, and the
//! services a test binary shares, such as [`harness::fresh_database`]'s
//! server, started once for all of them). Tests run in parallel threads of
//! this one process; a test that starts a whole `scripts/stack` waits for a
//! free place among [`harness::stack::MAX_AT_ONCE`].
//!
//! - [`compose`]: compose.yaml, the Dockerfile and scripts/stack agree with
//!   the binaries (nothing started);
//! - [`compose_smoke`]: `docker compose up` for real, with podman, and the
//!   tutorial and scripts/demo followed against the containers; only when
//!   `COMPOSE_SMOKE=1` (scripts/compose-smoke runs it alone, with the filter
//!   `compose_smoke::`);
//! - [`tutorial`]: docs/TUTORIAL.md's transcripts and demos, and
//!   scripts/demo, against `scripts/stack`;
//! - [`dashboard`]: the dashboard in headless Chromium, against `scripts/stack`;
//! - [`stack_fairness`]: the workers of `scripts/stack` take fair turns with Redis;
//! - [`openapi_fuzz`]: schemathesis against the gateway's OpenAPI description;
//! - [`operations_doc`]: docs/OPERATIONS.md's settings against `--help`;
//! - [`worker_e2e`]: the worker binary against real lock services and a gateway;
//! - [`services`], [`replicated_services`]: the harness's own services.

mod compose;
mod compose_smoke;
mod dashboard;
mod openapi_fuzz;
mod operations_doc;
mod replicated_services;
mod services;
mod stack_fairness;
mod tutorial;
mod worker_e2e;
