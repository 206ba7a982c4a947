//! The pages: `GET /pages`, and `GET` and `PUT /pages/{id}`, plain or fenced.

use axum::extract::{Extension, State};
use axum::http::header::ETAG;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use fencelock::Token;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorCode};
use crate::metrics::Outcome;
use crate::openapi::{self, errors, PageIdParam, ReadHeaders, WriteHeaders};
use crate::store::{self, Access, Fence, Page, Verdict};
use crate::{AppState, FenceCheck};

use super::deadline::{run_fenced, Sent};
use super::extractors::{FencingHeaders, JsonBody, PageId, QueryParams};
use super::issuer_check::check_with_issuer;
use super::paging;
use super::sorted_json;

/// `GET /pages`, `GET` and `PUT /pages/{id}`.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_pages))
        .routes(routes!(get_page, put_page))
}

/// A page's new text.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutBody {
    /// The whole text. No NUL characters (400 `invalid_body`): PostgreSQL's
    /// text cannot hold them.
    #[schema(pattern = "^[^\\u0000]*$")]
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
fn rejection(verdict: Verdict, access: &Access, row: &store::Row) -> Option<ApiError> {
    let fence = row.fence.clone();
    match verdict {
        Verdict::Accepted | Verdict::Stale => None,
        Verdict::StaleToken => Some(ApiError::StaleToken {
            offered: access.token.unwrap_or(Token::MIN),
            current: fence.as_ref().map_or(Token::MIN, |f| f.token),
            issuer: access.issuer.clone(),
        }),
        Verdict::IssuerMismatch => Some(ApiError::IssuerMismatch {
            offered: access.issuer.clone(),
            // The fence's, or, on a page not fenced yet, the rule's.
            current: fence
                .map(|f| f.issuer)
                .or_else(|| access.page_issuer.clone())
                .unwrap_or_default(),
        }),
        Verdict::NoIssuerForPage => Some(ApiError::NoIssuerForPage {
            id: access.id.clone(),
            offered: access.issuer.clone(),
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

/// The issuer check, then the fenced statement under the request's deadline
/// (`write`: a PUT's body; `None`: a fenced read). A refusing verdict comes
/// back as its error.
async fn fenced(
    state: &AppState,
    sent: Sent,
    id: String,
    h: FencingHeaders,
    write: Option<String>,
) -> Result<(Access, Verdict, store::Row), ApiError> {
    let method = if write.is_some() { "PUT" } else { "GET" };
    state
        .write_rate
        .check(h.client_id.as_deref().unwrap_or_default())?;
    check_with_issuer(state, &id, method, &h).await?;
    let enforce = state.fencing == FenceCheck::Enforce;
    let page_issuer = match enforce {
        true => state.trust.page_issuers.issuer_for(&id, &h.issuer),
        false => None,
    };
    let access = Access {
        page_issuer: page_issuer.map(str::to_owned),
        id,
        // A GET is not conditional: its If-Match is checked for its form only.
        if_match: if write.is_some() { h.if_match } else { None },
        write,
        token: h.token,
        issuer: h.issuer,
        enforce,
        client_id: h.client_id,
    };
    let (access, verdict, row) = run_fenced(state, access, sent).await?;
    match rejection(verdict, &access, &row) {
        Some(err) => Err(err),
        None => Ok((access, verdict, row)),
    }
}

errors!(
    GetPageErrors = [
        RateLimited,
        InvalidPageId,
        InvalidPath,
        InvalidFencingToken,
        InvalidFencingIssuer,
        InvalidClientId,
        InvalidIfMatch,
        Unauthorized,
        ClientIdMismatch,
        PageNotFound,
        NotFound,
        UnknownIssuer,
        TokenNotCurrent,
        SuspectedForgery,
        StaleToken,
        IssuerMismatch,
        NoIssuerForPage,
        IssuerUnavailable,
        DatabaseUnavailable,
        OutcomeUnknown,
    ]
);

/// Read a page.
///
/// Without `Fencing-Token`, a plain read: public. With it, a *fenced read*:
/// it needs a writer's key, its token is checked with its issuer and against
/// the page's fence like a write's, and it raises the fence to the token (so
/// an older holder's late write is refused afterwards); it is recorded in the
/// history. A fenced read of a page never written still records its fence
/// (404 `page_not_found` with the fence). `If-Match` is checked for its form
/// only: a GET is not conditional. With fencing off it is recorded and
/// moves nothing.
#[utoipa::path(
    get,
    path = "/pages/{id}",
    operation_id = "get_page",
    tag = "pages",
    params(PageIdParam, ReadHeaders),
    security((), ("writer_key" = [])),
    responses(
        (status = 200, description = "The page; `ETag` is its version, quoted", body = Page,
            headers(("ETag" = String, description = "The page's version, quoted: `\"1\"`")),
            links(
                ("History" = (operation_id = "page_history", parameters(("id" = "$response.body#/id")))),
                ("Write" = (operation_id = "put_page", parameters(("id" = "$response.body#/id")))),
            ),
            example = json!(openapi::parse(openapi::tutorial::PAGE_CREATED))),
        GetPageErrors,
    )
)]
// Per-request spans and events are debug: a profile under load
// (docs/BENCHMARKS.md) showed tracing's formatting among the largest costs
// of the request path that the gateway controls. Every attempt is recorded
// in page_history and counted in /metrics; warnings carry their own fields.
#[tracing::instrument(level = "debug", skip_all, fields(page = %id, token = ?h.token, issuer = %h.issuer))]
async fn get_page(
    State(state): State<AppState>,
    Extension(sent): Extension<Sent>,
    PageId(id): PageId,
    h: FencingHeaders,
) -> Result<Response, ApiError> {
    if h.token.is_none() {
        let page = store::read(&state.reads, &id)
            .await?
            .ok_or(ApiError::PageNotFound { id, fence: None })?;
        return Ok(page_response(StatusCode::OK, page, "read"));
    }
    let (access, verdict, row) = fenced(&state, sent, id, h, None).await?;
    let fence = row.fence.clone();
    match row.page() {
        Some(page) => Ok(page_response(StatusCode::OK, page, outcome_label(verdict))),
        None => Err(ApiError::PageNotFound {
            id: access.id,
            fence,
        }),
    }
}

errors!(
    PutPageErrors = [
        RateLimited,
        InvalidPageId,
        InvalidPath,
        InvalidFencingToken,
        InvalidFencingIssuer,
        InvalidClientId,
        InvalidIfMatch,
        InvalidJson,
        InvalidBody,
        Unauthorized,
        ClientIdMismatch,
        NotFound,
        UnknownIssuer,
        TokenNotCurrent,
        SuspectedForgery,
        StaleToken,
        IssuerMismatch,
        NoIssuerForPage,
        VersionMismatch,
        BodyTooLarge,
        UnsupportedMediaType,
        FencingTokenRequired,
        IssuerUnavailable,
        DatabaseUnavailable,
        OutcomeUnknown,
    ]
);

/// Write a page.
///
/// Needs a writer's key. With fencing enforced it needs `Fencing-Token`
/// (428 otherwise); the token's issuer must say it is current, for this
/// client (409 `token_not_current`), it must not be a token the issuer
/// cannot have minted in turn (409 `suspected_forgery`), it must be the
/// page's issuer (409
/// `issuer_mismatch`; the page's fence names it, else the operator's
/// `GATEWAY_PAGE_ISSUERS` / `GATEWAY_DEFAULT_ISSUER`, else 409
/// `no_issuer_for_page`), and it must not be older than the page's fence
/// (409 `stale_token`): the check, the write and the history row are one
/// SQL statement. 201 when the write created the page, 200 after. With
/// fencing off the page's fence is neither checked nor moved.
#[utoipa::path(
    put,
    path = "/pages/{id}",
    operation_id = "put_page",
    tag = "pages",
    params(PageIdParam, WriteHeaders),
    security(("writer_key" = [])),
    request_body(content = PutBody, content_type = "application/json",
        example = json!(openapi::parse(openapi::tutorial::PUT_BODY))),
    responses(
        (status = 201, description = "Created: the page's first write (version 1)", body = Page,
            headers(("ETag" = String, description = "The page's version, quoted: `\"1\"`")),
            links(
                ("Read" = (operation_id = "get_page", parameters(("id" = "$response.body#/id")))),
                ("History" = (operation_id = "page_history", parameters(("id" = "$response.body#/id")))),
                ("SetFence" = (operation_id = "admin_set_fence", parameters(("id" = "$response.body#/id")))),
            ),
            example = json!(openapi::parse(openapi::tutorial::PAGE_CREATED))),
        (status = 200, description = "Written", body = Page,
            headers(("ETag" = String, description = "The page's version, quoted: `\"2\"`")),
            links(
                ("Read" = (operation_id = "get_page", parameters(("id" = "$response.body#/id")))),
                ("History" = (operation_id = "page_history", parameters(("id" = "$response.body#/id")))),
            ),
            example = json!(openapi::parse(openapi::tutorial::PAGE_UPDATED))),
        PutPageErrors,
    )
)]
// Debug, as `get_page`'s span.
#[tracing::instrument(level = "debug", skip_all, fields(page = %id, token = ?h.token, issuer = %h.issuer))]
async fn put_page(
    State(state): State<AppState>,
    Extension(sent): Extension<Sent>,
    PageId(id): PageId,
    h: FencingHeaders,
    JsonBody(put): JsonBody<PutBody>,
) -> Result<Response, ApiError> {
    if put.body.contains('\0') {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidBody,
            "body must not contain NUL characters",
        ));
    }
    if state.fencing == FenceCheck::Enforce && h.token.is_none() {
        return Err(ApiError::FencingTokenRequired);
    }
    let (_, verdict, row) = fenced(&state, sent, id, h, Some(put.body)).await?;
    let page = row
        .page()
        .ok_or_else(|| ApiError::Internal("accepted write left no body".into()))?;
    // Version 1 is the first accepted write (there is no delete).
    let status = if page.version == 1 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    tracing::debug!(
        version = page.version,
        outcome = outcome_label(verdict),
        "written"
    );
    Ok(page_response(status, page, outcome_label(verdict)))
}

