//! One error type for every rejection: it knows its status, its code, and
//! writes the JSON body `{"error": "<code>", "message": "...", ...details}`.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::header::WWW_AUTHENTICATE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use fencelock::Token;
use serde_json::{json, Map, Value};

use crate::db::DbError;
use crate::metrics::Outcome;
use crate::store::Fence;

/// Every `error` code the gateway answers, with its status: the one list the
/// responses ([`ApiError::kind`]) and the OpenAPI description
/// ([`crate::openapi`]) are both made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorCode {
    /// 400: a page id that is not `[A-Za-z0-9_-]{1,128}`.
    InvalidPageId,
    /// 400: `Fencing-Token` is not a decimal integer from 0 to 2^63-1 (or sent twice).
    InvalidFencingToken,
    /// 400: `Fencing-Issuer` (or the admin body's `issuer`) is not `[a-z0-9._:-]{1,64}`.
    InvalidFencingIssuer,
    /// 400: `Client-Id` is not 1 to 128 visible ASCII characters.
    InvalidClientId,
    /// 400: `If-Match` is not a quoted version such as `"3"`.
    InvalidIfMatch,
    /// 400: the body is not JSON, or not the JSON the route takes.
    InvalidJson,
    /// 400: the body is JSON of the right shape with a value the route refuses
    /// (a NUL character), or could not be read.
    InvalidBody,
    /// 400: `limit` is not from 1 to 10000.
    InvalidLimit,
    /// 400: a path segment that is not valid percent-encoded UTF-8.
    InvalidPath,
    /// 400: a query string the route does not take.
    InvalidQuery,
    /// 400: the admin body's `reason` is empty, too long or has a NUL.
    InvalidReason,
    /// 400: the admin body gives only one of `issuer` and `token`.
    InvalidFence,
    /// 401, with `WWW-Authenticate: Bearer`: no known key where one is needed.
    Unauthorized,
    /// 403: `Client-Id` names another client than the key's.
    ClientIdMismatch,
    /// 403: a writer's key on the admin endpoint.
    Forbidden,
    /// 404: the page was never written.
    PageNotFound,
    /// 404: no route for this path.
    NotFound,
    /// 405: no such method on this path.
    MethodNotAllowed,
    /// 409: `Fencing-Issuer` is not a lock service this gateway checks tokens with.
    UnknownIssuer,
    /// 409: the issuer says the lock is not held right now by this client with this token.
    TokenNotCurrent,
    /// 409: the issuer names this client's token, but it is above what the
    /// issuer has minted, or too far above the page's fence: written by hand.
    SuspectedForgery,
    /// 409: the token is older than the page's fence.
    StaleToken,
    /// 409: the page is fenced by another lock service.
    IssuerMismatch,
    /// 409: no lock service guards this page: neither its row nor the
    /// operator's rule names one.
    NoIssuerForPage,
    /// 409: the admin's fence is above what its issuer has minted (or the
    /// issuer cannot say), and `force` was not set.
    ForceRequired,
    /// 409: the admin endpoint of a gateway with fencing off, which never
    /// touches a fence.
    FencingOff,
    /// 412: `If-Match` names another version.
    VersionMismatch,
    /// 413: the body is over 1 MiB.
    BodyTooLarge,
    /// 415: the body is not `application/json`.
    UnsupportedMediaType,
    /// 428: a write without `Fencing-Token` while fencing is enforced.
    FencingTokenRequired,
    /// 500: a bug, logged in full and answered generically.
    Internal,
    /// 503: the token's issuer cannot be asked (fail closed, nothing written).
    IssuerUnavailable,
    /// 503: PostgreSQL cannot be reached; nothing was written.
    DatabaseUnavailable,
    /// 504: the deadline passed before anything was sent to the database.
    Timeout,
    /// 504: the deadline passed after the statement was sent: it may still commit.
    OutcomeUnknown,
}

