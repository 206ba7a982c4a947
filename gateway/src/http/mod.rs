//! Routes, request validation and responses. Every decision about a page's
//! fence is taken by the database in [`store::fenced_access`]; before it, this
//! file authenticates the caller ([`crate::auth`]) and asks the token's issuer
//! whether the token is current ([`check_with_issuer`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{
    DefaultBodyLimit, Extension, FromRequest, FromRequestParts, MatchedPath, Path, Query, Request,
    State,
};
use axum::http::header::{ETAG, IF_MATCH};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{self, AuthMode};
use crate::error::{ApiError, ErrorCode};
use crate::issuers::{lock_name, valid_issuer_name};
use crate::metrics::{self, Outcome};
use crate::openapi::{self, errors, AnyRequestErrors, PageIdParam, ReadHeaders, WriteHeaders};
use crate::store::{self, Access, Fence, HistoryEntry, Page, Verdict};
use crate::{AppState, FenceCheck};
use fencelock::Token;

/// Largest accepted request body.
pub const BODY_LIMIT: usize = 1024 * 1024;
/// Default for `--request-timeout`: longest a request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for `--outcome-wait`.
pub const OUTCOME_WAIT: Duration = Duration::from_secs(5);

/// A request's deadline, and what happens when it passes.
///
/// Before the request's statement was sent to the database, passing the
/// deadline answers 504 `timeout`: nothing was written. After, the statement
/// runs to its end in a task of its own whatever happens to the request (see
/// [`run_fenced`]): the request waits up to `outcome_wait` more and answers
/// the statement's result, late but true; if it still has not finished (a
/// lock held for long, a database that stopped answering), 504
/// `outcome_unknown`, which tells the client to read before retrying. A write
/// that lands is never answered with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Longest a request may take (`--request-timeout`).
    pub request: Duration,
    /// How much longer a request whose statement was sent waits for it
    /// (`--outcome-wait`).
    pub outcome_wait: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            request: REQUEST_TIMEOUT,
            outcome_wait: OUTCOME_WAIT,
        }
    }
}

/// Every route with its description: a handler is routed by the path and
/// method of its `#[utoipa::path]` annotation, so the routes and the
/// OpenAPI description ([`crate::openapi`]) come from one place.
pub fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(<openapi::BaseDoc as utoipa::OpenApi>::openapi())
        .routes(routes!(list_pages))
        .routes(routes!(get_page, put_page))
        .routes(routes!(page_history))
        .routes(routes!(admin_set_fence))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics_text))
        .merge(crate::dashboard::api())
        .merge(openapi::api())
}

/// The whole HTTP API with its layers.
pub fn router(state: AppState) -> Router {
    let (routes, _) = api().split_for_parts();
    routes
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(state.clone(), deadline))
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

/// What a request has sent to the database: set just before its fenced
/// statement goes out, read by [`deadline`] when the deadline passes.
#[derive(Clone, Default)]
pub struct Sent(Arc<Mutex<SentState>>);

#[derive(Default)]
enum SentState {
    #[default]
    Nothing,
    Statement {
        id: String,
        method: &'static str,
        token: Option<Token>,
    },
    /// The request was answered `outcome_unknown`; the statement goes on.
    AnsweredUnknown,
    /// The deadline passed first and the request was answered `timeout`:
    /// its statement must not be sent any more.
    GaveUp,
}

impl Sent {
    /// About to send the statement: `false` if the request was already
    /// answered `timeout` (then nothing may be sent). Decided under the same
    /// lock as [`Sent::give_up`], so exactly one of the two wins.
    fn statement(&self, access: &Access) -> bool {
        let mut state = self.0.lock().expect("sent");
        if matches!(*state, SentState::GaveUp) {
            return false;
        }
        *state = SentState::Statement {
            id: access.id.clone(),
            method: if access.write.is_some() { "PUT" } else { "GET" },
            token: access.token,
        };
        true
    }

