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
use super::paging;
use super::sorted_json;

/// `GET /pages/{id}/history`.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(page_history))
}

/// `?limit=N&before=SEQ`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HistoryParams {
    /// The newest `limit` attempts, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000, example = 3)]
    limit: Option<i64>,
    /// Only attempts with a `seq` below this: the next page starts below
    /// the last `seq` of the one before (the `Link` header names it).
    #[param(minimum = 1)]
    before: Option<i64>,
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
/// before reaching the page (400, 401, 403, 413, 415, 428, 429, 409
/// `unknown_issuer`, 503) leave no history. A page never accessed has an
/// empty one.
#[utoipa::path(
    get,
    path = "/pages/{id}/history",
    operation_id = "page_history",
    tag = "pages",
    params(PageIdParam, HistoryParams),
    responses(
        (status = 200, description = "The attempts, newest first", body = History,
            headers(("Link" = String, description = "`<...?limit=N&before=SEQ>; rel=\"next\"` \
                when `limit` attempts were answered: the next (older) page"))),
        PageHistoryErrors,
    )
)]
async fn page_history(
    State(state): State<AppState>,
    PageId(id): PageId,
    QueryParams(params): QueryParams<HistoryParams>,
) -> Result<Response, ApiError> {
    let limit = paging::limit(params.limit)?;
    let before = match params.before {
        None => i64::MAX,
        Some(seq) if seq >= 1 => seq,
        Some(_) => {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidQuery,
                "before must be a seq of 1 or more",
            ))
        }
    };
    let history = store::history(&state.reads, &id, limit, before).await?;
    let full = history.len() as i64 == limit;
    let last = history.last().map_or(0, |h| h.seq);
    let next = || format!("/pages/{id}/history?limit={limit}&before={last}");
    let response = sorted_json(&History {
        id: id.clone(),
        history,
    })?
    .into_response();
    Ok(paging::link_next(response, full, next))
}