/// The type of a field beside `error` and `message` in an error body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// A string.
    Text,
    /// A list of strings.
    TextList,
    /// A fencing token (0 to 2^63-1).
    Token,
    /// A fencing token or `null`.
    TokenOrNull,
    /// A page version (0 to 2^63-1).
    Version,
    /// A page version or `null`.
    VersionOrNull,
    /// A page's fence `{"issuer", "token"}` or `null`.
    FenceOrNull,
    /// `"GET"` or `"PUT"`.
    Method,
}

impl ErrorCode {
    /// Every code, in the order of their statuses.
    pub const ALL: [ErrorCode; 35] = [
        Self::InvalidPageId,
        Self::InvalidFencingToken,
        Self::InvalidFencingIssuer,
        Self::InvalidClientId,
        Self::InvalidIfMatch,
        Self::InvalidJson,
        Self::InvalidBody,
        Self::InvalidLimit,
        Self::InvalidPath,
        Self::InvalidQuery,
        Self::InvalidReason,
        Self::InvalidFence,
        Self::Unauthorized,
        Self::ClientIdMismatch,
        Self::Forbidden,
        Self::PageNotFound,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::UnknownIssuer,
        Self::TokenNotCurrent,
        Self::SuspectedForgery,
        Self::StaleToken,
        Self::IssuerMismatch,
        Self::NoIssuerForPage,
        Self::ForceRequired,
        Self::FencingOff,
        Self::VersionMismatch,
        Self::BodyTooLarge,
        Self::UnsupportedMediaType,
        Self::FencingTokenRequired,
        Self::Internal,
        Self::IssuerUnavailable,
        Self::DatabaseUnavailable,
        Self::Timeout,
        Self::OutcomeUnknown,
    ];

