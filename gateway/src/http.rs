//! Routes, request validation and responses. Every decision about a page is
//! taken by the database in [`store::fenced_access`]; this file only parses
//! and answers.

use std::time::Duration;

use axum::extract::{
    DefaultBodyLimit, FromRequest, FromRequestParts, MatchedPath, Path, Query, Request, State,
};
use axum::http::header::{ETAG, IF_MATCH};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use crate::error::ApiError;
use crate::metrics::{self, Outcome};
use crate::store::{self, Access, Page, Verdict};
use crate::{AppState, FenceCheck};
use fencelock::Token;

/// Largest accepted request body.
pub const BODY_LIMIT: usize = 1024 * 1024;
/// Longest a request may take before it is answered 504.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The whole HTTP API with its layers.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/pages", get(list_pages))
        .route("/pages/{id}", get(get_page).put(put_page))
        .route("/pages/{id}/history", get(page_history))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .merge(crate::dashboard::router())
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn(timeout))
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

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::Internal("handler panicked".into()).into_response()
}

async fn timeout(req: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout.into_response(),
    }
}

async fn no_route(req: Request) -> ApiError {
    ApiError::NoRoute(format!("{} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

// ---- extractors: our JSON errors instead of axum's plain text ----

/// A validated page id, `[A-Za-z0-9_-]{1,128}`.
pub struct PageId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PageId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state).await?;
        let valid = (1..=128).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(ApiError::bad_request(
                "invalid_page_id",
                "page ids are 1 to 128 characters of A-Z, a-z, 0-9, '_' and '-'",
            ));
        }
        Ok(PageId(id))
    }
}

/// `axum::Json` with our rejections.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let Json(value) = Json::<T>::from_request(req, state).await?;
        Ok(JsonBody(value))
    }
}

/// `axum::extract::Query` with our rejections.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(value) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(QueryParams(value))
    }
}

/// The fencing headers of a request, validated.
#[derive(Debug)]
pub struct FencingHeaders {
    pub token: Option<Token>,
    pub issuer: String,
    pub client_id: Option<String>,
    pub if_match: Option<i64>,
}

impl<S: Send + Sync> FromRequestParts<S> for FencingHeaders {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parse_headers(&parts.headers)
    }
}

fn header<'h>(
    headers: &'h HeaderMap,
    name: &str,
    code: &'static str,
) -> Result<Option<&'h str>, ApiError> {
    let mut values = headers.get_all(name).iter();
    match values.next() {
        None => Ok(None),
        Some(_) if values.next().is_some() => Err(ApiError::bad_request(
            code,
            format!("{name} must be sent at most once"),
        )),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim()))
            .map_err(|_| ApiError::bad_request(code, format!("{name} must be visible ASCII"))),
    }
}

/// Parse `Fencing-Token`, `Fencing-Issuer`, `Client-Id` and `If-Match`.
pub fn parse_headers(headers: &HeaderMap) -> Result<FencingHeaders, ApiError> {
    let token = match header(headers, "fencing-token", "invalid_fencing_token")? {
        None => None,
        Some(s) => Some(s.parse::<Token>().map_err(|_| {
            ApiError::bad_request(
                "invalid_fencing_token",
                format!(
                    "Fencing-Token must be a decimal integer from 0 to {}, got {s:?}",
                    i64::MAX
                ),
            )
        })?),
    };
    let issuer = match header(headers, "fencing-issuer", "invalid_fencing_issuer")? {
        None => "default".to_owned(),
        Some(s) => {
            let valid = (1..=64).contains(&s.len())
                && s.bytes().all(|b| {
                    b.is_ascii_lowercase()
                        || b.is_ascii_digit()
                        || matches!(b, b'.' | b'_' | b':' | b'-')
                });
            if !valid {
                return Err(ApiError::bad_request(
                    "invalid_fencing_issuer",
                    format!("Fencing-Issuer must match [a-z0-9._:-]{{1,64}}, got {s:?}"),
                ));
            }
            s.to_owned()
        }
    };
    let client_id = match header(headers, "client-id", "invalid_client_id")? {
        None => None,
        Some(s) if (1..=128).contains(&s.len()) => Some(s.to_owned()),
        Some(_) => {
            return Err(ApiError::bad_request(
                "invalid_client_id",
                "Client-Id must be 1 to 128 visible ASCII characters",
            ))
        }
    };
    let if_match = match header(headers, IF_MATCH.as_str(), "invalid_if_match")? {
        None => None,
        Some(s) => Some(parse_etag(s).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_if_match",
                format!("If-Match must be a quoted version such as \"3\", got {s:?}"),
            )
        })?),
    };
    Ok(FencingHeaders {
        token,
        issuer,
        client_id,
        if_match,
    })
}

/// `0..=i64::MAX`, plain decimal digits (no sign, no spaces inside).
fn parse_version(s: &str) -> Option<i64> {
    s.parse::<Token>().ok().map(Token::to_i64)
}

/// `"3"` (also `W/"3"` and a bare `3`) to a version.
fn parse_etag(s: &str) -> Option<i64> {
    let s = s.strip_prefix("W/").unwrap_or(s);
    let s = s
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s);
    parse_version(s)
}

// ---- handlers ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutBody {
    body: String,
}