    /// The deadline passed: `true` (and nothing will be sent any more) if no
    /// statement was sent; `false` if one is in flight.
    fn give_up(&self) -> bool {
        let mut state = self.0.lock().expect("sent");
        match *state {
            SentState::Nothing | SentState::GaveUp => {
                *state = SentState::GaveUp;
                true
            }
            SentState::Statement { .. } | SentState::AnsweredUnknown => false,
        }
    }

    /// The statement in flight, if any; marks it answered `outcome_unknown`.
    fn answer_unknown(&self) -> Option<ApiError> {
        let mut state = self.0.lock().expect("sent");
        match std::mem::replace(&mut *state, SentState::AnsweredUnknown) {
            SentState::Statement { id, method, token } => {
                Some(ApiError::OutcomeUnknown { id, method, token })
            }
            other => {
                *state = other;
                None
            }
        }
    }

    fn was_answered_unknown(&self) -> bool {
        matches!(*self.0.lock().expect("sent"), SentState::AnsweredUnknown)
    }
}

/// The request deadline (see [`Deadlines`]). The handler is polled, not
/// dropped, when the deadline passes after its statement was sent.
async fn deadline(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let sent = Sent::default();
    req.extensions_mut().insert(sent.clone());
    let deadlines = state.deadlines;
    let run = next.run(req);
    tokio::pin!(run);
    if let Ok(response) = tokio::time::timeout(deadlines.request, &mut run).await {
        return response;
    }
    if sent.give_up() {
        return ApiError::Timeout.into_response();
    }
    state.metrics.deadline_passed_in_flight();
    match tokio::time::timeout(deadlines.outcome_wait, &mut run).await {
        Ok(response) => response,
        Err(_) => match sent.answer_unknown() {
            Some(unknown) => unknown.into_response(),
            None => ApiError::Timeout.into_response(),
        },
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
                ErrorCode::InvalidPageId,
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

/// The fencing headers of a request, validated, with its caller
/// authenticated where it must be.
#[derive(Debug)]
pub struct FencingHeaders {
    pub token: Option<Token>,
    pub issuer: String,
    /// The key's client when the request was authenticated (whatever
    /// `Client-Id` said, which may only repeat it); else `Client-Id`.
    pub client_id: Option<String>,
    pub if_match: Option<i64>,
}

impl FromRequestParts<AppState> for FencingHeaders {
    type Rejection = ApiError;

    /// A PUT, and any request carrying `Fencing-Token`, needs a writer's key
    /// when authentication is required: 401 before anything else is looked
    /// at, then 400 for malformed headers, then 403 for a `Client-Id` that is
    /// not the key's client. Plain reads pass unauthenticated.
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let needs_key = state.trust.auth == AuthMode::Required
            && (parts.method == Method::PUT || parts.headers.contains_key("fencing-token"));
        let client = if needs_key {
            Some(auth::authenticate(&state.trust.writers, &parts.headers)?.to_owned())
        } else {
            None
        };
        let mut h = parse_headers(&parts.headers)?;
        if let Some(client) = client {
            match h.client_id.take() {
                Some(sent) if sent != client => {
                    return Err(ApiError::ClientIdMismatch { sent, client });
                }
                _ => h.client_id = Some(client),
            }
        }
        Ok(h)
    }
}

/// The admin a request's key names: 401 without a known key, 403 for a
/// writer's key.
pub struct Admin(pub String);

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let trust = &state.trust;
        let Some(key) = auth::bearer(&parts.headers)? else {
            return Err(ApiError::unauthorized(if trust.admins.is_empty() {
                "this gateway has no admin key configured (GATEWAY_ADMIN_KEYS)"
            } else {
                "the admin endpoint needs Authorization: Bearer <admin key>"
            }));
        };
        if let Some(name) = trust.admins.find(key) {
            return Ok(Admin(name.to_owned()));
        }
        if trust.writers.find(key).is_some() {
            return Err(ApiError::Forbidden);
        }
        Err(ApiError::unauthorized("unknown admin key"))
    }
}

