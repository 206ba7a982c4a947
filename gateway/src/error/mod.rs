//! One error type for every rejection: it knows its status, its code, and
//! writes the JSON body `{"error": "<code>", "message": "...", ...details}`.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::header::{RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use fencelock::Token;
use serde_json::{json, Map, Value};

use crate::db::DbError;
use crate::metrics::Outcome;
use crate::store::Fence;

mod code;

pub use code::{Detail, ErrorCode};

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
    /// 429 `rate_limited`, with `Retry-After`: this client's writes are over
    /// its rate (`--write-rate-per-key`); nothing written.
    #[error("this client's writes are limited to {per_second} a second; retry in {} ms", retry_after.as_millis())]
    RateLimited {
        per_second: u32,
        retry_after: std::time::Duration,
    },
    /// 503 `too_many_streams`, with `Retry-After`: the dashboard streams'
    /// limit is reached, overall or for this client's address.
    #[error("{} dashboard streams are open{}, the most this gateway serves; retry later", limit, if *per_address { " from your address" } else { "" })]
    TooManyStreams { limit: usize, per_address: bool },
    /// 503 `too_many_connections`, with `Retry-After`: written by the accept
    /// loop, which then closes the connection.
    #[error("{} connections are open{}, the most this gateway serves; retry later", limit, if *per_address { " from your address" } else { "" })]
    TooManyConnections { limit: usize, per_address: bool },
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
            Self::RateLimited { .. } => ErrorCode::RateLimited,
            Self::TooManyStreams { .. } => ErrorCode::TooManyStreams,
            Self::TooManyConnections { .. } => ErrorCode::TooManyConnections,
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
            Self::RateLimited { per_second, .. } => json!({"per_second": per_second}),
            Self::TooManyStreams { limit, per_address }
            | Self::TooManyConnections { limit, per_address } => {
                json!({"limit": limit, "per_address": per_address})
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
        let retry_after = match &self {
            Self::TooManyStreams { .. } | Self::TooManyConnections { .. } => {
                Some(crate::limits::RETRY_AFTER)
            }
            Self::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        };
        if let Some(wait) = retry_after {
            // Whole seconds, rounded up: never earlier than the wait.
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
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
            ApiError::RateLimited {
                per_second: 10,
                retry_after: std::time::Duration::from_millis(100),
            },
            ApiError::TooManyStreams {
                limit: 16,
                per_address: true,
            },
            ApiError::TooManyConnections {
                limit: 1024,
                per_address: false,
            },
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
                | ApiError::RateLimited { .. }
                | ApiError::TooManyStreams { .. }
                | ApiError::TooManyConnections { .. }
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
