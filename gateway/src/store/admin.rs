//! An admin's fence change: the page's fence set (or cleared) and its audit
//! row, in one statement.

use tokio_postgres::types::Type;

use crate::db::{get, Db, DbError, Sql};

use super::row::{fence_of, Fence};

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
               insert into page_history (page_id, method, outcome, token, issuer, client_id, version, fence_token, reason, force)
               select id, 'ADMIN', 'fence_set', $3, $2, $4, version, fence_token, $5, $6 from changed
           )
           select version, fence_issuer, fence_token, old_issuer, old_token from changed",
    types: &[
        Type::TEXT,
        Type::TEXT,
        Type::INT8,
        Type::TEXT,
        Type::TEXT,
        Type::BOOL,
    ],
};

/// Set a page's fence to `fence` (`None` clears it), with the audit row
/// (which records `force`), in ONE statement: the page's row is locked by
/// the update (the subquery's `for update` reads the fence being replaced
/// under that same lock), and the history row is inserted by the same
/// statement, so the change and its record commit together and in order
/// with the page's other attempts. `None` when the page has no row (never
/// written nor fenced).
pub async fn set_fence(
    db: &Db,
    id: &str,
    fence: Option<&Fence>,
    admin: &str,
    reason: &str,
    force: bool,
) -> Result<Option<FenceSet>, DbError> {
    let mut conn = db.acquire().await?;
    let issuer = fence.map(|f| f.issuer.as_str());
    let token = fence.map(|f| f.token.to_i64());
    let Some(row) = conn
        .query_opt(&SET_FENCE, &[&id, &issuer, &token, &admin, &reason, &force])
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
