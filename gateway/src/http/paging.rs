//! Keyset pagination of the public lists (`/pages`, a page's history): a
//! small default, a bounded maximum, and the next page's URL in a `Link`
//! header (RFC 8288, as GitHub's API does) so that bodies stay as they were.
//! A client that does not read headers pages on by itself: the next page
//! starts after the last item it got.

use axum::http::header::LINK;
use axum::http::HeaderValue;
use axum::response::Response;

use crate::error::{ApiError, ErrorCode};

/// Items per page when `limit` is not given.
pub const DEFAULT_LIMIT: i64 = 100;
/// Most items per page.
pub const MAX_LIMIT: i64 = 1000;

/// `limit`, checked: 1 to [`MAX_LIMIT`], by default [`DEFAULT_LIMIT`].
pub fn limit(given: Option<i64>) -> Result<i64, ApiError> {
    let limit = given.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidLimit,
            format!("limit must be from 1 to {MAX_LIMIT}"),
        ));
    }
    Ok(limit)
}

/// Add `Link: <next>; rel="next"` when the page is full (there may be more).
pub fn link_next(mut response: Response, full: bool, next: impl FnOnce() -> String) -> Response {
    if full {
        if let Ok(value) = HeaderValue::from_str(&format!("<{}>; rel=\"next\"", next())) {
            response.headers_mut().insert(LINK, value);
        }
    }
    response
}
