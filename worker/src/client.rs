//! The gateway's HTTP API as the worker uses it: fenced GET and PUT of a page,
//! with the gateway's JSON errors parsed into [`GatewayError`].
//!
//! With an [`ApiKey`] every request carries `Authorization: Bearer <key>`
//! (marked sensitive, so it never appears in reqwest's debug output). The
//! gateway takes the key's client as the writer; `Client-Id` is still sent
//! so that a key of another client is refused (403) instead of writing under
//! a name the lock service never saw.

use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::Value;

pub use fencelock::Token;

/// An API key for the gateway. Its `Debug` and `Display` never show the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// The key as sent in `Authorization: Bearer`.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for ApiKey {
    type Err = String;

    /// 1 to 4096 visible ASCII characters (what a header value can carry
    /// as is); the message never repeats the key.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("the API key is empty".into());
        }
        if s.len() > 4096 || !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "the API key ({} bytes) must be at most 4096 visible ASCII characters, \
                 without spaces",
                s.len()
            ));
        }
        Ok(ApiKey(s.to_owned()))
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey(<{} bytes, hidden>)", self.0.len())
    }
}

/// What a lock holder offers with each fenced request: its grant's token
/// and the lock service that issued it (the `Fencing-Token` and
/// `Fencing-Issuer` headers). Not the page's fence: that is the highest token
/// the gateway has accepted, which the gateway names `fence`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedToken {
    pub token: Token,
    pub issuer: String,
}

/// A page as the gateway returns it. A page that does not exist yet reads as
/// empty at version 0.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Page {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub version: u64,
}

/// An acknowledged write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// 201 when the write created the page, 200 when it updated it.
    pub status: u16,
    pub page: Page,
}

/// Everything the gateway (or the way to it) can answer instead of a page.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// 409 `stale_token`: the page's fence is higher than the token offered.
    #[error("409 stale_token: offered token {offered:?}, page fence {current:?}: {message}")]
    StaleToken {
        offered: Option<Token>,
        current: Option<Token>,
        message: String,
    },
    /// 409 `issuer_mismatch`: the page is fenced by another lock service.
    #[error("409 issuer_mismatch: {message}")]
    IssuerMismatch { message: String },
    /// 409 `token_not_current`: the token's issuer says the lock is not held
    /// by this client with this token right now (guessed, copied, expired,
    /// superseded). Refused like a stale token.
    #[error(
        "409 token_not_current: issuer {issuer} says token {offered:?} is not held by us now \
         (holder token {holder:?}): {message}"
    )]
    TokenNotCurrent {
        issuer: String,
        offered: Option<Token>,
        holder: Option<Token>,
        message: String,
    },
    /// 409 `unknown_issuer`: the gateway does not trust the lock service that
    /// granted our token. A configuration error.
    #[error("409 unknown_issuer: the gateway does not trust issuer {issuer:?} (it knows {known:?}): {message}")]
    UnknownIssuer {
        issuer: String,
        known: Vec<String>,
        message: String,
    },
    /// 409 `no_issuer_for_page`: the gateway's operator has named no lock
    /// service for this page. A configuration error (the gateway's).
    #[error("409 no_issuer_for_page: {message}")]
    NoIssuerForPage { message: String },
    /// 401 `unauthorized`: no API key, or one the gateway does not know. A
    /// configuration error.
    #[error("401 unauthorized: {message}")]
    Unauthorized { message: String },
    /// 403: the key belongs to another client than our `Client-Id`
    /// (`client_id_mismatch`, with the key's client), or is not allowed here.
    /// A configuration error.
    #[error("403 {code}: {message}")]
    Forbidden {
        code: String,
        key_client: Option<String>,
        message: String,
    },
    /// 503 `issuer_unavailable`: the gateway could not ask the token's issuer
    /// in time, so it wrote nothing. Retryable.
    #[error(
        "503 issuer_unavailable: the gateway could not check the token with {issuer}: {message}"
    )]
    IssuerUnavailable { issuer: String, message: String },
    /// 412 `version_mismatch`: If-Match did not match the page's version.
    #[error("412 version_mismatch: {message}")]
    VersionMismatch { message: String },
    /// 429 `rate_limited`: this client's writes are over the rate the
    /// gateway allows it; nothing written. Retryable after `retry_after`
    /// (its `Retry-After`).
    #[error("429 rate_limited: {message}")]
    RateLimited {
        retry_after: std::time::Duration,
        message: String,
    },
    /// Gateway unreachable, timed out, or answering 502/503/504. Retryable.
    #[error("gateway unavailable: {detail}")]
    Unavailable { detail: String },
    /// 504 `outcome_unknown`: the gateway sent our write to the database and
    /// its deadline passed before the database answered. The write may have
    /// landed (or may still land): read the page before retrying it.
    #[error("504 outcome_unknown: {message}")]
    OutcomeUnknown { message: String },
    /// Any other error answer from the gateway.
    #[error("gateway answered {status} {code}: {message}")]
    Http {
        status: u16,
        code: String,
        message: String,
    },
    /// The gateway answered something this client does not understand.
    #[error("unexpected answer from the gateway: {detail}")]
    Protocol { detail: String },
}