fn page_response(status: StatusCode, page: Page, outcome: &'static str) -> Response {
    let etag =
        HeaderValue::from_str(&format!("\"{}\"", page.version)).expect("digits are a valid header");
    let mut response = (status, [(ETAG, etag)], Json(page)).into_response();
    response.extensions_mut().insert(Outcome(outcome));
    response
}

/// Turn a rejecting verdict into its error, using the row as it is now.
fn rejection(verdict: Verdict, access: &Access<'_>, row: &store::Row) -> Option<ApiError> {
    let fence = row.fence.clone();
    match verdict {
        Verdict::Accepted | Verdict::Stale => None,
        Verdict::StaleToken => Some(ApiError::StaleToken {
            offered: access.token.unwrap_or(Token::MIN),
            current: fence.as_ref().map_or(Token::MIN, |f| f.token),
            issuer: access.issuer.to_owned(),
        }),
        Verdict::IssuerMismatch => Some(ApiError::IssuerMismatch {
            offered: access.issuer.to_owned(),
            current: fence.map(|f| f.issuer).unwrap_or_default(),
        }),
        Verdict::VersionMismatch => Some(ApiError::VersionMismatch {
            expected: access.if_match.unwrap_or_default(),
            current: row.body.as_ref().map(|_| row.version),
        }),
    }
}

fn outcome_label(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Stale => "stale",
        _ => "accepted",
    }
}

#[tracing::instrument(skip_all, fields(page = %id, token = ?h.token, issuer = %h.issuer))]
async fn get_page(
    State(state): State<AppState>,
    PageId(id): PageId,
    h: FencingHeaders,
) -> Result<Response, ApiError> {
    let Some(token) = h.token else {
        let page = store::read(&state.db, &id)
            .await?
            .ok_or(ApiError::PageNotFound { id, fence: None })?;
        return Ok(page_response(StatusCode::OK, page, "read"));
    };
    let access = Access {
        id: &id,
        write: None,
        token: Some(token),
        issuer: &h.issuer,
        if_match: None,
        enforce: state.fencing == FenceCheck::Enforce,
        client_id: h.client_id.as_deref(),
    };
    let (verdict, row) = store::fenced_access(&state.db, &access).await?;
    if let Some(err) = rejection(verdict, &access, &row) {
        return Err(err);
    }
    let fence = row.fence.clone();
    match row.page() {
        Some(page) => Ok(page_response(StatusCode::OK, page, outcome_label(verdict))),
        None => Err(ApiError::PageNotFound { id, fence }),
    }
}

#[tracing::instrument(skip_all, fields(page = %id, token = ?h.token, issuer = %h.issuer))]
async fn put_page(
    State(state): State<AppState>,
    PageId(id): PageId,
    h: FencingHeaders,
    JsonBody(put): JsonBody<PutBody>,
) -> Result<Response, ApiError> {
    if put.body.contains('\0') {
        return Err(ApiError::bad_request(
            "invalid_body",
            "body must not contain NUL characters",
        ));
    }
    let enforce = state.fencing == FenceCheck::Enforce;
    if enforce && h.token.is_none() {
        return Err(ApiError::FencingTokenRequired);
    }
    let access = Access {
        id: &id,
        write: Some(&put.body),
        token: h.token,
        issuer: &h.issuer,
        if_match: h.if_match,
        enforce,
        client_id: h.client_id.as_deref(),
    };
    let (verdict, row) = store::fenced_access(&state.db, &access).await?;
    if let Some(err) = rejection(verdict, &access, &row) {
        return Err(err);
    }
    let page = row
        .page()
        .ok_or_else(|| ApiError::Internal("accepted write left no body".into()))?;
    // Version 1 is the first accepted write (there is no delete).
    let status = if page.version == 1 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    tracing::info!(
        version = page.version,
        outcome = outcome_label(verdict),
        "written"
    );
    Ok(page_response(status, page, outcome_label(verdict)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryParams {
    limit: Option<i64>,
}

async fn page_history(
    State(state): State<AppState>,
    PageId(id): PageId,
    QueryParams(params): QueryParams<HistoryParams>,
) -> Result<Response, ApiError> {
    let limit = params.limit.unwrap_or(100);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::bad_request(
            "invalid_limit",
            "limit must be from 1 to 10000",
        ));
    }
    let history = store::history(&state.db, &id, limit).await?;
    Ok(Json(json!({"id": id, "history": history})).into_response())
}

async fn list_pages(State(state): State<AppState>) -> Result<Response, ApiError> {
    let rows = store::list(&state.db).await?;
    let pages: Vec<_> = rows
        .into_iter()
        .map(|r| json!({"id": r.id, "version": r.version, "fence": r.fence}))
        .collect();
    Ok(Json(json!({"pages": pages})).into_response())
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "up"}))
}

async fn readyz(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    store::ping(&state.db).await?;
    Ok(Json(json!({"status": "ready"})))
}

async fn metrics_text(State(state): State<AppState>) -> Response {
    state.metrics.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_are_quoted_versions() {
        assert_eq!(parse_etag("\"3\""), Some(3));
        assert_eq!(parse_etag("W/\"3\""), Some(3));
        assert_eq!(parse_etag("3"), Some(3));
        assert_eq!(parse_etag("\"x\""), None);
    }
}
