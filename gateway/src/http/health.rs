//! Operations: liveness, readiness and the Prometheus metrics.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::openapi::{errors, AnyRequestErrors};
use crate::store;
use crate::AppState;

/// `/healthz`, `/readyz`, `/metrics`.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics_text))
}

/// `/healthz` and `/readyz` alone, for the probe listener.
pub(super) fn probes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/healthz", axum::routing::get(healthz))
        .route("/readyz", axum::routing::get(readyz))
}

/// `{"status": ...}`
#[derive(Serialize, ToSchema)]
pub struct Status {
    /// `up` (healthz), `ready` (readyz).
    #[schema(value_type = String, pattern = "^(up|ready)$")]
    pub status: &'static str,
}

/// Liveness: the process answers.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "operations",
    responses(
        (status = 200, description = "Up", body = Status, example = json!({"status": "up"})),
        AnyRequestErrors,
    )
)]
async fn healthz() -> Json<Status> {
    Json(Status { status: "up" })
}

errors!(ReadyErrors = [DatabaseUnavailable]);

/// Readiness: PostgreSQL answers a query (what a balancer checks).
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Status, example = json!({"status": "ready"})),
        ReadyErrors,
    )
)]
async fn readyz(State(state): State<AppState>) -> Result<Json<Status>, ApiError> {
    store::ping(&state.db).await?;
    Ok(Json(Status { status: "ready" }))
}

/// Prometheus metrics, in the text exposition format.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "operations",
    responses(
        (status = 200, description = "The Prometheus text format (version 0.0.4)",
            content_type = "text/plain", body = String),
        AnyRequestErrors,
    )
)]
async fn metrics_text(State(state): State<AppState>) -> Result<Response, ApiError> {
    let (content_type, text) = state
        .metrics
        .render()
        .map_err(|e| ApiError::Internal(format!("encode metrics: {e}")))?;
    Ok(([(CONTENT_TYPE, content_type)], text).into_response())
}