/// What a caller does about a [`GatewayError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Remedy {
    /// Send the same request again later.
    Retry,
    /// Nothing: the token (or its issuer) is not the current holder's.
    LockMovedOn,
    /// Fix the configuration (key, client id, lock service).
    Reconfigure,
    /// It depends on the request.
    Decide,
}

impl GatewayError {
    /// Every variant sorted once, without a catch-all, so that a new one
    /// must be sorted too.
    fn remedy(&self) -> Remedy {
        match self {
            GatewayError::Unavailable { .. }
            | GatewayError::IssuerUnavailable { .. }
            | GatewayError::RateLimited { .. } => Remedy::Retry,
            GatewayError::StaleToken { .. }
            | GatewayError::IssuerMismatch { .. }
            | GatewayError::TokenNotCurrent { .. } => Remedy::LockMovedOn,
            GatewayError::Unauthorized { .. }
            | GatewayError::Forbidden { .. }
            | GatewayError::UnknownIssuer { .. }
            | GatewayError::NoIssuerForPage { .. } => Remedy::Reconfigure,
            GatewayError::VersionMismatch { .. }
            | GatewayError::OutcomeUnknown { .. }
            | GatewayError::Http { .. }
            | GatewayError::Protocol { .. } => Remedy::Decide,
        }
    }

    /// How long the gateway asked us to wait before retrying, if it did.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            GatewayError::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// Whether the same request can succeed later.
    pub fn is_transient(&self) -> bool {
        self.remedy() == Remedy::Retry
    }

    /// Refused by the fence or by the issuer check: the token (or its issuer)
    /// is not the current holder's.
    pub fn is_fence_rejection(&self) -> bool {
        self.remedy() == Remedy::LockMovedOn
    }

    /// The request can never succeed with this configuration (key, client id,
    /// lock service): retrying is pointless.
    pub fn is_config_error(&self) -> bool {
        self.remedy() == Remedy::Reconfigure
    }

    /// HTTP status and error code, for events.
    pub fn status_and_code(&self) -> (u16, &'static str) {
        match self {
            GatewayError::StaleToken { .. } => (409, "stale_token"),
            GatewayError::IssuerMismatch { .. } => (409, "issuer_mismatch"),
            GatewayError::TokenNotCurrent { .. } => (409, "token_not_current"),
            GatewayError::UnknownIssuer { .. } => (409, "unknown_issuer"),
            GatewayError::NoIssuerForPage { .. } => (409, "no_issuer_for_page"),
            GatewayError::Unauthorized { .. } => (401, "unauthorized"),
            GatewayError::Forbidden { code, .. } if code == "client_id_mismatch" => {
                (403, "client_id_mismatch")
            }
            GatewayError::Forbidden { .. } => (403, "forbidden"),
            GatewayError::IssuerUnavailable { .. } => (503, "issuer_unavailable"),
            GatewayError::VersionMismatch { .. } => (412, "version_mismatch"),
            GatewayError::Unavailable { .. } => (503, "unavailable"),
            GatewayError::RateLimited { .. } => (429, "rate_limited"),
            GatewayError::OutcomeUnknown { .. } => (504, "outcome_unknown"),
            GatewayError::Http { status, .. } => (*status, "http_error"),
            GatewayError::Protocol { .. } => (0, "protocol"),
        }
    }
}