    /// The body's `error` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidPageId => "invalid_page_id",
            Self::InvalidFencingToken => "invalid_fencing_token",
            Self::InvalidFencingIssuer => "invalid_fencing_issuer",
            Self::InvalidClientId => "invalid_client_id",
            Self::InvalidIfMatch => "invalid_if_match",
            Self::InvalidJson => "invalid_json",
            Self::InvalidBody => "invalid_body",
            Self::InvalidLimit => "invalid_limit",
            Self::InvalidPath => "invalid_path",
            Self::InvalidQuery => "invalid_query",
            Self::InvalidReason => "invalid_reason",
            Self::InvalidFence => "invalid_fence",
            Self::Unauthorized => "unauthorized",
            Self::ClientIdMismatch => "client_id_mismatch",
            Self::Forbidden => "forbidden",
            Self::PageNotFound => "page_not_found",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::UnknownIssuer => "unknown_issuer",
            Self::TokenNotCurrent => "token_not_current",
            Self::SuspectedForgery => "suspected_forgery",
            Self::StaleToken => "stale_token",
            Self::IssuerMismatch => "issuer_mismatch",
            Self::NoIssuerForPage => "no_issuer_for_page",
            Self::ForceRequired => "force_required",
            Self::FencingOff => "fencing_off",
            Self::VersionMismatch => "version_mismatch",
            Self::BodyTooLarge => "body_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::FencingTokenRequired => "fencing_token_required",
            Self::Internal => "internal",
            Self::IssuerUnavailable => "issuer_unavailable",
            Self::DatabaseUnavailable => "database_unavailable",
            Self::Timeout => "timeout",
            Self::OutcomeUnknown => "outcome_unknown",
        }
    }

    /// The status every response with this code has.
    pub fn status(self) -> StatusCode {
        match self {
            Self::InvalidPageId
            | Self::InvalidFencingToken
            | Self::InvalidFencingIssuer
            | Self::InvalidClientId
            | Self::InvalidIfMatch
            | Self::InvalidJson
            | Self::InvalidBody
            | Self::InvalidLimit
            | Self::InvalidPath
            | Self::InvalidQuery
            | Self::InvalidReason
            | Self::InvalidFence => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::ClientIdMismatch | Self::Forbidden => StatusCode::FORBIDDEN,
            Self::PageNotFound | Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::UnknownIssuer
            | Self::TokenNotCurrent
            | Self::SuspectedForgery
            | Self::StaleToken
            | Self::IssuerMismatch
            | Self::NoIssuerForPage
            | Self::ForceRequired
            | Self::FencingOff => StatusCode::CONFLICT,
            Self::VersionMismatch => StatusCode::PRECONDITION_FAILED,
            Self::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::FencingTokenRequired => StatusCode::PRECONDITION_REQUIRED,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::IssuerUnavailable | Self::DatabaseUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Timeout | Self::OutcomeUnknown => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The fields its body carries beside `error` and `message`, always all
    /// of them ([`ApiError::details`] writes them).
    pub fn details(self) -> &'static [(&'static str, Detail)] {
        match self {
            Self::ClientIdMismatch => &[("client_id", Detail::Text)],
            Self::UnknownIssuer => &[("issuer", Detail::Text), ("known", Detail::TextList)],
            Self::TokenNotCurrent => &[
                ("issuer", Detail::Text),
                ("offered_token", Detail::Token),
                ("holder_token", Detail::TokenOrNull),
            ],
            Self::SuspectedForgery => &[
                ("issuer", Detail::Text),
                ("offered_token", Detail::Token),
                ("minted_token", Detail::TokenOrNull),
                ("current_token", Detail::TokenOrNull),
            ],
            Self::IssuerUnavailable => &[("issuer", Detail::Text)],
            Self::StaleToken => &[
                ("offered_token", Detail::Token),
                ("current_token", Detail::Token),
                ("issuer", Detail::Text),
            ],
            Self::IssuerMismatch => &[
                ("offered_issuer", Detail::Text),
                ("current_issuer", Detail::Text),
            ],
            Self::NoIssuerForPage => &[("id", Detail::Text), ("offered_issuer", Detail::Text)],
            Self::ForceRequired => &[
                ("issuer", Detail::Text),
                ("token", Detail::Token),
                ("minted", Detail::TokenOrNull),
            ],
            Self::VersionMismatch => &[
                ("expected_version", Detail::Version),
                ("current_version", Detail::VersionOrNull),
            ],
            Self::PageNotFound => &[("id", Detail::Text), ("fence", Detail::FenceOrNull)],
            Self::OutcomeUnknown => &[
                ("id", Detail::Text),
                ("method", Detail::Method),
                ("token", Detail::TokenOrNull),
            ],
            _ => &[],
        }
    }

    /// What it means, for the description.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::InvalidPageId => "the page id is not 1 to 128 characters of A-Z, a-z, 0-9, '_' and '-'",
            Self::InvalidFencingToken => "Fencing-Token is not a decimal integer from 0 to 9223372036854775807, or was sent twice",
            Self::InvalidFencingIssuer => "the issuer name is not [a-z0-9._:-]{1,64}, or Fencing-Issuer was sent twice",
            Self::InvalidClientId => "Client-Id is not 1 to 128 visible ASCII characters (no spaces), or was sent twice",
            Self::InvalidIfMatch => "If-Match is not a quoted version such as \"3\", or was sent twice",
            Self::InvalidJson => "the body is not JSON, or not of the shape the route takes (unknown fields are refused)",
            Self::InvalidBody => "the body could not be read, or holds a value the route refuses (a NUL character)",
            Self::InvalidLimit => "limit is not from 1 to 10000",
            Self::InvalidPath => "a path segment is not valid percent-encoded UTF-8",
            Self::InvalidQuery => "the query string is not one the route takes (unknown parameters are refused)",
            Self::InvalidReason => "reason is empty, longer than 1000 characters, or has a NUL",
            Self::InvalidFence => "issuer and token go together: both set, or both null",
            Self::Unauthorized => "no known key where one is needed (a PUT, any request with Fencing-Token, the admin endpoint)",
            Self::ClientIdMismatch => "Client-Id names another client than the key's",
            Self::Forbidden => "a writer's key on the admin endpoint",
            Self::PageNotFound => "the page was never written (a fenced read of it still records its fence)",
            Self::NotFound => "no route for this path (e.g. an empty page id)",
            Self::MethodNotAllowed => "no such method on this path",
            Self::UnknownIssuer => "Fencing-Issuer (or the admin body's issuer) names no lock service this gateway checks tokens with",
            Self::TokenNotCurrent => "the issuer says the lock page:<id> is not held right now by this client with this token",
            Self::SuspectedForgery => "the issuer names this client's token, but the token is above the highest the issuer has minted, or further above the page's fence than the gateway accepts (GATEWAY_MAX_TOKEN_JUMP): its lock's keys were written by hand; nothing written, an admin can accept a jump by setting the fence",
            Self::StaleToken => "the token is older than the page's fence: nothing written",
            Self::IssuerMismatch => "the page is guarded by another lock service (its fence's, or the one GATEWAY_PAGE_ISSUERS or GATEWAY_DEFAULT_ISSUER names for it), whose tokens are not comparable with these",
            Self::NoIssuerForPage => "no lock service guards this page: its fence names none, and neither GATEWAY_PAGE_ISSUERS nor GATEWAY_DEFAULT_ISSUER names one for it; recorded, nothing written",
            Self::ForceRequired => "the fence is above what the issuer says it has minted for the page's lock, or the issuer cannot say: send \"force\": true to set it anyway; nothing written",
            Self::FencingOff => "this gateway runs with fencing off and never touches a page's fence: set it through a fenced gateway",
            Self::VersionMismatch => "If-Match names another version than the page's",
            Self::BodyTooLarge => "the body is larger than 1 MiB",
            Self::UnsupportedMediaType => "the body is not sent as Content-Type: application/json",
            Self::FencingTokenRequired => "a write without Fencing-Token while fencing is enforced",
            Self::Internal => "a bug: logged in full, answered generically",
            Self::IssuerUnavailable => "the token's issuer cannot be asked in time: fail closed, nothing written; retry later",
            Self::DatabaseUnavailable => "PostgreSQL cannot be reached: nothing written; retry later",
            Self::Timeout => "the request's deadline passed before anything was sent to the database: nothing written",
            Self::OutcomeUnknown => "the deadline passed after the statement was sent: it may still commit; read before retrying",
        }
    }
}

