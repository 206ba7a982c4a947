//! A write or a fenced read: up to three statements, each atomic on its
//! own, of which the common case runs one. Fencing enforced runs the fenced
//! statements, which move the fence; fencing off runs the unfenced ones,
//! which never name the fence in what they write (so the database can
//! refuse the unfenced gateway's role any privilege on it).

use fencelock::Token;
use tokio_postgres::types::{ToSql, Type};

use crate::db::{get, Db, DbError, Sql};

use super::row::{page_row, Row};

/// Parameter types of the access statements: $1 page id, $2 method, $3
/// body, $4 token, $5 the token's issuer, $6 If-Match, $7 the page's issuer
/// by the operator's rule, $8 client id.
const ACCESS_TYPES: &[Type] = &[
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
];

/// The common case of every fenced GET and PUT with fencing enforced: a
/// page that exists and has its issuer, an access that is accepted. Fence
/// check, write and history row in one plain fenced UPDATE, one round trip;
/// it writes nothing and returns no row when the access is refused or the
/// page has no row or no issuer. The benchmark runs this exact text through
/// pgbench.
pub const FENCED_ACCESS: &str = include_str!("../sql/fenced_access.sql");
/// After [`FENCED_ACCESS`] wrote nothing: the verdict under the row lock
/// (the page's issuer chosen by the operator's rule if its row has none); a
/// refusal is recorded without rewriting the row. No row: no page.
pub const FENCED_ACCESS_LOCKED: &str = include_str!("../sql/fenced_access_locked.sql");
/// After [`FENCED_ACCESS_LOCKED`] found no page: its first access creates it.
/// No row: another first access won the race (run the locked one again).
pub const FENCED_ACCESS_INSERT: &str = include_str!("../sql/fenced_access_insert.sql");
/// Fencing off: the access under the row lock, never writing the fence.
/// No row: no page.
pub const UNFENCED_ACCESS: &str = include_str!("../sql/unfenced_access.sql");
/// Fencing off, after [`UNFENCED_ACCESS`] found no page: create it without
/// a fence. No row: another first access won the race.
pub const UNFENCED_ACCESS_INSERT: &str = include_str!("../sql/unfenced_access_insert.sql");

macro_rules! access_sql {
    ($($name:ident = $text:ident;)*) => {
        $(static $name: Sql = Sql { text: $text, types: ACCESS_TYPES };)*
    };
}
access_sql! {
    UPDATE = FENCED_ACCESS;
    LOCKED = FENCED_ACCESS_LOCKED;
    INSERT = FENCED_ACCESS_INSERT;
    UNFENCED_LOCKED = UNFENCED_ACCESS;
    UNFENCED_INSERT = UNFENCED_ACCESS_INSERT;
}

/// What the client asked for, validated. Owned, so that the statement can
/// run in a task of its own (see [`crate::http`]: a request whose deadline
/// passes does not cancel a statement already sent).
#[derive(Debug, Clone)]
pub struct Access {
    pub id: String,
    /// `Some(body)` for a PUT, `None` for a fenced GET.
    pub write: Option<String>,
    /// Always set when `enforce` (a fenced access without one is refused
    /// before it gets here); with fencing off, a PUT may have none.
    pub token: Option<Token>,
    pub issuer: String,
    pub if_match: Option<i64>,
    /// Fencing enforced: the fenced statements. Off: the unfenced ones.
    pub enforce: bool,
    /// The page's issuer by the operator's rule (see
    /// [`crate::page_issuers`]), for a page whose row carries none; `None`:
    /// no rule names one. Not used with fencing off.
    pub page_issuer: Option<String>,
    pub client_id: Option<String>,
}

impl Access {
    pub fn method(&self) -> &'static str {
        if self.write.is_some() {
            "PUT"
        } else {
            "GET"
        }
    }
}

/// The database's verdict on one access, decided under the page's row lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// Accepted because fencing is off, though the token was older than the fence.
    Stale,
    StaleToken,
    IssuerMismatch,
    /// Fencing enforced, and neither the page's row nor the operator's rule
    /// names its issuer.
    NoIssuerForPage,
    VersionMismatch,
}

impl Verdict {
    const ALL: [Verdict; 6] = [
        Self::Accepted,
        Self::Stale,
        Self::StaleToken,
        Self::IssuerMismatch,
        Self::NoIssuerForPage,
        Self::VersionMismatch,
    ];

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Stale => "stale",
            Self::StaleToken => "stale_token",
            Self::IssuerMismatch => "issuer_mismatch",
            Self::NoIssuerForPage => "no_issuer_for_page",
            Self::VersionMismatch => "version_mismatch",
        }
    }
}

/// The access: with fencing enforced [`FENCED_ACCESS`]; if it wrote nothing,
/// [`FENCED_ACCESS_LOCKED`]; if the page has no row, [`FENCED_ACCESS_INSERT`]
/// (and if another first access won that race, the locked one again, which
/// then finds the row). Fencing off: [`UNFENCED_ACCESS`], then
/// [`UNFENCED_ACCESS_INSERT`] and the locked one again likewise. Each
/// statement is atomic and one that returns no row wrote nothing, so the
/// first that returns a row made the request's one decision. Returns the
/// verdict and the row as it is afterwards (unchanged unless accepted or
/// stale).
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
    let method = a.method();
    let token = a.token.map(Token::to_i64);
    if a.enforce && token.is_none() {
        return Err(DbError::Failed(format!(
            "page {:?}: a fenced access with fencing enforced needs a token",
            a.id
        )));
    }
    let params: [&(dyn ToSql + Sync); 8] = [
        &a.id,
        &method,
        &a.write,
        &token,
        &a.issuer,
        &a.if_match,
        &a.page_issuer,
        &a.client_id,
    ];
    // Fenced: the common case first; then at most locked, insert, locked.
    // Unfenced: locked, insert, locked.
    let statements: &[&Sql] = if a.enforce {
        &[&UPDATE, &LOCKED, &INSERT, &LOCKED]
    } else {
        &[&UNFENCED_LOCKED, &UNFENCED_INSERT, &UNFENCED_LOCKED]
    };
    if !may_send() {
        return Err(DbError::NotSent);
    }
    let mut row = None;
    for sql in statements {
        row = conn.query_opt(sql, &params).await?;
        if row.is_some() {
            break;
        }
    }
    let row = row.ok_or_else(|| {
        DbError::Failed(format!(
            "page {:?}: no access statement decided (created concurrently, then not found)",
            a.id
        ))
    })?;
    let outcome: String = get(&row, 5)?;
    let verdict = Verdict::parse(&outcome)
        .ok_or_else(|| DbError::Failed(format!("unknown outcome {outcome:?}")))?;
    Ok((verdict, page_row(&row)?))
}
