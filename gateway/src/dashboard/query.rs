//! What the dashboard reads: the count of every page's attempts when the
//! gateway's tail starts, the tail's polls, and at each stream's start the
//! chosen page's newest attempts and row; each a short indexed query on the
//! public reads' pool ([`crate::AppState::reads`]) but the count. And the messages they make.

use std::time::Instant;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::Type;
use utoipa::ToSchema;

use crate::db::{self, Db, DbError, Sql};
use crate::store::Fence;
use crate::FenceCheck;

use super::tail::{Attempt, PageCounters, Tail, GAP_WINDOW};

/// Most attempts read per poll; a full batch is followed by another poll at once.
pub const TAIL_BATCH: i64 = 2000;
/// Attempts of the chosen page sent in a snapshot (the newest).
pub const SNAPSHOT_ATTEMPTS: i64 = 2000;

/// The chosen page's row as it is now.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PageNow {
    pub id: String,
    pub version: i64,
    #[schema(required = true)]
    pub fence: Option<Fence>,
    /// The body, `null` until the first accepted write. Left out of an update
    /// when the version is the one sent before: the demo's page grows with
    /// every edit, and reads and refusals do not change it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub body: Option<Option<String>>,
}

/// The first message of a stream.
#[derive(Debug, Serialize, ToSchema)]
pub struct Snapshot {
    /// The gateway's clock, so the browser can place "now" on the timeline.
    pub now: DateTime<Utc>,
    /// This gateway's mode (`enforce`, `off`); the history shows every gateway on the database.
    #[schema(value_type = String, pattern = "^(enforce|off)$")]
    pub fencing: &'static str,
    pub pages: Vec<PageCounters>,
    /// The chosen page (`None` when there is no page yet).
    #[schema(required = true)]
    pub page: Option<PageNow>,
    /// Its newest attempts, oldest first.
    pub attempts: Vec<Attempt>,
}

/// Sent when attempts were committed since the last message.
#[derive(Debug, Serialize, ToSchema)]
pub struct Update {
    pub now: DateTime<Utc>,
    /// The counters of the pages that had attempts, complete.
    pub pages: Vec<PageCounters>,
    /// The chosen page's row, when it had attempts (its body only when the
    /// version changed).
    #[schema(required = true)]
    pub page: Option<PageNow>,
    /// The chosen page's new attempts, oldest first.
    pub attempts: Vec<Attempt>,
}

/// The columns of an [`Attempt`], in [`attempt_of`]'s order (a macro, so
/// that the statements stay `&'static str`: prepared once per connection).
macro_rules! attempt_columns {
    () => {
        "id, page_id, at, method, outcome, token, issuer, client_id, version, fence_token"
    };
}

fn attempt_of(r: &tokio_postgres::Row) -> Result<Attempt, DbError> {
    Ok(Attempt {
        seq: db::get(r, 0)?,
        page_id: db::get(r, 1)?,
        at: db::get(r, 2)?,
        method: db::get(r, 3)?,
        outcome: db::get(r, 4)?,
        token: db::get(r, 5)?,
        issuer: db::get(r, 6)?,
        client_id: db::get(r, 7)?,
        version: db::get(r, 8)?,
        fence_token: db::get(r, 9)?,
    })
}

static POLL: Sql = Sql {
    text: concat!(
        "select * from (
             (select ",
        attempt_columns!(),
        " from page_history where id > $1 order by id limit $2)
             union all
             (select ",
        attempt_columns!(),
        " from page_history where id = any($3) and id <= $1)
         ) t order by id"
    ),
    types: &[Type::INT8, Type::INT8, Type::INT8_ARRAY],
};

/// Rows after `high` (a primary-key range scan), and the gaps, by id.
pub(super) async fn poll_rows(db: &Db, high: i64, gaps: &[i64]) -> Result<Vec<Attempt>, DbError> {
    let mut conn = db.acquire().await?;
    conn.query(&POLL, &[&high, &TAIL_BATCH, &gaps])
        .await?
        .iter()
        .map(attempt_of)
        .collect()
}

static PAGES_NOW: Sql = Sql {
    text: "select id, version, fence_issuer, fence_token, body from pages where id = any($1)",
    types: &[Type::TEXT_ARRAY],
};

/// The rows of the pages `ids` that exist, with their bodies.
pub(super) async fn pages_now(db: &Db, ids: &[String]) -> Result<Vec<PageNow>, DbError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = db.acquire().await?;
    conn.query(&PAGES_NOW, &[&ids])
        .await?
        .iter()
        .map(|r| {
            let issuer: Option<String> = db::get(r, 2)?;
            let token: Option<i64> = db::get(r, 3)?;
            Ok(PageNow {
                id: db::get(r, 0)?,
                version: db::get(r, 1)?,
                fence: issuer
                    .zip(token.and_then(|t| fencelock::Token::try_from(t).ok()))
                    .map(|(issuer, token)| Fence { issuer, token }),
                body: Some(db::get(r, 4)?),
            })
        })
        .collect()
}

