//! The database side: every query the gateway runs, on the request pool
//! ([`Db`]). The fenced access is up to three statements, each atomic on its
//! own, of which the common case runs one ([`fenced_access`]); the SQL files
//! in `sql/` carry the safety argument in their header comments.

use chrono::{DateTime, Utc};
use fencelock::Token;
use serde::Serialize;
use tokio_postgres::types::{ToSql, Type};

use crate::db::{get, Db, DbError, Sql};

/// Parameter types of the three fenced statements: $1 page id, $2 method,
/// $3 body, $4 token, $5 issuer, $6 If-Match, $7 enforce, $8 client id.
const ACCESS_TYPES: &[Type] = &[
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::INT8,
    Type::BOOL,
    Type::TEXT,
];

/// The common case of every fenced GET and PUT: a page that exists, an
/// access that is accepted. Fence check, write and history row in one plain
/// fenced UPDATE, one round trip; it writes nothing and returns no row when
/// the access is refused or the page has no row. The benchmark runs this
/// exact text through pgbench.
pub const FENCED_ACCESS: &str = include_str!("sql/fenced_access.sql");
/// After [`FENCED_ACCESS`] wrote nothing: the verdict under the row lock; a
/// refusal is recorded without rewriting the row. No row: no page.
pub const FENCED_ACCESS_LOCKED: &str = include_str!("sql/fenced_access_locked.sql");
/// After [`FENCED_ACCESS_LOCKED`] found no page: its first access creates it.
/// No row: another first access won the race (run the locked one again).
pub const FENCED_ACCESS_INSERT: &str = include_str!("sql/fenced_access_insert.sql");

static UPDATE: Sql = Sql {
    text: FENCED_ACCESS,
    types: ACCESS_TYPES,
};
static LOCKED: Sql = Sql {
    text: FENCED_ACCESS_LOCKED,
    types: ACCESS_TYPES,
};
static INSERT: Sql = Sql {
    text: FENCED_ACCESS_INSERT,
    types: ACCESS_TYPES,
};

/// The highest token a page has seen, and which lock service issued it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Fence {
    /// The lock service's name, as the gateway knows it (`Fencing-Issuer`).
    #[schema(pattern = "^[a-z0-9._:-]{1,64}$")]
    pub issuer: String,
    #[schema(value_type = i64, minimum = 0)]
    pub token: Token,
}

/// A page as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Page {
    #[schema(pattern = "^[A-Za-z0-9_-]{1,128}$")]
    pub id: String,
    pub body: String,
    /// 1 after the first write, one more after each; the `ETag`.
    #[schema(minimum = 1)]
    pub version: i64,
    /// `null` until a fenced access.
    #[schema(required = true)]
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

/// `id, body, version, fence_issuer, fence_token` from columns `0..5`.
fn page_row(r: &tokio_postgres::Row) -> Result<Row, DbError> {
    Ok(Row {
        id: get(r, 0)?,
        body: get(r, 1)?,
        version: get(r, 2)?,
        fence: fence_of(get(r, 3)?, get(r, 4)?),
    })
}

/// What the client asked for, validated. Owned, so that the statement can
/// run in a task of its own (see [`crate::http`]: a request whose deadline
/// passes does not cancel a statement already sent).
#[derive(Debug, Clone)]
pub struct Access {
    pub id: String,
    /// `Some(body)` for a PUT, `None` for a fenced GET.
    pub write: Option<String>,
    pub token: Option<Token>,
    pub issuer: String,
    pub if_match: Option<i64>,
    pub enforce: bool,
    pub client_id: Option<String>,
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

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Stale => "stale",
            Self::StaleToken => "stale_token",
            Self::IssuerMismatch => "issuer_mismatch",
            Self::VersionMismatch => "version_mismatch",
        }
    }
}

