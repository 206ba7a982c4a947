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
    #[error("this gateway checks fencing tokens with the issuers {known:?}; {issuer:?} is not one of them (send Fencing-Issuer with your lock service's name)")]
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
    /// 409 `issuer_mismatch`: the page is fenced by another lock service, whose
    /// tokens are not comparable with these.
    #[error("the page is fenced by issuer {current:?}, not {offered:?}; tokens of different lock services are not comparable")]
    IssuerMismatch { offered: String, current: String },
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
    /// 400 with the given code (`invalid_page_id`, `invalid_fencing_token`,
    /// `invalid_fencing_issuer`, `invalid_client_id`, `invalid_if_match`,
    /// `invalid_json`, `invalid_body`, `invalid_limit`, `invalid_path`).
    #[error("{message}")]
    BadRequest { code: &'static str, message: String },
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
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::BadRequest {
            code,
            message: message.into(),
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::Unauthorized(message.into())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::ClientIdMismatch { .. } | Self::Forbidden => StatusCode::FORBIDDEN,
            Self::StaleToken { .. }
            | Self::IssuerMismatch { .. }
            | Self::UnknownIssuer { .. }
            | Self::TokenNotCurrent { .. } => StatusCode::CONFLICT,
            Self::IssuerUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::VersionMismatch { .. } => StatusCode::PRECONDITION_FAILED,
            Self::FencingTokenRequired => StatusCode::PRECONDITION_REQUIRED,
            Self::PageNotFound { .. } | Self::NoRoute(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::DatabaseUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Timeout | Self::OutcomeUnknown { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthorized(_) => "unauthorized",
            Self::ClientIdMismatch { .. } => "client_id_mismatch",
            Self::Forbidden => "forbidden",
            Self::UnknownIssuer { .. } => "unknown_issuer",
            Self::TokenNotCurrent { .. } => "token_not_current",
            Self::IssuerUnavailable { .. } => "issuer_unavailable",
            Self::StaleToken { .. } => "stale_token",
            Self::IssuerMismatch { .. } => "issuer_mismatch",
            Self::VersionMismatch { .. } => "version_mismatch",
            Self::FencingTokenRequired => "fencing_token_required",
            Self::PageNotFound { .. } => "page_not_found",
            Self::NoRoute(_) => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::BadRequest { code, .. } => code,
            Self::BodyTooLarge => "body_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::DatabaseUnavailable(_) => "database_unavailable",
            Self::Timeout => "timeout",
            Self::OutcomeUnknown { .. } => "outcome_unknown",
            Self::Internal(_) => "internal",
        }
    }

    fn details(&self) -> Map<String, Value> {
        let value = match self {
            Self::ClientIdMismatch { client, .. } => json!({"client_id": client}),
            Self::UnknownIssuer { issuer, known } => json!({"issuer": issuer, "known": known}),
            Self::TokenNotCurrent {
                issuer,
                offered,
                holder,
                ..
            } => json!({"issuer": issuer, "offered_token": offered, "holder_token": holder}),
            Self::IssuerUnavailable { issuer, .. } => json!({"issuer": issuer}),
            Self::StaleToken {
                offered,
                current,
                issuer,
            } => json!({"offered_token": offered, "current_token": current, "issuer": issuer}),
            Self::IssuerMismatch { offered, current } => {
                json!({"offered_issuer": offered, "current_issuer": current})
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
                Self::bad_request("invalid_json", r.body_text())
            }
            other => Self::bad_request("invalid_body", other.body_text()),
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        Self::bad_request("invalid_path", r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self::bad_request("invalid_query", r.body_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
