//! Shared helpers: a gateway on a fresh database, a small HTTP client that
//! sends its API key, and the waits several tests need.

use std::time::Duration;

use gateway::{FenceCheck, GatewayOptions, RunningGateway};
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

/// The writers every keyed test gateway knows; see [`key_of`].
pub const CLIENTS: [&str; 7] = [
    "tester", "worker-1", "worker-2", "worker-3", "alice", "bob", "mallory",
];
/// The admin every keyed test gateway knows.
pub const ADMIN: &str = "ops";

/// The test key of a client (or admin): at least 16 bytes, never secret.
pub fn key_of(client: &str) -> String {
    format!("{client}-test-key-not-secret")
}

/// Options with every [`CLIENTS`] key and the [`ADMIN`] key: auth required.
pub fn keyed(fencing: FenceCheck) -> GatewayOptions {
    CLIENTS
        .iter()
        .fold(GatewayOptions::new(fencing), |o, c| {
            o.api_key(c, &key_of(c))
        })
        .admin_key(ADMIN, &key_of(ADMIN))
}

#[derive(Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
    /// Sent as `Authorization: Bearer` with every request, when set.
    pub key: Option<String>,
}

impl Api {
    /// A client without a key.
    pub fn new(base: String) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(20))
                .build()
                .expect("client"),
            base,
            key: None,
        }
    }

    /// The same gateway, as `client` (with its [`key_of`]).
    pub fn as_client(&self, client: &str) -> Self {
        self.with_key(Some(key_of(client)))
    }

    /// The same gateway with this key (or none).
    pub fn with_key(&self, key: Option<String>) -> Self {
        Self {
            key,
            ..self.clone()
        }
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> Reply {
        let req = match &self.key {
            Some(key) => req.bearer_auth(key),
            None => req,
        };
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

    /// PUT with `Fencing-Token: token` and `headers` besides.
    pub async fn put_fenced_with(
        &self,
        id: &str,
        body: &str,
        token: u64,
        headers: &[(&str, &str)],
    ) -> Reply {
        let token = token.to_string();
        let mut all = vec![("Fencing-Token", token.as_str())];
        all.extend_from_slice(headers);
        self.put(id, body, &all).await
    }

    pub async fn put_fenced(&self, id: &str, body: &str, token: u64) -> Reply {
        self.put_fenced_with(id, body, token, &[]).await
    }

    /// PUT with `token` of `issuer` (`Fencing-Issuer`).
    pub async fn put_issued(&self, id: &str, body: &str, token: u64, issuer: &str) -> Reply {
        self.put_fenced_with(id, body, token, &[("Fencing-Issuer", issuer)])
            .await
    }

    /// PUT with `token` and `Client-Id: client`.
    pub async fn put_with_client_id(
        &self,
        id: &str,
        body: &str,
        token: u64,
        client: &str,
    ) -> Reply {
        self.put_fenced_with(id, body, token, &[("Client-Id", client)])
            .await
    }

    pub async fn get(&self, id: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = self.http.get(self.url(&format!("/pages/{id}")));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req).await
    }

    /// GET any path of the API.
    pub async fn get_path(&self, path: &str) -> Reply {
        self.send(self.http.get(self.url(path))).await
    }

    /// POST `body` as JSON.
    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(self.http.post(self.url(path)).json(body)).await
    }

    /// `POST /admin/pages/{id}/fence` with `body`.
    pub async fn set_fence(&self, id: &str, body: &Value) -> Reply {
        self.post(&format!("/admin/pages/{id}/fence"), body).await
    }

    /// While no database server takes writes: a write of `id`, a read of it
    /// and `/readyz` all answer 503 `database_unavailable`.
    pub async fn expect_database_unavailable(&self, id: &str, token: u64) {
        for reply in [
            self.put_fenced(id, "while the database is away", token)
                .await,
            self.get(id, &[]).await,
            self.get_path("/readyz").await,
        ] {
            reply.expect_error(503, "database_unavailable");
        }
    }

    /// Wait (bounded) until `/readyz` answers 200: PostgreSQL is back.
    pub async fn wait_ready(&self, within: Duration) {
        harness::wait_until(within, || async {
            let status = self
                .http
                .get(self.url("/readyz"))
                .send()
                .await
                .map_err(|e| e.to_string())?
                .status();
            match status.is_success() {
                true => Ok(()),
                false => Err(format!("readyz {status}")),
            }
        })
        .await
        .expect("the gateway is ready again");
    }

    /// The whole history, newest first, page after page.
    pub async fn history(&self, id: &str) -> Vec<Value> {
        let mut all: Vec<Value> = Vec::new();
        loop {
            let before = all.last().map_or(i64::MAX, |e| e["seq"].as_i64().unwrap());
            let r = self
                .get_path(&format!("/pages/{id}/history?limit=1000&before={before}"))
                .await
                .expect(200);
            let page = r.json["history"].as_array().expect("history array").clone();
            let full = page.len() == 1000;
            all.extend(page);
            if !full {
                return all;
            }
        }
    }
    /// The page (`None` for 404) and its whole history: what a rejection
    /// must leave as it was.
    pub async fn snapshot(&self, id: &str) -> (Option<Value>, Vec<Value>) {
        let reply = self.with_key(None).get(id, &[]).await;
        let page = match reply.status.as_u16() {
            200 => Some(reply.json),
            404 => None,
            s => panic!("GET {id}: {s} {}", reply.json),
        };
        (page, self.history(id).await)
    }

    /// The fence of a page's row (also of a page only fenced, never written).
    pub async fn fence(&self, id: &str) -> Value {
        let reply = self.with_key(None).get(id, &[]).await;
        match reply.status.as_u16() {
            200 | 404 => reply.json["fence"].clone(),
            s => panic!("GET {id}: {s} {}", reply.json),
        }
    }
}

/// A gateway on a fresh database of the shared test server, with every
/// [`CLIENTS`] key (authentication required); the [`Api`] writes as `tester`.
pub async fn gateway(fencing: FenceCheck) -> (RunningGateway, Api, String) {
    gateway_with(keyed(fencing)).await
}

/// A gateway with these options on a fresh database; the [`Api`] writes as
/// `tester`.
pub async fn gateway_with(options: GatewayOptions) -> (RunningGateway, Api, String) {
    let url = harness::fresh_database().await;
    let gw = gateway::spawn_with_options(&url, options)
        .await
        .expect("spawn gateway");
    let api = Api::new(gw.url()).as_client("tester");
    (gw, api, url)
}

/// The `outcome` of each history row, newest first.
pub fn outcomes(history: &[Value]) -> Vec<&str> {
    history
        .iter()
        .map(|h| h["outcome"].as_str().expect("an outcome"))
        .collect()
}

/// Wait (bounded) until exactly `n` statements of the gateway wait for a
/// lock in `url`'s database.
pub async fn wait_statements_waiting_for_a_lock(url: &str, n: i64) {
    use sqlx::Connection;
    harness::wait_until(Duration::from_secs(20), || async move {
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let waiting = sqlx::query_scalar::<_, i64>(
            "select count(*) from pg_stat_activity
             where application_name = 'gateway' and wait_event_type = 'Lock'
               and datname = current_database()",
        )
        .fetch_one(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
        match waiting {
            w if w == n => Ok(()),
            w => Err(format!("{w} statements waiting for a lock, expected {n}")),
        }
    })
    .await
    .expect("the gateway's statements wait for the lock");
}
