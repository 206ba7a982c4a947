//! The `error` codes: each with its status, its meaning and the fields
//! beside it, the one list the responses and the OpenAPI description are
//! made from.

use axum::http::StatusCode;

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
    /// 400: `limit` is not from 1 to 1000.
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
    /// 429, with `Retry-After`: this client's writes are over its rate.
    RateLimited,
    /// 428: a write without `Fencing-Token` while fencing is enforced.
    FencingTokenRequired,
    /// 500: a bug, logged in full and answered generically.
    Internal,
    /// 503: the token's issuer cannot be asked (fail closed, nothing written).
    IssuerUnavailable,
    /// 503: PostgreSQL cannot be reached; nothing was written.
    DatabaseUnavailable,
    /// 503, with `Retry-After`: the dashboard streams' limit is reached.
    TooManyStreams,
    /// 503, with `Retry-After`: the connections' limit is reached; the
    /// connection is closed.
    TooManyConnections,
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
    /// A count (0 or more).
    Count,
    /// `true` or `false`.
    Flag,
}

impl ErrorCode {
    /// Every code, in the order of their statuses.
    pub const ALL: [ErrorCode; 38] = [
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
        Self::RateLimited,
        Self::Internal,
        Self::IssuerUnavailable,
        Self::DatabaseUnavailable,
        Self::TooManyStreams,
        Self::TooManyConnections,
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
            Self::RateLimited => "rate_limited",
            Self::Internal => "internal",
            Self::IssuerUnavailable => "issuer_unavailable",
            Self::DatabaseUnavailable => "database_unavailable",
            Self::TooManyStreams => "too_many_streams",
            Self::TooManyConnections => "too_many_connections",
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
            Self::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::IssuerUnavailable
            | Self::DatabaseUnavailable
            | Self::TooManyStreams
            | Self::TooManyConnections => StatusCode::SERVICE_UNAVAILABLE,
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
            Self::RateLimited => &[("per_second", Detail::Count)],
            Self::TooManyStreams | Self::TooManyConnections => {
                &[("limit", Detail::Count), ("per_address", Detail::Flag)]
            }
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
            Self::InvalidLimit => "limit is not from 1 to 1000",
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
            Self::RateLimited => "this client's fenced requests are over its rate (GATEWAY_WRITE_RATE_PER_KEY): nothing written; retry after Retry-After seconds",
            Self::TooManyStreams => "as many dashboard streams are open as the gateway serves (GATEWAY_MAX_STREAMS), or from this client's address (GATEWAY_MAX_STREAMS_PER_ADDRESS): retry after Retry-After seconds",
            Self::TooManyConnections => "as many connections are open as the gateway serves (GATEWAY_MAX_CONNECTIONS), or from this client's address (GATEWAY_MAX_CONNECTIONS_PER_ADDRESS): the connection is closed; retry after Retry-After seconds",
            Self::Timeout => "the request's deadline passed before anything was sent to the database: nothing written",
            Self::OutcomeUnknown => "the deadline passed after the statement was sent: it may still commit; read before retrying",
        }
    }
}
