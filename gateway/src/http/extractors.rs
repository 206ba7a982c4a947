//! Extractors that refuse with our JSON errors instead of axum's plain text:
//! page ids, JSON bodies, query strings, the fencing headers (with the
//! writer authenticated where it must be) and the admin's key.

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::header::IF_MATCH;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};
use axum::Json;
use fencelock::Token;
use serde::de::DeserializeOwned;

use crate::auth::{self, AuthMode};
use crate::error::{ApiError, ErrorCode};
use crate::issuers::valid_issuer_name;
use crate::AppState;

/// A validated page id, `[A-Za-z0-9_-]{1,128}`.
pub struct PageId(pub String);

impl PageId {
    /// `id` if it is a page id, else 400 `invalid_page_id`.
    pub fn parse(id: String) -> Result<Self, ApiError> {
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

impl<S: Send + Sync> FromRequestParts<S> for PageId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state).await?;
        PageId::parse(id)
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
