//! The gateway's HTTP API as the worker uses it: fenced GET and PUT of a page,
//! with the gateway's JSON errors parsed into [`GatewayError`].

use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::Value;

pub use fencelock::Token;

/// What a lock holder sends with each request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
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
    /// 412 `version_mismatch`: If-Match did not match the page's version.
    #[error("412 version_mismatch: {message}")]
    VersionMismatch { message: String },
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

impl GatewayError {
    /// Whether the same request can succeed later.
    pub fn is_transient(&self) -> bool {
        matches!(self, GatewayError::Unavailable { .. })
    }

    /// Refused by the fence: the token (or its issuer) lost to a newer holder.
    pub fn is_fence_rejection(&self) -> bool {
        matches!(
            self,
            GatewayError::StaleToken { .. } | GatewayError::IssuerMismatch { .. }
        )
    }

    /// HTTP status and error code, for events.
    pub fn status_and_code(&self) -> (u16, &'static str) {
        match self {
            GatewayError::StaleToken { .. } => (409, "stale_token"),
            GatewayError::IssuerMismatch { .. } => (409, "issuer_mismatch"),
            GatewayError::VersionMismatch { .. } => (412, "version_mismatch"),
            GatewayError::Unavailable { .. } => (503, "unavailable"),
            GatewayError::OutcomeUnknown { .. } => (504, "outcome_unknown"),
            GatewayError::Http { status, .. } => (*status, "http_error"),
            GatewayError::Protocol { .. } => (0, "protocol"),
        }
    }
}

/// A client of one gateway. Cheap to clone.
#[derive(Debug, Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    base: String,
    client_id: String,
}

impl GatewayClient {
    pub fn new(base: &str, client_id: &str) -> Result<Self, GatewayError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| GatewayError::Protocol {
                detail: format!("cannot build the HTTP client: {e}"),
            })?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            client_id: client_id.to_string(),
        })
    }

    fn url(&self, page: &str) -> String {
        format!("{}/pages/{page}", self.base)
    }

    fn headers(
        &self,
        req: reqwest::RequestBuilder,
        fence: Option<&Fence>,
    ) -> reqwest::RequestBuilder {
        let req = req.header("Client-Id", &self.client_id);
        match fence {
            Some(f) => req
                .header("Fencing-Token", f.token.to_string())
                .header("Fencing-Issuer", &f.issuer),
            None => req,
        }
    }

    /// GET the page; with a fence, the read raises the page's fence to our
    /// token. 404 is an empty page at version 0.
    pub async fn get(&self, page: &str, fence: Option<&Fence>) -> Result<Page, GatewayError> {
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
            let text = resp.text().await.unwrap_or_default();
            return Err(match parse_error(status, &text, fence) {
                // A fenced read only raises the fence to our own token: doing
                // it again is safe, so it is retried like any 503.
                GatewayError::OutcomeUnknown { message } => GatewayError::Unavailable {
                    detail: format!("504 outcome_unknown: {message}"),
                },
                other => other,
            });
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
        fence: Option<&Fence>,
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
            let text = resp.text().await.unwrap_or_default();
            return Err(parse_error(status, &text, fence));
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

/// Turn the gateway's JSON error (`{"error": code, "message": ..., details}`)
/// into a [`GatewayError`].
fn parse_error(status: StatusCode, text: &str, fence: Option<&Fence>) -> GatewayError {
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
        (412, _) => GatewayError::VersionMismatch { message },
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
}
