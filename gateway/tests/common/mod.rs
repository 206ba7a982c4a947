//! Shared helpers: a gateway on a fresh database and a small HTTP client.
#![allow(dead_code)]

use gateway::{FenceCheck, RunningGateway};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde_json::Value;

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub json: Value,
}

impl Reply {
    /// The `error` code of a JSON rejection.
    #[track_caller]
    pub fn error(&self) -> &str {
        self.json["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error code in {} {}", self.status, self.json))
    }

    #[track_caller]
    pub fn expect(self, status: u16) -> Self {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.json);
        self
    }

    #[track_caller]
    pub fn expect_error(self, status: u16, code: &str) -> Self {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.json);
        assert_eq!(self.error(), code, "body: {}", self.json);
        assert!(
            self.json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "no message in {}",
            self.json
        );
        self
    }

    pub fn etag(&self) -> Option<&str> {
        self.headers.get("etag").and_then(|v| v.to_str().ok())
    }
}

#[derive(Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
}

impl Api {
    pub fn new(base: String) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(20))
                .build()
                .expect("client"),
            base,
        }
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> Reply {
        let resp = req.send().await.expect("request reaches the gateway");
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{status}: body is not JSON: {text:?}"));
        Reply {
            status,
            headers,
            json,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// PUT `{"body": body}` with the given headers.
    pub async fn put(&self, id: &str, body: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = self
            .http
            .put(self.url(&format!("/pages/{id}")))
            .json(&serde_json::json!({ "body": body }));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req).await
    }

    pub async fn put_fenced(&self, id: &str, body: &str, token: u64) -> Reply {
        self.put(id, body, &[("Fencing-Token", &token.to_string())])
            .await
    }

    pub async fn get(&self, id: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = self.http.get(self.url(&format!("/pages/{id}")));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req).await
    }

    pub async fn history(&self, id: &str) -> Vec<Value> {
        let r = self
            .send(
                self.http
                    .get(self.url(&format!("/pages/{id}/history?limit=10000"))),
            )
            .await
            .expect(200);
        r.json["history"].as_array().expect("history array").clone()
    }
}

/// A gateway on a fresh database of the shared test server.
pub async fn gateway(fencing: FenceCheck) -> (RunningGateway, Api, String) {
    let url = harness::fresh_database().await;
    let gw = gateway::spawn(&url, fencing).await.expect("spawn gateway");
    let api = Api::new(gw.url());
    (gw, api, url)
}
