//! A page's history: `GET /pages/{id}/history`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorCode};
use crate::openapi::{errors, PageIdParam};
use crate::store::{self, HistoryEntry};
use crate::AppState;

use super::extractors::{PageId, QueryParams};
use super::sorted_json;

/// `GET /pages/{id}/history`.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(page_history))
}

/// `?limit=N`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HistoryParams {
    /// The newest `limit` attempts, 1 to 10000 (default 100).
    #[param(minimum = 1, maximum = 10000, example = 3)]
    limit: Option<i64>,
}

/// A page's attempts, newest first.
#[derive(Serialize, ToSchema)]
pub struct History {
    pub id: String,
    pub history: Vec<HistoryEntry>,
}

errors!(
    PageHistoryErrors = [
        InvalidPageId,
        InvalidPath,
        InvalidLimit,
        InvalidQuery,
        NotFound,
        DatabaseUnavailable,
    ]
);

/// A page's history: every fenced read, write, refusal and admin change.
///
/// Public. Newest first; `seq` increases in commit order. Requests refused
/// before reaching the page (400, 401, 403, 413, 415, 428, 409
/// `unknown_issuer`, 503) leave no history. A page never accessed has an
/// empty one.
#[utoipa::path(
    get,
    path = "/pages/{id}/history",
    operation_id = "page_history",
    tag = "pages",
    params(PageIdParam, HistoryParams),
    responses(
        (status = 200, description = "The attempts, newest first", body = History),
        PageHistoryErrors,
    )
)]
async fn page_history(
    State(state): State<AppState>,
    PageId(id): PageId,
    QueryParams(params): QueryParams<HistoryParams>,
) -> Result<Response, ApiError> {
    let limit = params.limit.unwrap_or(100);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidLimit,
            "limit must be from 1 to 10000",
        ));
    }
    let history = store::history(&state.reads, &id, limit).await?;
    Ok(sorted_json(&History { id, history })?.into_response())
}