/// Everything the gateway can answer besides success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 401 `unauthorized` with `WWW-Authenticate: Bearer`: a write or a
    /// fenced request without a known key (or the admin endpoint without one).
    #[error("{0}")]
    Unauthorized(String),
    /// 403 `client_id_mismatch`: `Client-Id` names another client than the key's.
    #[error("Client-Id {sent:?} is not the client of this API key ({client:?}); omit Client-Id or send the key's client")]
    ClientIdMismatch { sent: String, client: String },
    /// 403 `forbidden`: a writer's key on the admin endpoint.
    #[error("this endpoint needs an admin key; a writer's key is not one")]
    Forbidden,
    /// 409 `unknown_issuer`: `Fencing-Issuer` is not a lock service this gateway checks tokens with.
    #[error("this gateway checks fencing tokens with the issuers {known:?}; {issuer:?} is not one of them (name your lock service as the gateway does)")]
    UnknownIssuer { issuer: String, known: Vec<String> },
    /// 409 `token_not_current`: the issuer says the lock is not held right now
    /// by this client with this token (guessed, copied, from the future, or expired).
    #[error("{message}")]
    TokenNotCurrent {
        issuer: String,
        offered: Token,
        holder: Option<Token>,
        message: String,
    },
    /// 409 `suspected_forgery`: the issuer names this client's token, but the
    /// token cannot be one it minted in turn: above the issuer's own counter
    /// (`minted`), or further above the page's fence (`current`) than the
    /// gateway accepts. What a lock client that writes its lock service's
    /// keys by hand (Redis cannot stop it) would send.
    #[error("{message}")]
    SuspectedForgery {
        issuer: String,
        offered: Token,
        minted: Option<Token>,
        current: Option<Token>,
        message: String,
    },
    /// 503 `issuer_unavailable`: the issuer could not be asked (unreachable,
    /// erroring, or slower than the issuer timeout). Fail closed: nothing written.
    #[error("the lock service {issuer:?} that issued this token cannot be asked right now, so the token cannot be checked; retry later")]
    IssuerUnavailable { issuer: String, detail: String },
    /// 409 `stale_token`: the token is lower than the page's fence.
    #[error("fencing token {offered} is older than the page's fence {current}")]
    StaleToken {
        offered: Token,
        current: Token,
        issuer: String,
    },
    /// 409 `issuer_mismatch`: the page is guarded by another lock service,
    /// whose tokens are not comparable with these.
    #[error("the page is guarded by issuer {current:?}, not {offered:?}; tokens of different lock services are not comparable")]
    IssuerMismatch { offered: String, current: String },
    /// 409 `no_issuer_for_page`: neither the page's fence nor the
    /// operator's rule names the lock service that guards it.
    #[error("no lock service is chosen for page {id:?}: the operator names one with GATEWAY_PAGE_ISSUERS or GATEWAY_DEFAULT_ISSUER, or sets the page's fence through the admin endpoint")]
    NoIssuerForPage { id: String, offered: String },
    /// 409 `force_required`: an admin's fence above what the issuer says it
    /// has minted for the lock (`minted`), or the issuer cannot say (`None`),
    /// without `force`.
    #[error("{}", force_message(issuer, *token, *minted))]
    ForceRequired {
        issuer: String,
        token: Token,
        minted: Option<Token>,
    },
    /// 409 `fencing_off`: the admin endpoint of a gateway with fencing off.
    #[error("this gateway runs with fencing off (GATEWAY_FENCING=off) and never touches a page's fence: set fences through a gateway that enforces fencing")]
    FencingOff,
    /// 412 `version_mismatch`: `If-Match` names another version.
    #[error("If-Match expected version {expected}, but the page is at {}", current.map_or("no version (it does not exist)".to_string(), |v| format!("version {v}")))]
    VersionMismatch { expected: i64, current: Option<i64> },
    /// 428 `fencing_token_required`: a write without `Fencing-Token` while fencing is enforced.
    #[error("this gateway enforces fencing: send a Fencing-Token header with the token of your lock grant")]
    FencingTokenRequired,
    /// 404 `page_not_found`. A fenced read of an unwritten page still records its fence.
    #[error("page {id:?} does not exist")]
    PageNotFound { id: String, fence: Option<Fence> },
    /// 404 `not_found`: no such route.
    #[error("no route for {0}")]
    NoRoute(String),
    /// 405 `method_not_allowed`.
    #[error("method not allowed on this path")]
    MethodNotAllowed,
    /// 400 with the given code, one of the [`ErrorCode`]s whose status is 400
    /// (`invalid_page_id`, `invalid_fencing_token`, `invalid_json`, ...).
    #[error("{message}")]
    BadRequest { code: ErrorCode, message: String },
    /// 413 `body_too_large`: over the 1 MiB limit.
    #[error("request body is larger than the limit of 1 MiB")]
    BodyTooLarge,
    /// 415 `unsupported_media_type`: the body must be `application/json`.
    #[error("expected a request with Content-Type: application/json")]
    UnsupportedMediaType,
    /// 503 `database_unavailable`: PostgreSQL cannot be reached (or no live
    /// connection could be had in time). Nothing was written.
    #[error("the database is unavailable; retry later")]
    DatabaseUnavailable(#[source] DbError),
    /// 504 `timeout`: the request's deadline passed before its statement was
    /// sent to the database: the page was not written.
    #[error("the request took too long and was given up before anything was sent to the database: the page was not written")]
    Timeout,
    /// 504 `outcome_unknown`: the request's deadline passed after its
    /// statement was sent, and the statement had not finished after the
    /// extra wait either. It may still commit: the client must look (read the
    /// page, or its history) before retrying.
    #[error("the request's statement was sent to the database and had not finished when the request's deadline passed: it may still commit or not. Read the page (or its history) to see whether this {method} landed before retrying it")]
    OutcomeUnknown {
        id: String,
        method: &'static str,
        token: Option<Token>,
    },
    /// 500 `internal`: logged in full, answered generically.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// A 400 with `code`, which must be one of the 400 codes.
    pub fn bad_request(code: ErrorCode, message: impl Into<String>) -> Self {
        debug_assert_eq!(code.status(), StatusCode::BAD_REQUEST, "{code:?}");
        Self::BadRequest {
            code,
            message: message.into(),
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::Unauthorized(message.into())
    }

    /// The status, which is the code's.
    pub fn status(&self) -> StatusCode {
        self.kind().status()
    }

    /// The body's `error` code.
    pub fn code(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The code, as the enum the OpenAPI description enumerates.
    pub fn kind(&self) -> ErrorCode {
        match self {
            Self::Unauthorized(_) => ErrorCode::Unauthorized,
            Self::ClientIdMismatch { .. } => ErrorCode::ClientIdMismatch,
            Self::Forbidden => ErrorCode::Forbidden,
            Self::UnknownIssuer { .. } => ErrorCode::UnknownIssuer,
            Self::TokenNotCurrent { .. } => ErrorCode::TokenNotCurrent,
            Self::SuspectedForgery { .. } => ErrorCode::SuspectedForgery,
            Self::IssuerUnavailable { .. } => ErrorCode::IssuerUnavailable,
            Self::StaleToken { .. } => ErrorCode::StaleToken,
            Self::IssuerMismatch { .. } => ErrorCode::IssuerMismatch,
            Self::NoIssuerForPage { .. } => ErrorCode::NoIssuerForPage,
            Self::ForceRequired { .. } => ErrorCode::ForceRequired,
            Self::FencingOff => ErrorCode::FencingOff,
            Self::VersionMismatch { .. } => ErrorCode::VersionMismatch,
            Self::FencingTokenRequired => ErrorCode::FencingTokenRequired,
            Self::PageNotFound { .. } => ErrorCode::PageNotFound,
            Self::NoRoute(_) => ErrorCode::NotFound,
            Self::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            Self::BadRequest { code, .. } => *code,
            Self::BodyTooLarge => ErrorCode::BodyTooLarge,
            Self::UnsupportedMediaType => ErrorCode::UnsupportedMediaType,
            Self::DatabaseUnavailable(_) => ErrorCode::DatabaseUnavailable,
            Self::Timeout => ErrorCode::Timeout,
            Self::OutcomeUnknown { .. } => ErrorCode::OutcomeUnknown,
            Self::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The fields beside `error` and `message` (see [`ErrorCode::details`]).
    pub fn details(&self) -> Map<String, Value> {
        let value = match self {
            Self::ClientIdMismatch { client, .. } => json!({"client_id": client}),
            Self::UnknownIssuer { issuer, known } => json!({"issuer": issuer, "known": known}),
            Self::TokenNotCurrent {
                issuer,
                offered,
                holder,
                ..
            } => json!({"issuer": issuer, "offered_token": offered, "holder_token": holder}),
            Self::SuspectedForgery {
                issuer,
                offered,
                minted,
                current,
                ..
            } => json!({
                "issuer": issuer,
                "offered_token": offered,
                "minted_token": minted,
                "current_token": current,
            }),
            Self::IssuerUnavailable { issuer, .. } => json!({"issuer": issuer}),
            Self::StaleToken {
                offered,
                current,
                issuer,
            } => json!({"offered_token": offered, "current_token": current, "issuer": issuer}),
            Self::IssuerMismatch { offered, current } => {
                json!({"offered_issuer": offered, "current_issuer": current})
            }
            Self::NoIssuerForPage { id, offered } => json!({"id": id, "offered_issuer": offered}),
            Self::ForceRequired {
                issuer,
                token,
                minted,
            } => {
                json!({"issuer": issuer, "token": token, "minted": minted})
            }
            Self::VersionMismatch { expected, current } => {
                json!({"expected_version": expected, "current_version": current})
            }
            Self::PageNotFound { id, fence } => json!({"id": id, "fence": fence}),
            Self::OutcomeUnknown { id, method, token } => {
                json!({"id": id, "method": method, "token": token})
            }
            _ => json!({}),
        };
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }
}

fn force_message(issuer: &str, token: Token, minted: Option<Token>) -> String {
    let what = match minted {
        Some(m) => format!("issuer {issuer:?} has minted at most token {m} for this page's lock"),
        None => {
            format!("issuer {issuer:?} cannot say which tokens it has minted for this page's lock")
        }
    };
    format!(
        "{what}: a fence of {token} could refuse every holder until the issuer's counter passes \
         it. Send \"force\": true to set it anyway (the history records it)"
    )
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Unavailable(_) => Self::DatabaseUnavailable(e),
            DbError::Failed(e) => Self::Internal(format!("database: {e}")),
            DbError::NotSent => Self::Timeout,
        }
    }
}

/// For sqlx callers (migrations; modules that still query with sqlx): the
/// same split, a protocol error being a bug (500), not unavailability.
impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        if is_unavailable(&e) {
            Self::DatabaseUnavailable(DbError::Unavailable(e.to_string()))
        } else {
            Self::Internal(format!("database: {e}"))
        }
    }
}