fn header<'h>(
    headers: &'h HeaderMap,
    name: &str,
    code: ErrorCode,
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
    let token = match header(headers, "fencing-token", ErrorCode::InvalidFencingToken)? {
        None => None,
        Some(s) => Some(s.parse::<Token>().map_err(|_| {
            ApiError::bad_request(
                ErrorCode::InvalidFencingToken,
                format!(
                    "Fencing-Token must be a decimal integer from 0 to {}, got {s:?}",
                    i64::MAX
                ),
            )
        })?),
    };
    let issuer = match header(headers, "fencing-issuer", ErrorCode::InvalidFencingIssuer)? {
        None => "default".to_owned(),
        Some(s) => {
            if !valid_issuer_name(s) {
                return Err(ApiError::bad_request(
                    ErrorCode::InvalidFencingIssuer,
                    format!("Fencing-Issuer must match [a-z0-9._:-]{{1,64}}, got {s:?}"),
                ));
            }
            s.to_owned()
        }
    };
    let client_id = match header(headers, "client-id", ErrorCode::InvalidClientId)? {
        None => None,
        // The lock library's rule for client ids (no spaces, no tabs), so
        // that a Client-Id can name a lock holder at all. The header's own
        // rule (`to_str`) lets spaces and tabs through: schemathesis sent a
        // tab, and it was recorded in the history.
        Some(s) if fencelock::validate_client_id(s).is_ok() => Some(s.to_owned()),
        Some(s) => {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidClientId,
                format!(
                    "Client-Id must be 1 to 128 visible ASCII characters (no spaces), got {s:?}"
                ),
            ))
        }
    };
    let if_match = match header(headers, IF_MATCH.as_str(), ErrorCode::InvalidIfMatch)? {
        None => None,
        Some(s) => Some(parse_etag(s).ok_or_else(|| {
            ApiError::bad_request(
                ErrorCode::InvalidIfMatch,
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

/// Run the fenced statement(s) in a task of their own, so that once sent
/// they finish whatever happens to the request (its deadline passes, its
/// client hangs up, the gateway drains): a statement is never abandoned
/// midway, its connection goes back to the pool, and [`deadline`] can still
/// answer its result. Marks `sent` just before the first statement goes out;
/// sends nothing if the request was already answered `timeout` (the task may
/// still have been waiting for a connection then).
async fn run_fenced(
    state: &AppState,
    access: Access,
    sent: Sent,
) -> Result<(Access, Verdict, store::Row), ApiError> {
    let db = state.db.clone();
    let task = tokio::spawn(async move {
        let result = store::fenced_access(&db, &access, || sent.statement(&access)).await;
        if sent.was_answered_unknown() {
            // Nobody waits for this answer any more: say what happened.
            match &result {
                Ok((verdict, row)) => tracing::warn!(
                    page = %access.id, token = ?access.token, outcome = verdict.as_str(),
                    version = row.version,
                    "a statement answered outcome_unknown finished"
                ),
                Err(e) => tracing::warn!(
                    page = %access.id, token = ?access.token, error = %e,
                    "a statement answered outcome_unknown failed"
                ),
            }
        }
        (access, result)
    });
    match task.await {
        Ok((access, Ok((verdict, row)))) => Ok((access, verdict, row)),
        Ok((_, Err(e))) => Err(e.into()),
        Err(e) => Err(ApiError::Internal(format!("fenced statement task: {e}"))),
    }
}

errors!(
    GetPageErrors = [
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
        StaleToken,
        IssuerMismatch,
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
/// only: a GET is not conditional.
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
// Per-request spans and events are debug: a profile under load (issue 18,
// docs/BENCHMARKS.md) showed tracing's formatting among the largest costs
// of the request path that the gateway controls. Every attempt is recorded
// in page_history and counted in /metrics; warnings carry their own fields.
#[tracing::instrument(level = "debug", skip_all, fields(page = %id, token = ?h.token, issuer = %h.issuer))]
async fn get_page(
    State(state): State<AppState>,
    Extension(sent): Extension<Sent>,
    PageId(id): PageId,
    h: FencingHeaders,
) -> Result<Response, ApiError> {
    let Some(token) = h.token else {
        let page = store::read(&state.db, &id)
            .await?
            .ok_or(ApiError::PageNotFound { id, fence: None })?;
        return Ok(page_response(StatusCode::OK, page, "read"));
    };
    check_with_issuer(&state, &id, "GET", &h).await?;
    let access = Access {
        id,
        write: None,
        token: Some(token),
        issuer: h.issuer,
        if_match: None,
        enforce: state.fencing == FenceCheck::Enforce,
        client_id: h.client_id,
    };
    let (access, verdict, row) = run_fenced(&state, access, sent).await?;
    if let Some(err) = rejection(verdict, &access, &row) {
        return Err(err);
    }
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
        StaleToken,
        IssuerMismatch,
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
/// client (409 `token_not_current`), and it must not be older than the
/// page's fence (409 `stale_token`): the check, the write and the history
/// row are one SQL statement. 201 when the write created the page, 200 after.
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
    let enforce = state.fencing == FenceCheck::Enforce;
    if enforce && h.token.is_none() {
        return Err(ApiError::FencingTokenRequired);
    }
    check_with_issuer(&state, &id, "PUT", &h).await?;
    let access = Access {
        id,
        write: Some(put.body),
        token: h.token,
        issuer: h.issuer,
        if_match: h.if_match,
        enforce,
        client_id: h.client_id,
    };
    let (access, verdict, row) = run_fenced(&state, access, sent).await?;
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
    tracing::debug!(
        version = page.version,
        outcome = outcome_label(verdict),
        "written"
    );
    Ok(page_response(status, page, outcome_label(verdict)))
}

/// Chubby's `CheckSequencer`: before the fenced statement, ask the token's
/// issuer whether lock `page:<id>` is held right now by this client with
/// exactly this token. Runs only when fencing is enforced and issuers are
/// configured. Refuses a token nobody was granted (guessed, from the future),
/// one granted to another client (copied), and one whose lease has ended.
///
/// The check and the write are NOT atomic: the lease can end, and another
/// client be granted the lock, between the issuer's answer and the fenced
/// statement. That is safe because the statement still checks the token
/// against the page's fence under the page's row lock: the newer holder's
/// token is higher, and once any access with it has reached the page, this
/// token is refused as `stale_token`; before that, this write is simply
/// ordered before the newer holder's, which reads it. That is the case the
/// fence has always handled. What the issuer adds is what the fence cannot
/// know: that the token was granted at all, and to this client, so the fence
/// only ever moves to tokens the issuer really granted and never passes its
/// counter.
async fn check_with_issuer(
    state: &AppState,
    id: &str,
    method: &'static str,
    h: &FencingHeaders,
) -> Result<(), ApiError> {
    let issuers = &state.trust.issuers;
    let Some(token) = h.token else {
        return Ok(());
    };
    if state.fencing != FenceCheck::Enforce || issuers.is_empty() {
        return Ok(());
    }
    let Some(issuer) = issuers.get(&h.issuer) else {
        return Err(ApiError::UnknownIssuer {
            issuer: h.issuer.clone(),
            known: issuers.names(),
        });
    };
    let lock = lock_name(id);
    let started = std::time::Instant::now();
    let answer = issuer.current_holder(&lock, issuers.timeout()).await;
    let seconds = started.elapsed().as_secs_f64();
    let holder = match answer {
        Ok(holder) => holder,
        Err(e) => {
            state
                .metrics
                .issuer_check(&h.issuer, "unavailable", seconds);
            return Err(ApiError::IssuerUnavailable {
                issuer: h.issuer.clone(),
                detail: e.to_string(),
            });
        }
    };
    // With authentication required `client_id` is the key's client; with it
    // off, the `Client-Id` sent, if any.
    let same_client = |holder: &str| h.client_id.as_deref().is_none_or(|c| c == holder);
    let message = match &holder {
        Some(x) if x.token == token && same_client(&x.client_id) => {
            state.metrics.issuer_check(&h.issuer, "current", seconds);
            return Ok(());
        }
        Some(x) if x.token == token => format!(
            "lock {lock:?} is held with token {token} by another client: a token is only good \
             for the client it was granted to"
        ),
        Some(x) => format!(
            "issuer {:?} says lock {lock:?} is held with token {}, not {token}",
            h.issuer, x.token
        ),
        None => format!(
            "issuer {:?} says nobody holds lock {lock:?} right now, so token {token} is not \
             current (expired, released, or never granted)",
            h.issuer
        ),
    };
    state
        .metrics
        .issuer_check(&h.issuer, "not_current", seconds);
    store::record_refusal(
        &state.db,
        id,
        method,
        "token_not_current",
        token,
        &h.issuer,
        h.client_id.as_deref(),
    )
    .await?;
    tracing::info!(page = %id, issuer = %h.issuer, offered = %token, holder = ?holder, "token not current");
    Err(ApiError::TokenNotCurrent {
        issuer: h.issuer.clone(),
        offered: token,
        holder: holder.map(|x| x.token),
        message,
    })
}

/// The fence an admin sets: `issuer` and `token` together, or both `null`
/// (or left out) to clear it; and why. Its schema is written by hand
/// ([`openapi::fence_body_schema`]): "both or neither" is not a field's type.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceBody {
    issuer: Option<String>,
    #[serde(default, deserialize_with = "json_token")]
    token: Option<Token>,
    reason: String,
}

/// A token in a JSON body: an integer from 0 to 2^63-1, or `null`. JSON
/// Schema, and so the OpenAPI description, counts `28.0` as the integer 28
/// (schemathesis sent one, and serde refused it as not a `u64`), so an
/// integral number written with a fraction is taken too, but only where a
/// double holds it exactly (up to 2^53): a token is never rounded.
fn json_token<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Token>, D::Error> {
    use serde::de::Error;
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    let token = match (n.as_u64(), n.as_f64()) {
        (Some(u), _) => Token::new(u),
        (None, Some(f)) if f.fract() == 0.0 && (0.0..=EXACT).contains(&f) => Token::new(f as u64),
        _ => None,
    };
    token.map(Some).ok_or_else(|| {
        D::Error::custom(format!(
            "token must be an integer from 0 to {}, got {n}",
            i64::MAX
        ))
    })
}

impl utoipa::PartialSchema for FenceBody {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
        openapi::fence_body_schema()
    }
}

impl ToSchema for FenceBody {}

/// What an admin's fence change did.
#[derive(Serialize, ToSchema)]
pub struct FenceSetReply {
    pub id: String,
    /// The page's version (unchanged by the fence: 0 for a page never written).
    #[schema(minimum = 0)]
    pub version: i64,
    #[schema(required = true)]
    pub fence: Option<Fence>,
    #[schema(required = true)]
    pub previous_fence: Option<Fence>,
}

errors!(
    AdminSetFenceErrors = [
        InvalidPageId,
        InvalidPath,
        InvalidReason,
        InvalidFencingIssuer,
        InvalidFence,
        InvalidJson,
        InvalidBody,
        Unauthorized,
        Forbidden,
        PageNotFound,
        NotFound,
        BodyTooLarge,
        UnsupportedMediaType,
        DatabaseUnavailable,
    ]
);

/// Set (lower, clear) a page's fence: admins only.
///
/// The way back when a page's fence is above what its issuer can grant (a
/// lock service that lost its counter); see docs/OPERATIONS.md. Audited by
/// a history row (method `ADMIN`, outcome `fence_set`, client `admin:<name>`,
/// the reason). Lowering a fence re-opens what it closed.
#[utoipa::path(
    post,
    path = "/admin/pages/{id}/fence",
    operation_id = "admin_set_fence",
    tag = "admin",
    params(PageIdParam),
    security(("admin_key" = [])),
    request_body(content = FenceBody, content_type = "application/json",
        example = json!(openapi::parse(openapi::tutorial::FENCE_BODY))),
    responses(
        (status = 200, description = "The fence was set", body = FenceSetReply,
            links(
                ("Read" = (operation_id = "get_page", parameters(("id" = "$response.body#/id")))),
                ("History" = (operation_id = "page_history", parameters(("id" = "$response.body#/id")))),
            ),
            example = json!(openapi::parse(openapi::tutorial::FENCE_SET))),
        AdminSetFenceErrors,
    )
)]
#[tracing::instrument(skip_all, fields(page = %id, admin = %admin))]
async fn admin_set_fence(
    State(state): State<AppState>,
    Admin(admin): Admin,
    PageId(id): PageId,
    JsonBody(body): JsonBody<FenceBody>,
) -> Result<Response, ApiError> {
    let reason = body.reason.trim();
    if reason.is_empty() || reason.chars().count() > 1000 || reason.contains('\0') {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidReason,
            "reason must be 1 to 1000 characters (without NUL): the history keeps it",
        ));
    }
    let fence = match (body.issuer, body.token) {
        (Some(issuer), Some(token)) => {
            if !valid_issuer_name(&issuer) {
                return Err(ApiError::bad_request(
                    ErrorCode::InvalidFencingIssuer,
                    format!("issuer must match [a-z0-9._:-]{{1,64}}, got {issuer:?}"),
                ));
            }
            Some(Fence { issuer, token })
        }
        (None, None) => None,
        _ => return Err(ApiError::bad_request(
            ErrorCode::InvalidFence,
            "issuer and token go together: give both to set the fence, or null both to clear it",
        )),
    };
    let client = format!("admin:{admin}");
    let set = store::set_fence(&state.db, &id, fence.as_ref(), &client, reason)
        .await?
        .ok_or(ApiError::PageNotFound {
            id: id.clone(),
            fence: None,
        })?;
    tracing::warn!(previous = ?set.previous, fence = ?set.fence, reason, "page fence set by an admin");
    let reply = FenceSetReply {
        id,
        version: set.version,
        fence: set.fence,
        previous_fence: set.previous,
    };
    let mut response = sorted_json(&reply)?.into_response();
    response.extensions_mut().insert(Outcome("fence_set"));
    Ok(response)
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

/// The body serialized with its keys sorted, as `json!` writes them (the
/// README's tutorial shows them so).
fn sorted_json<T: Serialize>(value: &T) -> Result<Json<serde_json::Value>, ApiError> {
    serde_json::to_value(value)
        .map(Json)
        .map_err(|e| ApiError::Internal(format!("encode response: {e}")))
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
    let history = store::history(&state.db, &id, limit).await?;
    Ok(sorted_json(&History { id, history })?.into_response())
}

/// Every page (bodies left out).
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

errors!(ListPagesErrors = [DatabaseUnavailable]);

/// Every page, with its version and fence.
#[utoipa::path(
    get,
    path = "/pages",
    operation_id = "list_pages",
    tag = "pages",
    responses(
        (status = 200, description = "The pages, by id", body = PageList,
            links(("First" = (operation_id = "get_page", parameters(("id" = "$response.body#/pages/0/id")))))),
        ListPagesErrors,
    )
)]
async fn list_pages(State(state): State<AppState>) -> Result<Response, ApiError> {
    let rows = store::list(&state.db).await?;
    let pages = rows
        .into_iter()
        .map(|r| PageSummary {
            id: r.id,
            version: r.version,
            fence: r.fence,
        })
        .collect();
    Ok(sorted_json(&PageList { pages })?.into_response())
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