/// How long an idle connection to the gateway may be reused.
pub const IDLE_CONNECTION_REUSE: Duration = Duration::from_secs(5);

/// A client of one gateway. Cheap to clone.
#[derive(Debug, Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    base: String,
    client_id: String,
    api_key: Option<ApiKey>,
}

impl GatewayClient {
    pub fn new(base: &str, client_id: &str) -> Result<Self, GatewayError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            // Below the gateway's keep-alive (10 s by default): after a
            // longer pause (the straggler's SIGSTOP) the gateway has closed
            // the idle connection, and reusing it fails the PUT.
            .pool_idle_timeout(IDLE_CONNECTION_REUSE)
            .build()
            .map_err(|e| GatewayError::Protocol {
                detail: format!("cannot build the HTTP client: {e}"),
            })?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            client_id: client_id.to_string(),
            api_key: None,
        })
    }

    /// Send `key` as `Authorization: Bearer` with every request.
    pub fn with_api_key(mut self, key: Option<ApiKey>) -> Self {
        self.api_key = key;
        self
    }

    fn url(&self, page: &str) -> String {
        format!("{}/pages/{page}", self.base)
    }

    fn headers(
        &self,
        req: reqwest::RequestBuilder,
        fence: Option<&OfferedToken>,
    ) -> reqwest::RequestBuilder {
        let mut req = req.header("Client-Id", &self.client_id);
        if let Some(key) = &self.api_key {
            match reqwest::header::HeaderValue::from_str(&format!("Bearer {}", key.expose())) {
                Ok(mut value) => {
                    value.set_sensitive(true);
                    req = req.header(reqwest::header::AUTHORIZATION, value);
                }
                // ApiKey::from_str admits only visible ASCII, which is always a
                // valid header value; leave the header out rather than panic.
                Err(_) => tracing::error!("the API key is not a valid header value"),
            }
        }
        match fence {
            Some(f) => req
                .header("Fencing-Token", f.token.to_string())
                .header("Fencing-Issuer", &f.issuer),
            None => req,
        }
    }

    /// GET the page; with a fence, the read raises the page's fence to our
    /// token. 404 is an empty page at version 0.
    pub async fn get(
        &self,
        page: &str,
        fence: Option<&OfferedToken>,
    ) -> Result<Page, GatewayError> {
        let req = self.headers(self.http.get(self.url(page)), fence);
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND {
            let text = resp.text().await.unwrap_or_default();
            // A 404 naming another error (a route, say) is not "no such page".
            match error_code(&text).as_deref() {
                None | Some("not_found") | Some("page_not_found") => {
                    return Ok(Page {
                        id: page.to_string(),
                        body: String::new(),
                        version: 0,
                    })
                }
                Some(_) => return Err(parse_error(status, &text, fence)),
            }
        }
        if !status.is_success() {
            let retry_after = retry_after_of(&resp);
            let text = resp.text().await.unwrap_or_default();
            return Err(
                match with_wait(parse_error(status, &text, fence), retry_after) {
                    // A fenced read only raises the fence to our own token: doing
                    // it again is safe, so it is retried like any 503.
                    GatewayError::OutcomeUnknown { message } => GatewayError::Unavailable {
                        detail: format!("504 outcome_unknown: {message}"),
                    },
                    other => other,
                },
            );
        }
        resp.json::<Page>()
            .await
            .map_err(|e| GatewayError::Protocol {
                detail: format!("GET /pages/{page}: {e}"),
            })
    }

    /// PUT the page's new body. `if_match` sends `If-Match: "<version>"`.
    pub async fn put(
        &self,
        page: &str,
        body: &str,
        fence: Option<&OfferedToken>,
        if_match: Option<u64>,
    ) -> Result<Written, GatewayError> {
        let mut req = self.headers(self.http.put(self.url(page)), fence);
        if let Some(v) = if_match {
            req = req.header("If-Match", format!("\"{v}\""));
        }
        let resp = req
            .json(&serde_json::json!({ "body": body }))
            .send()
            .await
            .map_err(unreachable)?;
        let status = resp.status();
        if !status.is_success() {
            let retry_after = retry_after_of(&resp);
            let text = resp.text().await.unwrap_or_default();
            return Err(with_wait(parse_error(status, &text, fence), retry_after));
        }
        let page_doc = resp
            .json::<Page>()
            .await
            .map_err(|e| GatewayError::Protocol {
                detail: format!("PUT /pages/{page}: {e}"),
            })?;
        Ok(Written {
            status: status.as_u16(),
            page: page_doc,
        })
    }
}

