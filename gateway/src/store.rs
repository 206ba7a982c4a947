//! The database side: every query the gateway runs. The one that carries the
//! safety argument is [`FENCED_ACCESS`] (read its header comment).

use chrono::{DateTime, Utc};
use fencelock::Token;
use serde::Serialize;

use crate::db::Db;

/// The statement behind every fenced GET and every PUT: fence check, write and
/// history row, atomically, in one round trip. The benchmark runs this exact
/// text through pgbench.
pub const FENCED_ACCESS: &str = include_str!("sql/fenced_access.sql");

/// The highest token a page has seen, and which lock service issued it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fence {
    pub issuer: String,
    pub token: Token,
}

/// A page as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Page {
    pub id: String,
    pub body: String,
    pub version: i64,
    pub fence: Option<Fence>,
}

/// A page's row: `body` is `None` for a page only fenced, never written.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: String,
    pub body: Option<String>,
    pub version: i64,
    pub fence: Option<Fence>,
}

impl Row {
    /// The page, if it has ever been written.
    pub fn page(self) -> Option<Page> {
        Some(Page {
            body: self.body?,
            id: self.id,
            version: self.version,
            fence: self.fence,
        })
    }
}

type RawRow = (String, Option<String>, i64, Option<String>, Option<i64>);
type AccessRow = (
    String,
    Option<String>,
    i64,
    Option<String>,
    Option<i64>,
    String,
);

fn row((id, body, version, issuer, token): RawRow) -> Row {
    // The column is a bigint the gateway only ever sets from a `Token`.
    let fence = match (issuer, token.and_then(|t| Token::try_from(t).ok())) {
        (Some(issuer), Some(token)) => Some(Fence { issuer, token }),
        _ => None,
    };
    Row {
        id,
        body,
        version,
        fence,
    }
}

/// What the client asked for, validated.
#[derive(Debug, Clone)]
pub struct Access<'a> {
    pub id: &'a str,
    /// `Some(body)` for a PUT, `None` for a fenced GET.
    pub write: Option<&'a str>,
    pub token: Option<Token>,
    pub issuer: &'a str,
    pub if_match: Option<i64>,
    pub enforce: bool,
    pub client_id: Option<&'a str>,
}

/// The database's verdict on one access, decided under the page's row lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// Accepted because fencing is off, though the token was older than the fence.
    Stale,
    StaleToken,
    IssuerMismatch,
    VersionMismatch,
}

impl Verdict {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "accepted" => Self::Accepted,
            "stale" => Self::Stale,
            "stale_token" => Self::StaleToken,
            "issuer_mismatch" => Self::IssuerMismatch,
            "version_mismatch" => Self::VersionMismatch,
            _ => return None,
        })
    }
}

/// Run [`FENCED_ACCESS`]: returns the verdict and the row as it is afterwards
/// (unchanged unless accepted or stale).
pub async fn fenced_access(db: &Db, a: &Access<'_>) -> Result<(Verdict, Row), sqlx::Error> {
    let mut conn = db.acquire().await?;
    let result = sqlx::query_as(FENCED_ACCESS)
        .bind(a.id)
        .bind(if a.write.is_some() { "PUT" } else { "GET" })
        .bind(a.write)
        .bind(a.token.map(Token::to_i64))
        .bind(a.issuer)
        .bind(a.if_match)
        .bind(a.enforce)
        .bind(a.client_id)
        .fetch_one(&mut *conn)
        .await;
    let (id, body, version, issuer, token, outcome): AccessRow = conn.finish(result)?;
    let verdict = Verdict::parse(&outcome)
        .ok_or_else(|| sqlx::Error::Protocol(format!("unknown outcome {outcome:?}")))?;
    Ok((verdict, row((id, body, version, issuer, token))))
}

/// An unfenced read: no lock, no history.
pub async fn read(db: &Db, id: &str) -> Result<Option<Page>, sqlx::Error> {
    let mut conn = db.acquire().await?;
    let result = sqlx::query_as(
        "select id, body, version, fence_issuer, fence_token from pages where id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await;
    let raw: Option<RawRow> = conn.finish(result)?;
    Ok(raw.map(row).and_then(Row::page))
}

/// Every written page, by id (bodies left out).
pub async fn list(db: &Db) -> Result<Vec<Row>, sqlx::Error> {
    let mut conn = db.acquire().await?;
    let result = sqlx::query_as(
        "select id, null::text, version, fence_issuer, fence_token
         from pages where body is not null order by id",
    )
    .fetch_all(&mut *conn)
    .await;
    let raws: Vec<RawRow> = conn.finish(result)?;
    Ok(raws.into_iter().map(row).collect())
}

/// One attempt on a page, as `GET /pages/{id}/history` shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct HistoryEntry {
    /// Increases in commit order within a page.
    pub seq: i64,
    pub at: DateTime<Utc>,
    pub method: String,
    pub outcome: String,
    pub token: Option<i64>,
    pub issuer: Option<String>,
    pub client_id: Option<String>,
    /// The page's version after the attempt.
    pub version: i64,
    /// The page's fence token after the attempt.
    pub fence_token: Option<i64>,
}

/// The newest `limit` attempts on a page, newest first.
pub async fn history(db: &Db, id: &str, limit: i64) -> Result<Vec<HistoryEntry>, sqlx::Error> {
    let mut conn = db.acquire().await?;
    let result = sqlx::query_as(
        "select id as seq, at, method, outcome, token, issuer, client_id, version, fence_token
         from page_history where page_id = $1 order by id desc limit $2",
    )
    .bind(id)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await;
    conn.finish(result)
}

/// Is the database reachable?
pub async fn ping(db: &Db) -> Result<(), sqlx::Error> {
    let mut conn = db.acquire().await?;
    let result = sqlx::query("select 1").execute(&mut *conn).await;
    conn.finish(result).map(|_| ())
}
