//! The database side: every query the gateway runs, on the request pool
//! ([`Db`]). A write or a fenced read is up to three statements, each atomic
//! on its own, of which the common case runs one ([`fenced_access`], in
//! `store/access.rs`); an admin's fence change is one (`store/admin.rs`).
//! The SQL files in `sql/` carry the safety argument in their header
//! comments.

mod access;
mod admin;
mod row;

use chrono::{DateTime, Utc};
use fencelock::Token;
use serde::Serialize;
use tokio_postgres::types::Type;

use crate::db::{get, Db, DbError, Sql};

pub use access::{
    fenced_access, Access, Verdict, FENCED_ACCESS, FENCED_ACCESS_INSERT, FENCED_ACCESS_LOCKED,
    UNFENCED_ACCESS, UNFENCED_ACCESS_INSERT,
};
pub use admin::{set_fence, FenceSet};
pub use row::{Fence, Page, Row};

use row::{fence_of, page_row};

static READ: Sql = Sql {
    text: "select id, body, version, fence_issuer, fence_token from pages where id = $1",
    types: &[Type::TEXT],
};

/// An unfenced read: no lock, no history.
pub async fn read(db: &Db, id: &str) -> Result<Option<Page>, DbError> {
    let mut conn = db.acquire().await?;
    match conn.query_opt(&READ, &[&id]).await? {
        Some(r) => Ok(page_row(&r)?.page()),
        None => Ok(None),
    }
}

static FENCE: Sql = Sql {
    text: "select fence_issuer, fence_token from pages where id = $1",
    types: &[Type::TEXT],
};

/// A page's fence as it is now (`None`: no page, or not fenced yet), read
/// without a lock: it only grows between this read and a fenced statement
/// (but for an admin's change).
pub async fn fence(db: &Db, id: &str) -> Result<Option<Fence>, DbError> {
    let mut conn = db.acquire().await?;
    match conn.query_opt(&FENCE, &[&id]).await? {
        Some(r) => Ok(fence_of(get(&r, 0)?, get(&r, 1)?)),
        None => Ok(None),
    }
}

static LIST: Sql = Sql {
    text: "select id, null::text, version, fence_issuer, fence_token
           from pages where body is not null and id > $1 order by id limit $2",
    types: &[Type::TEXT, Type::INT8],
};

/// The first `limit` written pages with an id after `after`, by id (bodies
/// left out; on the primary key).
pub async fn list(db: &Db, after: &str, limit: i64) -> Result<Vec<Row>, DbError> {
    let mut conn = db.acquire().await?;
    conn.query(&LIST, &[&after, &limit])
        .await?
        .iter()
        .map(page_row)
        .collect()
}

/// One attempt on a page, as `GET /pages/{id}/history` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HistoryEntry {
    /// Increases in commit order within a page.
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// `GET` (a fenced read), `PUT`, or `ADMIN` (a fence set by an admin).
    #[schema(pattern = "^(GET|PUT|ADMIN)$")]
    pub method: String,
    /// `accepted`; `stale` (accepted with fencing off although older than the
    /// fence); the refusals `stale_token`, `issuer_mismatch`,
    /// `no_issuer_for_page`, `version_mismatch`, `token_not_current`,
    /// `suspected_forgery`;
    /// `fence_set` (an admin's change).
    #[schema(
        pattern = "^(accepted|stale|stale_token|issuer_mismatch|no_issuer_for_page|version_mismatch|token_not_current|suspected_forgery|fence_set)$"
    )]
    pub outcome: String,
    #[schema(required = true, minimum = 0)]
    pub token: Option<i64>,
    #[schema(required = true)]
    pub issuer: Option<String>,
    /// The key's client (`admin:<name>` for an admin).
    #[schema(required = true)]
    pub client_id: Option<String>,
    /// The page's version after the attempt.
    #[schema(minimum = 0)]
    pub version: i64,
    /// The page's fence token after the attempt.
    #[schema(required = true, minimum = 0)]
    pub fence_token: Option<i64>,
    /// Why an admin set the fence (`fence_set` rows only; left out elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub reason: Option<String>,
    /// Whether the admin forced a fence above what its issuer had minted
    /// (`fence_set` rows only; left out elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub force: Option<bool>,
}

static HISTORY: Sql = Sql {
    text: "select id, at, method, outcome, token, issuer, client_id, version, fence_token, reason, force
           from page_history where page_id = $1 and id < $3 order by id desc limit $2",
    types: &[Type::TEXT, Type::INT8, Type::INT8],
};

/// The newest `limit` attempts on a page with a `seq` below `before`,
/// newest first (on the index by page and id).
pub async fn history(
    db: &Db,
    id: &str,
    limit: i64,
    before: i64,
) -> Result<Vec<HistoryEntry>, DbError> {
    let mut conn = db.acquire().await?;
    conn.query(&HISTORY, &[&id, &limit, &before])
        .await?
        .iter()
        .map(|r| {
            Ok(HistoryEntry {
                seq: get(r, 0)?,
                at: get(r, 1)?,
                method: get(r, 2)?,
                outcome: get(r, 3)?,
                token: get(r, 4)?,
                issuer: get(r, 5)?,
                client_id: get(r, 6)?,
                version: get(r, 7)?,
                fence_token: get(r, 8)?,
                reason: get(r, 9)?,
                force: get(r, 10)?,
            })
        })
        .collect()
}

static REFUSAL: Sql = Sql {
    text: "with page as (
               select p.version, p.fence_issuer, p.fence_token
               from (select $1::text as id) w left join pages p on p.id = w.id
           ),
           logged as (
               insert into page_history (page_id, method, outcome, token, issuer, client_id, version, fence_token)
               select $1, $2, $3, $4, $5, $6, coalesce(version, 0), fence_token from page
           )
           select fence_issuer, fence_token from page",
    types: &[
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::INT8,
        Type::TEXT,
        Type::TEXT,
    ],
};

/// Record an attempt refused before the fenced statement (the issuer said
/// the token is not current, or it is a suspected forgery): one history row with the page's version and
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
) -> Result<Option<Fence>, DbError> {
    let mut conn = db.acquire().await?;
    let row = conn
        .query_opt(
            &REFUSAL,
            &[&id, &method, &outcome, &token.to_i64(), &issuer, &client_id],
        )
        .await?
        .ok_or_else(|| DbError::Failed("the refusal's statement returned no row".into()))?;
    Ok(fence_of(get(&row, 0)?, get(&row, 1)?))
}

/// Is the database reachable? One round trip on a pooled connection.
pub async fn ping(db: &Db) -> Result<(), DbError> {
    db.acquire().await?.ping().await
}
