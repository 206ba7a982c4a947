//! What a stream reads: the snapshot it starts with and the polls of the
//! tail after it, each a short indexed query on the request pool, and the
//! messages they make.

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
async fn poll_rows(db: &Db, high: i64, gaps: &[i64]) -> Result<Vec<Attempt>, DbError> {
    let mut conn = db.acquire().await?;
    conn.query(&POLL, &[&high, &TAIL_BATCH, &gaps])
        .await?
        .iter()
        .map(attempt_of)
        .collect()
}

static PAGE_NOW: Sql = Sql {
    text: "select id, version, fence_issuer, fence_token, version is distinct from $2,
                  case when version is distinct from $2 then body end
           from pages where id = $1",
    types: &[Type::TEXT, Type::INT8],
};

/// The page's row; its body only if its version is not `sent` (the body is
/// not even read from the table then).
async fn page_now(db: &Db, id: &str, sent: Option<i64>) -> Result<Option<PageNow>, DbError> {
    let mut conn = db.acquire().await?;
    let Some(r) = conn.query_opt(&PAGE_NOW, &[&id, &sent]).await? else {
        return Ok(None);
    };
    let issuer: Option<String> = db::get(&r, 2)?;
    let token: Option<i64> = db::get(&r, 3)?;
    let new: bool = db::get(&r, 4)?;
    let body: Option<String> = db::get(&r, 5)?;
    Ok(Some(PageNow {
        id: db::get(&r, 0)?,
        version: db::get(&r, 1)?,
        fence: issuer
            .zip(token.and_then(|t| fencelock::Token::try_from(t).ok()))
            .map(|(issuer, token)| Fence { issuer, token }),
        body: new.then_some(body),
    }))
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

static PAGE_ATTEMPTS: Sql = Sql {
    text: concat!(
        "select ",
        attempt_columns!(),
        " from page_history
         where page_id = $1 and id <= $2 and not (id > $3 and id = any($4))
         order by id desc limit $5"
    ),
    types: &[
        Type::TEXT,
        Type::INT8,
        Type::INT8,
        Type::INT8_ARRAY,
        Type::INT8,
    ],
};

/// The first message, and the tail that continues exactly after it.
///
/// First the ids near the top of the table: the highest is where the tail
/// starts, and the ids missing below it may still commit (gaps). Then the
/// counters and the chosen page's attempts are read up to that id, without
/// the gaps, so that every row is counted once: here, or by the tail.
pub async fn snapshot(
    db: &Db,
    page: Option<&str>,
    fencing: FenceCheck,
) -> Result<(Snapshot, Tail), DbError> {
    let mut conn = db.acquire().await?;
    let top: Vec<i64> = conn
        .query(&TOP_IDS, &[&GAP_WINDOW])
        .await?
        .iter()
        .map(|r| db::get(r, 0))
        .collect::<Result<_, _>>()?;
    drop(conn);
    let high = top.last().copied().unwrap_or(0);
    let window = high - GAP_WINDOW;
    let gaps: Vec<i64> = ((window + 1).max(1)..high)
        .filter(|id| top.binary_search(id).is_err())
        .collect();

    let mut conn = db.acquire().await?;
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
    drop(conn);

    // Without a choice: the page accessed last.
    let page = page.map(str::to_owned).or_else(|| {
        pages
            .iter()
            .max_by_key(|p| p.last_seq)
            .map(|p| p.id.clone())
    });
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut now_row = None;
    if let Some(id) = &page {
        let mut conn = db.acquire().await?;
        attempts = conn
            .query(
                &PAGE_ATTEMPTS,
                &[&id, &high, &window, &gaps, &SNAPSHOT_ATTEMPTS],
            )
            .await?
            .iter()
            .map(attempt_of)
            .collect::<Result<_, _>>()?;
        drop(conn);
        attempts.reverse();
        now_row = Some(page_now(db, id, None).await?.unwrap_or_else(|| PageNow {
            id: id.clone(),
            version: 0,
            fence: None,
            body: Some(None),
        }));
    }

    let mut tail = Tail::new(page, high, &gaps, Instant::now());
    tail.counters = pages.iter().map(|p| (p.id.clone(), p.clone())).collect();
    tail.sent_version = now_row.as_ref().map(|p| p.version);
    let snapshot = Snapshot {
        now: Utc::now(),
        fencing: match fencing {
            FenceCheck::Enforce => "enforce",
            FenceCheck::Off => "off",
        },
        pages,
        page: now_row,
        attempts,
    };
    Ok((snapshot, tail))
}

/// Poll once: `None` when nothing was committed since the last poll. The
/// flag says the batch was full (poll again without waiting).
pub async fn poll(db: &Db, tail: &mut Tail) -> Result<(Option<Update>, bool), DbError> {
    let rows = poll_rows(db, tail.high, &tail.gaps()).await?;
    let high = tail.high;
    let full = rows.iter().filter(|r| r.seq > high).count() as i64 >= TAIL_BATCH;
    let absorbed = tail.absorb(rows, Instant::now());
    if absorbed.pages.is_empty() {
        return Ok((None, full));
    }
    let page = match (&tail.page, absorbed.attempts.is_empty()) {
        (Some(id), false) => page_now(db, id, tail.sent_version).await?,
        _ => None,
    };
    if let Some(p) = &page {
        tail.sent_version = Some(p.version);
    }
    let pages = absorbed
        .pages
        .iter()
        .filter_map(|id| tail.counters(id).cloned())
        .collect();
    let update = Update {
        now: Utc::now(),
        pages,
        page,
        attempts: absorbed.attempts,
    };
    Ok((Some(update), full))
}