/// Written pages (bodies left out).
#[derive(Serialize, ToSchema)]
pub struct PageList {
    pub pages: Vec<PageSummary>,
}

/// A page in the list.
#[derive(Serialize, ToSchema)]
pub struct PageSummary {
    pub id: String,
    /// 0 for a page only fenced (by a fenced read), never written.
    #[schema(minimum = 0)]
    pub version: i64,
    #[schema(required = true)]
    pub fence: Option<Fence>,
}

/// `?limit=N&after=ID`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// The first `limit` pages, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000, example = 10)]
    limit: Option<i64>,
    /// Only pages whose id sorts after this one: the next page starts after
    /// the last id of the one before (the `Link` header names it).
    #[param(pattern = "^[A-Za-z0-9_-]{1,128}$")]
    after: Option<String>,
}

errors!(
    ListPagesErrors = [
        InvalidLimit,
        InvalidPageId,
        InvalidQuery,
        DatabaseUnavailable
    ]
);

/// The written pages, by id, with their versions and fences.
#[utoipa::path(
    get,
    path = "/pages",
    operation_id = "list_pages",
    tag = "pages",
    params(ListParams),
    responses(
        (status = 200, description = "The pages, by id", body = PageList,
            headers(("Link" = String, description = "`</pages?limit=N&after=ID>; rel=\"next\"` \
                when `limit` pages were answered: the next page")),
            links(("First" = (operation_id = "get_page", parameters(("id" = "$response.body#/pages/0/id")))))),
        ListPagesErrors,
    )
)]
async fn list_pages(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Response, ApiError> {
    let limit = paging::limit(params.limit)?;
    let after = params.after.map(PageId::parse).transpose()?.map(|p| p.0);
    let rows = store::list(&state.reads, after.as_deref().unwrap_or(""), limit).await?;
    let full = rows.len() as i64 == limit;
    let last = rows.last().map(|r| r.id.clone()).unwrap_or_default();
    let pages = rows
        .into_iter()
        .map(|r| PageSummary {
            id: r.id,
            version: r.version,
            fence: r.fence,
        })
        .collect();
    let response = sorted_json(&PageList { pages })?.into_response();
    Ok(paging::link_next(response, full, || {
        format!("/pages?limit={limit}&after={last}")
    }))
}