/// Errors that mean "PostgreSQL is not there right now", as opposed to a bug.
fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // Class 57 (operator intervention: admin shutdown, crash shutdown,
        // cannot connect now), 08 (connection exception), 53 (insufficient
        // resources, e.g. too many connections).
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("57") || c.starts_with("08") || c.starts_with("53")),
        _ => false,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            Self::DatabaseUnavailable(e) => tracing::warn!(error = %e, "database unavailable"),
            Self::Internal(e) => tracing::error!(error = %e, "internal error"),
            Self::IssuerUnavailable { issuer, detail } => {
                tracing::warn!(issuer = %issuer, error = %detail, "issuer unavailable");
            }
            _ => {}
        }
        let mut body = Map::new();
        body.insert("error".into(), self.code().into());
        body.insert("message".into(), self.to_string().into());
        body.extend(self.details());
        let mut response = (self.status(), Json(Value::Object(body))).into_response();
        if matches!(self, Self::Unauthorized(_)) {
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response.extensions_mut().insert(Outcome(self.code()));
        response
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::MissingJsonContentType(_) => Self::UnsupportedMediaType,
            JsonRejection::BytesRejection(ref b) if b.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Self::BodyTooLarge
            }
            JsonRejection::JsonSyntaxError(_) | JsonRejection::JsonDataError(_) => {
                Self::bad_request(ErrorCode::InvalidJson, r.body_text())
            }
            other => Self::bad_request(ErrorCode::InvalidBody, other.body_text()),
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        Self::bad_request(ErrorCode::InvalidPath, r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self::bad_request(ErrorCode::InvalidQuery, r.body_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of every variant, and of every 400 code: the body of each
    /// must have exactly the fields its code's description lists.
    fn one_of_each() -> Vec<ApiError> {
        let token = Token::new(3).unwrap();
        let mut all = vec![
            ApiError::unauthorized("no key"),
            ApiError::ClientIdMismatch {
                sent: "a".into(),
                client: "b".into(),
            },
            ApiError::Forbidden,
            ApiError::UnknownIssuer {
                issuer: "x".into(),
                known: vec!["redis".into()],
            },
            ApiError::TokenNotCurrent {
                issuer: "redis".into(),
                offered: token,
                holder: None,
                message: "not current".into(),
            },
            ApiError::SuspectedForgery {
                issuer: "redis".into(),
                offered: Token::MAX,
                minted: Some(token),
                current: None,
                message: "above the counter".into(),
            },
            ApiError::IssuerUnavailable {
                issuer: "redis".into(),
                detail: "refused".into(),
            },
            ApiError::StaleToken {
                offered: token,
                current: token,
                issuer: "redis".into(),
            },
            ApiError::IssuerMismatch {
                offered: "a".into(),
                current: "b".into(),
            },
            ApiError::NoIssuerForPage {
                id: "p".into(),
                offered: "redis".into(),
            },
            ApiError::ForceRequired {
                issuer: "redis".into(),
                token,
                minted: None,
            },
            ApiError::FencingOff,
            ApiError::VersionMismatch {
                expected: 1,
                current: None,
            },
            ApiError::FencingTokenRequired,
            ApiError::PageNotFound {
                id: "p".into(),
                fence: None,
            },
            ApiError::NoRoute("GET /x".into()),
            ApiError::MethodNotAllowed,
            ApiError::BodyTooLarge,
            ApiError::UnsupportedMediaType,
            ApiError::DatabaseUnavailable(DbError::Unavailable("down".into())),
            ApiError::Timeout,
            ApiError::OutcomeUnknown {
                id: "p".into(),
                method: "PUT",
                token: None,
            },
            ApiError::Internal("bug".into()),
        ];
        for code in ErrorCode::ALL {
            if code.status() == StatusCode::BAD_REQUEST {
                all.push(ApiError::bad_request(code, "bad"));
            }
        }
        // A new variant must be added above: this match has no wildcard.
        for e in &all {
            match e {
                ApiError::Unauthorized(_)
                | ApiError::ClientIdMismatch { .. }
                | ApiError::Forbidden
                | ApiError::UnknownIssuer { .. }
                | ApiError::TokenNotCurrent { .. }
                | ApiError::SuspectedForgery { .. }
                | ApiError::IssuerUnavailable { .. }
                | ApiError::StaleToken { .. }
                | ApiError::IssuerMismatch { .. }
                | ApiError::NoIssuerForPage { .. }
                | ApiError::ForceRequired { .. }
                | ApiError::FencingOff
                | ApiError::VersionMismatch { .. }
                | ApiError::FencingTokenRequired
                | ApiError::PageNotFound { .. }
                | ApiError::NoRoute(_)
                | ApiError::MethodNotAllowed
                | ApiError::BadRequest { .. }
                | ApiError::BodyTooLarge
                | ApiError::UnsupportedMediaType
                | ApiError::DatabaseUnavailable(_)
                | ApiError::Timeout
                | ApiError::OutcomeUnknown { .. }
                | ApiError::Internal(_) => {}
            }
        }
        all
    }

    #[test]
    fn every_error_body_has_exactly_the_fields_its_code_declares() {
        let errors = one_of_each();
        let mut kinds: Vec<ErrorCode> = errors.iter().map(ApiError::kind).collect();
        kinds.sort();
        let mut all = ErrorCode::ALL.to_vec();
        all.sort();
        assert_eq!(kinds, all, "one error per code, every code answered");
        for e in errors {
            let code = e.kind();
            assert_eq!(e.status(), code.status(), "{code:?}");
            assert_eq!(e.code(), code.as_str());
            let mut fields: Vec<String> = e.details().keys().cloned().collect();
            fields.sort();
            let mut declared: Vec<String> = code
                .details()
                .iter()
                .map(|(n, _)| (*n).to_owned())
                .collect();
            declared.sort();
            assert_eq!(fields, declared, "{code:?}");
        }
    }

    #[test]
    fn error_codes_are_distinct() {
        let mut names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn protocol_errors_are_bugs_and_unavailability_is_503() {
        let protocol = ApiError::from(sqlx::Error::Protocol("unexpected message".into()));
        assert_eq!(protocol.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let failed = ApiError::from(DbError::Failed("unexpected message 'D'".into()));
        assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(failed.code(), "internal");
        let down = ApiError::from(DbError::Unavailable("connection refused".into()));
        assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(down.code(), "database_unavailable");
        let io = ApiError::from(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()));
        assert_eq!(io.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn outcome_unknown_is_a_504_of_its_own_with_what_was_sent() {
        let e = ApiError::OutcomeUnknown {
            id: "p".into(),
            method: "PUT",
            token: Token::new(3),
        };
        assert_eq!(e.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(e.code(), "outcome_unknown");
        assert_ne!(e.code(), ApiError::Timeout.code());
        assert_eq!(
            Value::Object(e.details()),
            json!({"id": "p", "method": "PUT", "token": 3})
        );
    }
}
