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
    let fence = fence_of(issuer, token);
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
    /// Why an admin set the fence (`fence_set` rows only; left out elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The newest `limit` attempts on a page, newest first.
pub async fn history(db: &Db, id: &str, limit: i64) -> Result<Vec<HistoryEntry>, sqlx::Error> {
    let mut conn = db.acquire().await?;
    let result = sqlx::query_as(
        "select id as seq, at, method, outcome, token, issuer, client_id, version, fence_token, reason
         from page_history where page_id = $1 order by id desc limit $2",
    )
    .bind(id)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await;
    conn.finish(result)
}

/// Record an attempt refused before the fenced statement (the issuer said
/// the token is not current): one history row with the page's version and
/// fence as they are, and nothing else. The page's row is not created, locked
/// or changed. Returns the page's fence.
pub async fn record_refusal(
    db: &Db,
    id: &str,
    method: &str,
    outcome: &str,
    token: Token,
    issuer: &str,
    client_id: Option<&str>,
) -> Result<Option<Fence>, sqlx::Error> {
    let mut conn = db.acquire().await?;
    let result = sqlx::query_as(
        "with page as (
             select p.version, p.fence_issuer, p.fence_token
             from (select $1::text as id) w left join pages p on p.id = w.id
         ),
         logged as (
             insert into page_history (page_id, method, outcome, token, issuer, client_id, version, fence_token)
             select $1, $2, $3, $4, $5, $6, coalesce(version, 0), fence_token from page
         )
         select fence_issuer, fence_token from page",
    )
    .bind(id)
    .bind(method)
    .bind(outcome)
    .bind(token.to_i64())
    .bind(issuer)
    .bind(client_id)
    .fetch_one(&mut *conn)
    .await;
    let (issuer, token): (Option<String>, Option<i64>) = conn.finish(result)?;
    Ok(fence_of(issuer, token))
}

fn fence_of(issuer: Option<String>, token: Option<i64>) -> Option<Fence> {
    match (issuer, token.and_then(|t| Token::try_from(t).ok())) {
        (Some(issuer), Some(token)) => Some(Fence { issuer, token }),
        _ => None,
    }
}

/// What an admin's fence change did.
#[derive(Debug, Clone)]
pub struct FenceSet {
    pub version: i64,
    pub fence: Option<Fence>,
    pub previous: Option<Fence>,
}

/// Set a page's fence to `fence` (`None` clears it), with the audit row, in
/// ONE statement: the page's row is locked by the update (the subquery's
/// `for update` reads the fence being replaced under that same lock), and
/// the history row is inserted by the same statement, so the change and its
/// record commit together and in order with the page's other attempts.
/// `None` when the page has no row (never written nor fenced).
pub async fn set_fence(
    db: &Db,
    id: &str,
    fence: Option<&Fence>,
    admin: &str,
    reason: &str,
) -> Result<Option<FenceSet>, sqlx::Error> {
    let mut conn = db.acquire().await?;
    let result = sqlx::query_as(
        "with changed as (
             update pages p
             set fence_issuer = $2, fence_token = $3, last_outcome = 'fence_set', updated_at = now()
             from (select id, fence_issuer, fence_token from pages where id = $1 for update) old
             where p.id = old.id
             returning p.id, p.version, p.fence_issuer, p.fence_token,
                       old.fence_issuer as old_issuer, old.fence_token as old_token
         ),
         logged as (
             insert into page_history (page_id, method, outcome, token, issuer, client_id, version, fence_token, reason)
             select id, 'ADMIN', 'fence_set', $3, $2, $4, version, fence_token, $5 from changed
         )
         select version, fence_issuer, fence_token, old_issuer, old_token from changed",
    )
    .bind(id)
    .bind(fence.map(|f| f.issuer.as_str()))
    .bind(fence.map(|f| f.token.to_i64()))
    .bind(admin)
    .bind(reason)
    .fetch_optional(&mut *conn)
    .await;
    type SetRow = (
        i64,
        Option<String>,
        Option<i64>,
        Option<String>,
        Option<i64>,
    );
    let row: Option<SetRow> = conn.finish(result)?;
    Ok(
        row.map(|(version, issuer, token, old_issuer, old_token)| FenceSet {
            version,
            fence: fence_of(issuer, token),
            previous: fence_of(old_issuer, old_token),
        }),
    )
}

/// Is the database reachable?
pub async fn ping(db: &Db) -> Result<(), sqlx::Error> {
    let mut conn = db.acquire().await?;
    let result = sqlx::query("select 1").execute(&mut *conn).await;
    conn.finish(result).map(|_| ())
}
