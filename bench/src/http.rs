//! The HTTP load generator of the gateway benchmarks (`gateway`, `trust`,
//! `scale`): keep-alive HTTP/1.1 connections on raw TCP, each sending fenced
//! PUTs back to back. A request is formatted into a buffer the connection
//! reuses and a response is read by its Content-Length, so that, like
//! pgbench's C client beside it, the generator takes as little of the shared
//! CPU as it can: a general client (reqwest, or hyper's own) does more work
//! per request, and that work would land in the figures it is there to
//! measure.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::stats::Run;

/// The headers every PUT of a load carries besides `Fencing-Token`.
#[derive(Debug, Clone, Default)]
pub struct Headers {
    /// `Fencing-Issuer`.
    pub issuer: Option<String>,
    /// `Client-Id`.
    pub client_id: Option<String>,
    /// `Authorization: Bearer <key>`.
    pub key: Option<String>,
}

/// One keep-alive HTTP/1.1 connection that sends fenced PUTs of one body.
pub struct PutConn {
    stream: BufReader<TcpStream>,
    headers: Headers,
    json: Arc<str>,
    request: Vec<u8>,
    line: String,
    body: Vec<u8>,
}

impl PutConn {
    pub async fn connect(
        addr: SocketAddr,
        headers: Headers,
        json: Arc<str>,
    ) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: BufReader::new(stream),
            headers,
            json,
            request: Vec::with_capacity(512),
            line: String::new(),
            body: Vec::new(),
        })
    }

    /// PUT page `id` with `token`: the status (the body is [`PutConn::body`]).
    pub async fn put(&mut self, id: u64, token: u64) -> anyhow::Result<u16> {
        let r = &mut self.request;
        r.clear();
        write!(
            r,
            "PUT /pages/{id} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n\
             fencing-token: {token}\r\n"
        )?;
        if let Some(issuer) = &self.headers.issuer {
            write!(r, "fencing-issuer: {issuer}\r\n")?;
        }
        if let Some(client) = &self.headers.client_id {
            write!(r, "client-id: {client}\r\n")?;
        }
        if let Some(key) = &self.headers.key {
            write!(r, "authorization: Bearer {key}\r\n")?;
        }
        write!(
            r,
            "content-length: {}\r\n\r\n{}",
            self.json.len(),
            self.json
        )?;
        self.stream.get_mut().write_all(&self.request).await?;
        self.line.clear();
        self.stream.read_line(&mut self.line).await?;
        let status: u16 = self
            .line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {:?}", self.line))?;
        let mut length = 0_usize;
        loop {
            self.line.clear();
            if self.stream.read_line(&mut self.line).await? == 0 {
                bail!("connection closed");
            }
            let l = self.line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse()?;
                }
            }
        }
        self.body.resize(length, 0);
        self.stream.read_exact(&mut self.body).await?;
        Ok(status)
    }

    /// The body of the last response.
    pub fn body(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }
}

/// Which pages a load writes, and with which token.
#[derive(Debug, Clone)]
pub enum Pages {
    /// Random pages of `1..=n`, all with `token` (equal tokens are accepted).
    Random { n: u64, token: u64 },
    /// Random pages of `1..=tokens.len()`, page `i + 1` with `tokens[i]`
    /// (the token of a lock the bench holds).
    Held(Arc<Vec<u64>>),
    /// Pages `1..=n` once each, spread over the connections (seeding).
    Each { n: u64, token: u64 },
}

/// A load: `clients` connections spread round-robin over `targets`, each
/// PUTting back to back.
#[derive(Debug, Clone)]
pub struct Load {
    pub targets: Vec<SocketAddr>,
    pub clients: usize,
    pub pages: Pages,
    pub headers: Headers,
    /// The JSON body of every PUT.
    pub json: Arc<str>,
    /// The answers besides 2xx that are counted instead of failing the run.
    pub counted: Counted,
}

/// Which answers besides 2xx a load counts instead of failing on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// None: any other answer fails the run.
    Nothing,
    /// 503 `issuer_unavailable` (the gateway failed closed).
    IssuerUnavailable,
    /// Every refusal (503, 429) and every broken connection, which is made
    /// anew: a load that shares the gateway with an attack.
    Refusals,
}

/// What a load did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The PUTs answered 2xx, with their latencies.
    pub run: Run,
    /// The answers 503 `issuer_unavailable`, when counted.
    pub unavailable: u64,
    /// The answers 503 and 429, when every refusal is counted.
    pub refused: u64,
    /// The connections that broke (closed, reset, no status line), when
    /// every refusal is counted.
    pub broken: u64,
}

impl Load {
    /// The body `{"body": "xxx..."}` of `len` characters.
    pub fn json_of_len(len: usize) -> Arc<str> {
        serde_json::json!({ "body": "x".repeat(len) })
            .to_string()
            .into()
    }

    /// Run for `secs` ([`Pages::Each`]: until every page was written once).
    /// Any answer but 2xx (and those [`Counted`]) fails the run.
    pub async fn run(&self, secs: Duration) -> anyhow::Result<Outcome> {
        let start = Instant::now();
        let deadline = start + secs;
        let mut tasks = Vec::with_capacity(self.clients);
        for c in 0..self.clients {
            let addr = self.targets[c % self.targets.len()];
            let load = self.clone();
            tasks.push(tokio::spawn(async move {
                let mut conn =
                    PutConn::connect(addr, load.headers.clone(), load.json.clone()).await?;
                let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ (c as u64 + 1));
                let mut next = c as u64;
                let mut out = Outcome::default();
                loop {
                    let (id, token) = match &load.pages {
                        Pages::Each { n, token } => {
                            if next >= *n {
                                break;
                            }
                            next += load.clients as u64;
                            (next - load.clients as u64 + 1, *token)
                        }
                        _ if Instant::now() >= deadline => break,
                        Pages::Random { n, token } => (rng.next() % n + 1, *token),
                        Pages::Held(tokens) => {
                            let i = rng.next() % tokens.len() as u64;
                            (i + 1, tokens[i as usize])
                        }
                    };
                    let t0 = Instant::now();
                    let status = match conn.put(id, token).await {
                        Ok(status) => status,
                        Err(_) if load.counted == Counted::Refusals => {
                            out.broken += 1;
                            conn = PutConn::connect(addr, load.headers.clone(), load.json.clone())
                                .await?;
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    if (200..300).contains(&status) {
                        out.run.latencies.push(t0.elapsed());
                    } else if load.counted == Counted::IssuerUnavailable
                        && status == 503
                        && conn.body().contains("issuer_unavailable")
                    {
                        out.unavailable += 1;
                    } else if load.counted == Counted::Refusals && matches!(status, 429 | 503) {
                        out.refused += 1;
                    } else {
                        bail!("PUT /pages/{id} answered {status}: {}", conn.body());
                    }
                }
                anyhow::Ok(out)
            }));
        }
        let mut total = Outcome::default();
        for t in tasks {
            let out = t.await??;
            total.run.latencies.extend(out.run.latencies);
            total.unavailable += out.unavailable;
            total.refused += out.refused;
            total.broken += out.broken;
        }
        total.run.ops = total.run.latencies.len() as u64;
        total.run.elapsed = start.elapsed();
        Ok(total)
    }
}

/// The pages' random order: cheap, and the same for every run of a client.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