static TOP_IDS: Sql = Sql {
    text: "select id from page_history
           where id > (select coalesce(max(id), 0) from page_history) - $1 order by id",
    types: &[Type::INT8],
};

static COUNTERS: Sql = Sql {
    text: "select page_id,
                  count(*) filter (where method = 'PUT' and outcome in ('accepted', 'stale')),
                  count(*) filter (where method <> 'PUT' and outcome in ('accepted', 'stale')),
                  count(*) filter (where outcome not in ('accepted', 'stale')),
                  count(*) filter (where method = 'PUT' and outcome = 'stale'),
                  max(id)
           from page_history
           where id <= $1 and not (id > $2 and id = any($3))
           group by page_id order by page_id",
    types: &[Type::INT8, Type::INT8, Type::INT8_ARRAY],
};

/// The tail's start: every page's counters, exact up to the highest id, and
/// the ids missing below it that may still commit (gaps).
///
/// First the ids near the top of the table: the highest is where the tail
/// starts, and the ids missing below it are its gaps. Then the counters are
/// read up to that id, without the gaps, so that every row is counted once:
/// here, or by the tail. A scan of the whole history, once per gateway.
pub(super) async fn count_all(db: &Db) -> Result<Tail, DbError> {
    let mut conn = db.acquire().await?;
    let top: Vec<i64> = conn
        .query(&TOP_IDS, &[&GAP_WINDOW])
        .await?
        .iter()
        .map(|r| db::get(r, 0))
        .collect::<Result<_, _>>()?;
    let high = top.last().copied().unwrap_or(0);
    let window = high - GAP_WINDOW;
    let gaps: Vec<i64> = ((window + 1).max(1)..high)
        .filter(|id| top.binary_search(id).is_err())
        .collect();
    let pages: Vec<PageCounters> = conn
        .query(&COUNTERS, &[&high, &window, &gaps])
        .await?
        .iter()
        .map(|r| {
            Ok(PageCounters {
                id: db::get(r, 0)?,
                writes: db::get(r, 1)?,
                reads: db::get(r, 2)?,
                refused: db::get(r, 3)?,
                lost_updates: db::get(r, 4)?,
                last_seq: db::get(r, 5)?,
            })
        })
        .collect::<Result<_, DbError>>()?;
    let mut tail = Tail::new(high, &gaps, Instant::now());
    tail.counters = pages.into_iter().map(|p| (p.id.clone(), p)).collect();
    Ok(tail)
}

static PAGE_ATTEMPTS: Sql = Sql {
    text: concat!(
        "select ",
        attempt_columns!(),
        " from page_history
         where page_id = $1 and id <= $2 and not (id = any($3))
         order by id desc limit $4"
    ),
    types: &[Type::TEXT, Type::INT8, Type::INT8_ARRAY, Type::INT8],
};

/// The page's newest attempts up to `high`, without the ids in `gaps`,
/// oldest first: at most [`SNAPSHOT_ATTEMPTS`], read backwards on the index
/// by page and id.
pub(super) async fn page_attempts(
    db: &Db,
    id: &str,
    high: i64,
    gaps: &[i64],
) -> Result<Vec<Attempt>, DbError> {
    let mut conn = db.acquire().await?;
    let mut attempts = conn
        .query(&PAGE_ATTEMPTS, &[&id, &high, &gaps, &SNAPSHOT_ATTEMPTS])
        .await?
        .iter()
        .map(attempt_of)
        .collect::<Result<Vec<_>, _>>()?;
    attempts.reverse();
    Ok(attempts)
}

/// The body's `fencing` value for a gateway's mode.
pub(super) fn fencing_name(fencing: FenceCheck) -> &'static str {
    match fencing {
        FenceCheck::Enforce => "enforce",
        FenceCheck::Off => "off",
    }
}