/// `Retry-After` in seconds (the gateway sends no dates).
fn retry_after_of(resp: &reqwest::Response) -> Option<std::time::Duration> {
    let value = resp.headers().get(reqwest::header::RETRY_AFTER)?;
    let secs: u64 = value.to_str().ok()?.trim().parse().ok()?;
    Some(std::time::Duration::from_secs(secs))
}

/// The error with the wait its answer asked for.
fn with_wait(e: GatewayError, wait: Option<std::time::Duration>) -> GatewayError {
    match (e, wait) {
        (GatewayError::RateLimited { message, .. }, Some(retry_after)) => {
            GatewayError::RateLimited {
                retry_after,
                message,
            }
        }
        (e, _) => e,
    }
}

fn unreachable(e: reqwest::Error) -> GatewayError {
    GatewayError::Unavailable {
        detail: format!("{e}{}", source_chain(&e)),
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

fn error_code(text: &str) -> Option<String> {
    let v: Value = serde_json::from_str(text).ok()?;
    v.get("error")?.as_str().map(str::to_string)
}

/// The first of `keys` holding a number (or an object with a `token`).
fn number_at(v: &Value, keys: &[&str]) -> Option<Token> {
    keys.iter().find_map(|k| match v.get(*k)? {
        Value::Number(n) => n.as_u64().and_then(Token::new),
        Value::String(s) => s.parse().ok(),
        Value::Object(o) => o.get("token").and_then(Value::as_u64).and_then(Token::new),
        _ => None,
    })
}

fn string_at(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

/// Turn the gateway's JSON error (`{"error": code, "message": ..., details}`)
/// into a [`GatewayError`].
fn parse_error(status: StatusCode, text: &str, fence: Option<&OfferedToken>) -> GatewayError {
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let code = v
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let message = v
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| text.chars().take(300).collect());
    match (status.as_u16(), code.as_str()) {
        (409, "stale_token") => GatewayError::StaleToken {
            offered: number_at(&v, &["offered", "offered_token", "token"])
                .or(fence.map(|f| f.token)),
            current: number_at(&v, &["current", "current_token", "fence", "fence_token"]),
            message,
        },
        (409, "issuer_mismatch") => GatewayError::IssuerMismatch { message },
        (409, "no_issuer_for_page") => GatewayError::NoIssuerForPage { message },
        (409, "token_not_current") => GatewayError::TokenNotCurrent {
            issuer: string_at(&v, "issuer")
                .or(fence.map(|f| f.issuer.clone()))
                .unwrap_or_default(),
            offered: number_at(&v, &["offered_token", "offered", "token"])
                .or(fence.map(|f| f.token)),
            holder: number_at(&v, &["holder_token", "holder"]),
            message,
        },
        (409, "unknown_issuer") => GatewayError::UnknownIssuer {
            issuer: string_at(&v, "issuer")
                .or(fence.map(|f| f.issuer.clone()))
                .unwrap_or_default(),
            known: v
                .get("known")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            message,
        },
        (401, _) => GatewayError::Unauthorized { message },
        (403, _) => GatewayError::Forbidden {
            code: if code.is_empty() {
                "forbidden".into()
            } else {
                code
            },
            key_client: string_at(&v, "client_id"),
            message,
        },
        (503, "issuer_unavailable") => GatewayError::IssuerUnavailable {
            issuer: string_at(&v, "issuer")
                .or(fence.map(|f| f.issuer.clone()))
                .unwrap_or_default(),
            message,
        },
        (412, _) => GatewayError::VersionMismatch { message },
        // A second unless the answer's Retry-After says otherwise (`with_wait`).
        (429, _) => GatewayError::RateLimited {
            retry_after: std::time::Duration::from_secs(1),
            message,
        },
        (504, "outcome_unknown") => GatewayError::OutcomeUnknown { message },
        (502..=504, _) => GatewayError::Unavailable {
            detail: format!("{status}: {message}"),
        },
        _ => GatewayError::Http {
            status: status.as_u16(),
            code: if code.is_empty() {
                "unknown".into()
            } else {
                code
            },
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_429_is_retried_after_the_wait_its_answer_names() {
        let body = r#"{"error":"rate_limited","message":"limited","per_second":2}"#;
        let e = parse_error(StatusCode::TOO_MANY_REQUESTS, body, None);
        assert!(e.is_transient());
        assert_eq!(e.status_and_code(), (429, "rate_limited"));
        assert_eq!(e.retry_after(), Some(std::time::Duration::from_secs(1)));
        let e = with_wait(e, Some(std::time::Duration::from_secs(3)));
        assert_eq!(e.retry_after(), Some(std::time::Duration::from_secs(3)));
        let other = with_wait(
            parse_error(StatusCode::SERVICE_UNAVAILABLE, "{}", None),
            Some(std::time::Duration::from_secs(3)),
        );
        assert_eq!(other.retry_after(), None, "only a 429's wait is kept");
    }

    #[test]
    fn stale_token_error_carries_offered_and_current_tokens() {
        let err = parse_error(
            StatusCode::CONFLICT,
            r#"{"error":"stale_token","message":"token 3 is older than 5","offered_token":3,"current_token":5,"issuer":"redis"}"#,
            None,
        );
        assert_eq!(
            err,
            GatewayError::StaleToken {
                offered: Token::new(3),
                current: Token::new(5),
                message: "token 3 is older than 5".into()
            }
        );
        assert!(err.is_fence_rejection());
    }

    #[test]
    fn a_page_without_an_issuer_is_the_gateways_configuration_to_fix() {
        let err = parse_error(
            StatusCode::CONFLICT,
            r#"{"error":"no_issuer_for_page","message":"no lock service is chosen","id":"p","offered_issuer":"redis"}"#,
            None,
        );
        assert_eq!(
            err,
            GatewayError::NoIssuerForPage {
                message: "no lock service is chosen".into()
            }
        );
        assert!(err.is_config_error());
        assert_eq!(err.status_and_code(), (409, "no_issuer_for_page"));
    }

    #[test]
    fn unavailable_and_other_errors_are_told_apart() {
        let e503 = parse_error(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":"database_unavailable","message":"x"}"#,
            None,
        );
        assert!(e503.is_transient());
        let e400 = parse_error(StatusCode::BAD_REQUEST, "not json", None);
        assert!(matches!(e400, GatewayError::Http { status: 400, .. }));
        assert!(!e400.is_transient());
    }

    #[test]
    fn outcome_unknown_is_neither_transient_nor_a_plain_timeout() {
        let unknown = parse_error(
            StatusCode::GATEWAY_TIMEOUT,
            r#"{"error":"outcome_unknown","message":"may land","id":"p","method":"PUT","token":3}"#,
            None,
        );
        assert_eq!(
            unknown,
            GatewayError::OutcomeUnknown {
                message: "may land".into()
            }
        );
        assert!(!unknown.is_transient(), "a blind retry could double-count");
        let timeout = parse_error(
            StatusCode::GATEWAY_TIMEOUT,
            r#"{"error":"timeout","message":"nothing written"}"#,
            None,
        );
        assert!(timeout.is_transient());
    }

    #[test]
    fn trust_errors_are_parsed_with_their_details() {
        let fence = OfferedToken {
            token: Token::new(7).unwrap(),
            issuer: "redis".into(),
        };
        let e = parse_error(
            StatusCode::CONFLICT,
            r#"{"error":"token_not_current","issuer":"redis","offered_token":7,"holder_token":9,"message":"m"}"#,
            Some(&fence),
        );
        assert_eq!(
            e,
            GatewayError::TokenNotCurrent {
                issuer: "redis".into(),
                offered: Token::new(7),
                holder: Token::new(9),
                message: "m".into()
            }
        );
        assert!(e.is_fence_rejection() && !e.is_transient() && !e.is_config_error());
        assert_eq!(e.status_and_code(), (409, "token_not_current"));

        let nobody = parse_error(
            StatusCode::CONFLICT,
            r#"{"error":"token_not_current","issuer":"redis","offered_token":7,"holder_token":null,"message":"m"}"#,
            Some(&fence),
        );
        assert!(matches!(
            nobody,
            GatewayError::TokenNotCurrent { holder: None, .. }
        ));

        let e = parse_error(
            StatusCode::UNAUTHORIZED,
            r#"{"error":"unauthorized","message":"no key"}"#,
            None,
        );
        assert!(e.is_config_error() && !e.is_transient());
        assert_eq!(e.status_and_code(), (401, "unauthorized"));

        let e = parse_error(
            StatusCode::FORBIDDEN,
            r#"{"error":"client_id_mismatch","client_id":"bob","message":"m"}"#,
            None,
        );
        assert_eq!(
            e,
            GatewayError::Forbidden {
                code: "client_id_mismatch".into(),
                key_client: Some("bob".into()),
                message: "m".into()
            }
        );
        assert!(e.is_config_error());
        assert_eq!(e.status_and_code(), (403, "client_id_mismatch"));

        let e = parse_error(
            StatusCode::CONFLICT,
            r#"{"error":"unknown_issuer","issuer":"redis","known":["zookeeper"],"message":"m"}"#,
            Some(&fence),
        );
        assert!(matches!(&e, GatewayError::UnknownIssuer { known, .. } if known == &["zookeeper"]));
        assert!(e.is_config_error());

        let e = parse_error(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":"issuer_unavailable","issuer":"redis","message":"timed out"}"#,
            Some(&fence),
        );
        assert!(matches!(&e, GatewayError::IssuerUnavailable { issuer, .. } if issuer == "redis"));
        assert!(e.is_transient() && !e.is_config_error());
        assert_eq!(e.status_and_code(), (503, "issuer_unavailable"));
    }

    #[test]
    fn api_keys_never_show_in_debug_output_or_errors() {
        let key: ApiKey = "demo-alice-key-not-secret".parse().unwrap();
        assert!(!format!("{key:?}").contains("alice"));
        let err = "has space-in-it-secret".parse::<ApiKey>().unwrap_err();
        assert!(!err.contains("secret"), "{err}");
        assert!("".parse::<ApiKey>().is_err());
        let client = GatewayClient::new("http://g", "alice")
            .unwrap()
            .with_api_key(Some(key));
        assert!(!format!("{client:?}").contains("demo-alice-key"));
    }
}