/// The fenced access: [`FENCED_ACCESS`]; if it wrote nothing,
/// [`FENCED_ACCESS_LOCKED`]; if the page has no row, [`FENCED_ACCESS_INSERT`]
/// (and if another first access won that race, the locked one again, which
/// then finds the row). Each statement is atomic and one that returns no row
/// wrote nothing, so the first that returns a row made the request's one
/// decision. Returns the verdict and the row as it is afterwards (unchanged
/// unless accepted or stale).
///
/// `may_send` is called once, just before the first statement is sent: from
/// then on the request may have written something. If it says `false`,
/// nothing is sent and [`DbError::NotSent`] returned.
pub async fn fenced_access(
    db: &Db,
    a: &Access,
    may_send: impl FnOnce() -> bool,
) -> Result<(Verdict, Row), DbError> {
    let mut conn = db.acquire().await?;
    let method = if a.write.is_some() { "PUT" } else { "GET" };
    let token = a.token.map(Token::to_i64);
    let params: [&(dyn ToSql + Sync); 8] = [
        &a.id,
        &method,
        &a.write,
        &token,
        &a.issuer,
        &a.if_match,
        &a.enforce,
        &a.client_id,
    ];
    if !may_send() {
        return Err(DbError::NotSent);
    }
    // The common case first; then at most: locked, insert, locked.
    let mut row = conn.query_opt(&UPDATE, &params).await?;
    for sql in [&LOCKED, &INSERT, &LOCKED] {
        if row.is_some() {
            break;
        }
        row = conn.query_opt(sql, &params).await?;
    }
    let row = row.ok_or_else(|| {
        DbError::Failed(format!(
            "page {:?}: no fenced statement decided (created concurrently, then not found)",
            a.id
        ))
    })?;
    let outcome: String = get(&row, 5)?;
    let verdict = Verdict::parse(&outcome)
        .ok_or_else(|| DbError::Failed(format!("unknown outcome {outcome:?}")))?;
    Ok((verdict, page_row(&row)?))
}

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

static LIST: Sql = Sql {
    text: "select id, null::text, version, fence_issuer, fence_token
           from pages where body is not null order by id",
    types: &[],
};

/// Every written page, by id (bodies left out).
pub async fn list(db: &Db) -> Result<Vec<Row>, DbError> {
    let mut conn = db.acquire().await?;
    conn.query(&LIST, &[]).await?.iter().map(page_row).collect()
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
    /// `version_mismatch`, `token_not_current`; `fence_set` (an admin's change).
    #[schema(
        pattern = "^(accepted|stale|stale_token|issuer_mismatch|version_mismatch|token_not_current|fence_set)$"
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
}

static HISTORY: Sql = Sql {
    text: "select id, at, method, outcome, token, issuer, client_id, version, fence_token, reason
           from page_history where page_id = $1 order by id desc limit $2",
    types: &[Type::TEXT, Type::INT8],
};

/// The newest `limit` attempts on a page, newest first.
pub async fn history(db: &Db, id: &str, limit: i64) -> Result<Vec<HistoryEntry>, DbError> {
    let mut conn = db.acquire().await?;
    conn.query(&HISTORY, &[&id, &limit])
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

fn fence_of(issuer: Option<String>, token: Option<i64>) -> Option<Fence> {
    // The column is a bigint the gateway only ever sets from a `Token`.
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

static SET_FENCE: Sql = Sql {
    text: "with changed as (
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
    types: &[Type::TEXT, Type::TEXT, Type::INT8, Type::TEXT, Type::TEXT],
};

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
) -> Result<Option<FenceSet>, DbError> {
    let mut conn = db.acquire().await?;
    let issuer = fence.map(|f| f.issuer.as_str());
    let token = fence.map(|f| f.token.to_i64());
    let Some(row) = conn
        .query_opt(&SET_FENCE, &[&id, &issuer, &token, &admin, &reason])
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(FenceSet {
        version: get(&row, 0)?,
        fence: fence_of(get(&row, 1)?, get(&row, 2)?),
        previous: fence_of(get(&row, 3)?, get(&row, 4)?),
    }))
}

/// Is the database reachable? One round trip on a pooled connection.
pub async fn ping(db: &Db) -> Result<(), DbError> {
    db.acquire().await?.ping().await
}
