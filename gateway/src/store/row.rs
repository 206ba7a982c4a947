//! A page's row as the statements return it, and as the API shows it.

use fencelock::Token;
use serde::Serialize;

use crate::db::{get, DbError};

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
    /// `null` until a fenced access with fencing enforced (or an admin)
    /// fences the page. A gateway with fencing off shows it as it is, and
    /// never moves it.
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
pub(super) fn page_row(r: &tokio_postgres::Row) -> Result<Row, DbError> {
    Ok(Row {
        id: get(r, 0)?,
        body: get(r, 1)?,
        version: get(r, 2)?,
        fence: fence_of(get(r, 3)?, get(r, 4)?),
    })
}

/// The fence of a row's two columns: both set, or none.
pub(super) fn fence_of(issuer: Option<String>, token: Option<i64>) -> Option<Fence> {
    // The column is a bigint the gateway only ever sets from a `Token`.
    match (issuer, token.and_then(|t| Token::try_from(t).ok())) {
        (Some(issuer), Some(token)) => Some(Fence { issuer, token }),
        _ => None,
    }
}
