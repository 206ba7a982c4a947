//! The HTTP API: the routes by resource, the layers every request passes
//! through, and the OpenAPI description made from these very routes. Every
//! decision about a page's fence is taken by the database in
//! [`crate::store::fenced_access`]; before it, the handlers authenticate the
//! caller ([`extractors`]) and ask the token's issuer whether the token is
//! current (`issuer_check.rs`).
//!
//! # Layout
//! - [`extractors`]: page ids, JSON bodies, query strings, the fencing
//!   headers and the admin's key, each refused with our JSON error.
//! - `deadline.rs`: the request deadline and the fenced statement run in a
//!   task of its own ([`Deadlines`]).
//! - `issuer_check.rs`: Chubby's `CheckSequencer`, and why check-then-write
//!   is safe.
//! - `pages.rs`: `GET /pages`, `GET` and `PUT /pages/{id}`.
//! - `history.rs`: `GET /pages/{id}/history`.
//! - `paging.rs`: their keyset pagination (`limit`, and `Link` to the next).
//! - `admin.rs`: `POST /admin/pages/{id}/fence`.
//! - `health.rs`: `/healthz`, `/readyz`, `/metrics`.
//!
//! Each of them offers `router()`; [`api`] merges them with the dashboard's
//! and the description's own routes.

mod admin;
mod deadline;
pub mod extractors;
mod health;
mod history;
mod issuer_check;
mod pages;
mod paging;

use std::sync::LazyLock;

use axum::extract::{DefaultBodyLimit, Extension, MatchedPath, Request};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::Value;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;
use utoipa_axum::router::OpenApiRouter;

use crate::error::ApiError;
use crate::{metrics, openapi, AppState};

pub use deadline::{Deadlines, Sent, OUTCOME_WAIT, REQUEST_TIMEOUT};
pub use extractors::{parse_headers, Admin, FencingHeaders, JsonBody, PageId, QueryParams};

/// Largest accepted request body.
pub const BODY_LIMIT: usize = 1024 * 1024;

/// Every route with its description: a handler is routed by the path and
/// method of its `#[utoipa::path]` annotation, so the routes and the
/// OpenAPI description ([`description`]) come from one place.
pub fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::base())
        .merge(pages::router())
        .merge(history::router())
        .merge(admin::router())
        .merge(health::router())
        .merge(crate::dashboard::router())
        .merge(openapi::router())
}

/// The description of [`api`] (OpenAPI 3.1, see [`openapi`]), made once.
pub fn description() -> &'static Value {
    static SPEC: LazyLock<Value> = LazyLock::new(|| openapi::document(api().split_for_parts().1));
    &SPEC
}

/// [`description`] as JSON text, pretty-printed: what `GET /openapi.json`
/// answers.
pub fn description_json() -> &'static str {
    static JSON: LazyLock<String> = LazyLock::new(|| {
        serde_json::to_string_pretty(description()).expect("the description is JSON")
    });
    &JSON
}

/// The whole HTTP API with its layers.
pub fn router(state: AppState) -> Router {
    let (routes, _) = api().split_for_parts();
    routes
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(Extension(openapi::Served(description_json())))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            deadline::deadline,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .layer(TraceLayer::new_for_http().make_span_with(|req: &Request| {
            let path = req
                .extensions()
                .get::<MatchedPath>()
                .map_or(req.uri().path(), MatchedPath::as_str);
            tracing::info_span!("request", method = %req.method(), path)
        }))
        .layer(CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

/// The probes alone (`/healthz`, `/readyz`), for a listener of their own
/// (`--probe-listen`): the balancer's and the orchestrator's checks, which
/// a flood of clients would otherwise find refused at the main listener's
/// connection cap.
pub fn probes(state: AppState) -> Router {
    health::probes()
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::Internal("handler panicked".into()).into_response()
}

async fn no_route(req: Request) -> ApiError {
    ApiError::NoRoute(format!("{} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// The body serialized with its keys sorted, as `json!` writes them (the
/// README's tutorial shows them so).
fn sorted_json<T: Serialize>(value: &T) -> Result<Json<Value>, ApiError> {
    serde_json::to_value(value)
        .map(Json)
        .map_err(|e| ApiError::Internal(format!("encode response: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_is_openapi_3_1_with_every_route() {
        let spec = description();
        assert_eq!(spec["openapi"], "3.1.0");
        let paths: Vec<&str> = spec["paths"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        for path in [
            "/pages",
            "/pages/{id}",
            "/pages/{id}/history",
            "/admin/pages/{id}/fence",
            "/healthz",
            "/readyz",
            "/metrics",
            "/",
            "/dashboard",
            "/dashboard/events",
            "/openapi.json",
            "/docs/",
        ] {
            assert!(paths.contains(&path), "{path} missing from {paths:?}");
        }
    }

    #[test]
    fn every_error_code_has_a_component_in_the_description() {
        for code in crate::error::ErrorCode::ALL {
            let schema = &description()["components"]["schemas"][openapi::error_schema_name(code)];
            assert_eq!(
                schema["properties"]["error"]["enum"],
                serde_json::json!([code.as_str()]),
                "{code:?}"
            );
        }
    }
}
