//! The live dashboard: what the storage sees, as it happens.
//!
//! - `GET /` redirects to `GET /dashboard`, a page of plain HTML, CSS and a
//!   small script (`gateway/assets/`, compiled into the binary with
//!   `include_str!`: no front-end build, nothing fetched from the network).
//! - `GET /dashboard/events?page=ID` is a stream of server-sent events: first a
//!   `snapshot` (every page with its counters, the chosen page's latest
//!   attempts, its body and fence), then an `update` whenever attempts were
//!   committed (the counters of the pages they touched, the chosen page's new
//!   attempts and its row as it is now). Without `page`, the most recently
//!   accessed page is chosen. A database error sends a `problem` event and ends
//!   the stream; the script reconnects and starts again from a snapshot. A
//!   stream also ends when the gateway starts draining ([`AppState::draining`]),
//!   so that an open dashboard does not hold up a graceful shutdown.
//!
//! # Where the feed comes from: tailing `page_history`
//! Every fenced GET and every PUT inserts its history row in the same SQL
//! statement that decides it (`sql/fenced_access.sql`), so `page_history` is
//! the complete, committed record of what the storage accepted and refused.
//! Each dashboard stream polls it every [`POLL_INTERVAL`] with one indexed
//! query (`id > last seen`, on the primary key), and only while a browser
//! is connected: the stream's future is dropped with the connection.
//! Alternatives that were not taken:
//! - A broadcast channel inside the gateway, fed by the handlers, would only
//!   see this process's writes: with two gateways on one database (the demo's
//!   fenced and unfenced ones) each dashboard would miss the other's.
//! - `LISTEN/NOTIFY` from a trigger sees every gateway, but a notifying
//!   transaction takes one lock shared by the whole cluster at commit and
//!   holds it until the commit ends, so notifying writes commit one at a
//!   time: every write would pay for the dashboard, watched or not. Polling costs the
//!   write path nothing, and an idle dashboard costs one primary-key range
//!   scan that finds nothing, four times a second.
//!
//! The price is paid when a dashboard connects: its snapshot counts the
//! attempts of every page, a scan of the whole history (about 0.3 s for a
//! million rows). The polls share the request pool: one short query each.
//!
//! # Reading the tail without missing a row
//! Ids come from a sequence when the row is inserted, not when it commits, so
//! across pages a row with a lower id can commit after one with a higher id
//! (within one page they follow commit order: the page's row lock is held from
//! before the id is taken until commit). A tail that only asked for `id > last`
//! would skip such a row for good. So the stream remembers the ids below the
//! highest one it has seen that it has not seen ("gaps"), asks for them again
//! with each poll, and gives up on a gap after [`GAP_GRACE`] (an id taken by a
//! statement that rolled back, or skipped by the sequence after a crash, never
//! appears). The snapshot is consistent with the tail in the same way: it
//! counts exactly the rows up to the highest id it saw, minus the gaps below.
//!
//! # Lock grants are inferred, not reported by the workers
//! The dashboard shows only what the gateway sees. A lock grant is drawn at a
//! client's first fenced access with a token it has not used before: every
//! worker edit starts with a fenced GET carrying its new token, so that is
//! where the storage first learns of the grant. Events posted by the workers
//! themselves (acquired, lost) would need authentication, would arrive over
//! a second path with its own delays, and could be wrong or lie, which is the
//! very failure this demo is about: a paused worker believes it still holds
//! the lock. The storage's record is the ground truth of what happened to the
//! page. The worker's own account stays in its logs (`--events jsonl`).
//! Clients that send no token (Redlock runs unfenced) get no grant drawn.
//!
//! # Outcomes
//! `accepted` is a fenced read or a write that landed; `stale` (fencing off)
//! landed although its token was older than the fence: for a PUT, a lost
//! update, counted and drawn in red. Every other outcome (`stale_token`,
//! `issuer_mismatch`, `version_mismatch`, and any added later) is a refusal,
//! drawn as refused with its name.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::HeaderName;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use futures::stream::{self, Stream};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use tokio_postgres::types::Type;

use crate::db::{self, Db, DbError, Sql};
use crate::error::{ApiError, ErrorCode};
use crate::http::QueryParams;
use crate::openapi::{errors, AnyRequestErrors};
use crate::store::Fence;
use crate::{AppState, FenceCheck};

/// How often a stream asks the database for new attempts.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How long an id below the highest seen is waited for before it is taken for
/// one that will never commit. A statement commits milliseconds after taking
/// its id; this is far longer than any commit that succeeds.
pub const GAP_GRACE: Duration = Duration::from_secs(30);
/// Most attempts read per poll; a full batch is followed by another poll at once.
pub const TAIL_BATCH: i64 = 2000;
/// Attempts of the chosen page sent in a snapshot (the newest).
pub const SNAPSHOT_ATTEMPTS: i64 = 2000;
/// How far below the highest id the snapshot looks for uncommitted ids, and
/// most gaps opened by one jump of the sequence.
pub const GAP_WINDOW: i64 = 1024;
/// Idle streams send a comment this often; a closed connection is noticed at
/// the latest then, and the stream's polling stops.
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);

const HTML: &str = include_str!("../assets/dashboard.html");
const CSS: &str = include_str!("../assets/dashboard.css");
const JS: &str = include_str!("../assets/dashboard.js");

/// Nothing but this gateway: no inline script, no other origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// `/`, `/dashboard`, its assets and its event stream, with their description.
pub fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(root))
        .routes(routes!(page))
        .routes(routes!(css))
        .routes(routes!(js))
        .routes(routes!(events))
}

/// To the dashboard.
#[utoipa::path(
    get,
    path = "/",
    operation_id = "root",
    tag = "dashboard",
    responses(
        (status = 303, description = "To `/dashboard`",
            headers(("Location" = String, description = "`/dashboard`"))),
        AnyRequestErrors,
    )
)]
async fn root() -> Redirect {
    Redirect::to("/dashboard")
}

/// The live dashboard: plain HTML, CSS and a small script compiled into the
/// binary; nothing fetched from elsewhere.
#[utoipa::path(
    get,
    path = "/dashboard",
    operation_id = "dashboard",
    tag = "dashboard",
    responses(
        (status = 200, description = "The dashboard's page", content_type = "text/html", body = String),
        AnyRequestErrors,
    )
)]
async fn page() -> Response {
    asset("text/html; charset=utf-8", HTML)
}

/// The dashboard's style sheet.
#[utoipa::path(
    get,
    path = "/dashboard/dashboard.css",
    operation_id = "dashboard_css",
    tag = "dashboard",
    responses(
        (status = 200, description = "CSS", content_type = "text/css", body = String),
        AnyRequestErrors,
    )
)]
async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

/// The dashboard's script.
#[utoipa::path(
    get,
    path = "/dashboard/dashboard.js",
    operation_id = "dashboard_js",
    tag = "dashboard",
    responses(
        (status = 200, description = "JavaScript", content_type = "text/javascript", body = String),
        AnyRequestErrors,
    )
)]
async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            // Revalidate, so a new binary's assets are picked up at once.
            (CACHE_CONTROL, "no-cache"),
            (HeaderName::from_static("content-security-policy"), CSP),
            (HeaderName::from_static("x-content-type-options"), "nosniff"),
        ],
        text,
    )
        .into_response()
}

// ---- what the stream sends ----

/// One attempt on a page: a row of `page_history`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Attempt {
    pub seq: i64,
    #[serde(skip)]
    pub page_id: String,
    pub at: DateTime<Utc>,
    pub method: String,
    pub outcome: String,
    #[schema(required = true)]
    pub token: Option<i64>,
    #[schema(required = true)]
    pub issuer: Option<String>,
    #[schema(required = true)]
    pub client_id: Option<String>,
    /// The page's version after the attempt.
    pub version: i64,
    /// The page's fence token after the attempt.
    #[schema(required = true)]
    pub fence_token: Option<i64>,
}

/// A page's line in the page list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PageCounters {
    pub id: String,
    /// PUTs that landed (`accepted` or `stale`).
    pub writes: i64,
    /// Fenced GETs that were answered (`accepted` or `stale`).
    pub reads: i64,
    /// Attempts refused, whatever the reason.
    pub refused: i64,
    /// PUTs that landed with a token older than the fence (fencing off): lost updates.
    pub lost_updates: i64,
    /// The newest attempt's id.
    pub last_seq: i64,
}

impl PageCounters {
    fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            writes: 0,
            reads: 0,
            refused: 0,
            lost_updates: 0,
            last_seq: 0,
        }
    }

    fn count(&mut self, a: &Attempt) {
        let landed = matches!(a.outcome.as_str(), "accepted" | "stale");
        match (landed, a.method.as_str()) {
            (false, _) => self.refused += 1,
            (true, "PUT") => {
                self.writes += 1;
                if a.outcome == "stale" {
                    self.lost_updates += 1;
                }
            }
            (true, _) => self.reads += 1,
        }
        self.last_seq = self.last_seq.max(a.seq);
    }
}

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

// ---- the tail ----

/// A stream's position in `page_history`, and the counters it keeps.
#[derive(Debug)]
pub struct Tail {
    /// The page whose attempts are sent.
    pub page: Option<String>,
    /// The highest id seen.
    pub high: i64,
    /// Ids below `high` not seen yet, with when they were first missed.
    gaps: BTreeMap<i64, Instant>,
    counters: HashMap<String, PageCounters>,
    /// The version of the body last sent.
    sent_version: Option<i64>,
}

/// What one poll brought for the chosen page and the page list.
#[derive(Debug, Default, PartialEq)]
pub struct Absorbed {
    /// Pages whose counters changed, by id.
    pub pages: Vec<String>,
    /// The chosen page's new attempts, oldest first.
    pub attempts: Vec<Attempt>,
}

impl Tail {
    /// A tail positioned after `high`, with `gaps` still to come.
    pub fn new(page: Option<String>, high: i64, gaps: &[i64], now: Instant) -> Self {
        Self {
            page,
            high,
            gaps: gaps.iter().map(|&id| (id, now)).collect(),
            counters: HashMap::new(),
            sent_version: None,
        }
    }

    /// The ids waited for, for the next poll.
    pub fn gaps(&self) -> Vec<i64> {
        self.gaps.keys().copied().collect()
    }

    pub fn counters(&self, id: &str) -> Option<&PageCounters> {
        self.counters.get(id)
    }

    /// Take in a poll's rows (ordered by id): count them once each, note the
    /// ids skipped over, and forget gaps older than [`GAP_GRACE`].
    pub fn absorb(&mut self, rows: Vec<Attempt>, now: Instant) -> Absorbed {
        let mut out = Absorbed::default();
        for row in rows {
            if row.seq > self.high {
                let from = (self.high + 1).max(row.seq - GAP_WINDOW);
                for id in from..row.seq {
                    self.gaps.insert(id, now);
                }
                self.high = row.seq;
            } else if self.gaps.remove(&row.seq).is_none() {
                continue; // seen before
            }
            self.counters
                .entry(row.page_id.clone())
                .or_insert_with(|| PageCounters::new(&row.page_id))
                .count(&row);
            if !out.pages.contains(&row.page_id) {
                out.pages.push(row.page_id.clone());
            }
            if self.page.as_ref() == Some(&row.page_id) {
                out.attempts.push(row);
            }
        }
        self.gaps
            .retain(|_, since| now.duration_since(*since) < GAP_GRACE);
        // A burst of rollbacks cannot grow the set without bound.
        while self.gaps.len() as i64 > 4 * GAP_WINDOW {
            self.gaps.pop_first();
        }
        out
    }
}

// ---- queries ----

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

// ---- the endpoint ----

/// `?page=ID`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsParams {
    /// The page to follow; by default the most recently accessed one.
    #[param(pattern = "^[A-Za-z0-9_-]{1,128}$", example = "demo")]
    page: Option<String>,
}

/// The same rule as the page routes' ids.
fn valid_page_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

enum Phase {
    Start,
    Tailing { tail: Box<Tail>, full: bool },
    Done,
}

errors!(EventsErrors = [InvalidPageId, InvalidQuery]);

/// The dashboard's feed: server-sent events that do not end.
///
/// First a `snapshot` event (every page with its counters, the chosen page's
/// latest attempts, its body and fence), then an `update` whenever attempts
/// were committed; a comment every 5 s keeps an idle stream open. A database
/// error sends a `problem` event and ends the stream (the browser reconnects).
/// The stream also ends when the gateway drains. Each event's `data` is JSON.
#[utoipa::path(
    get,
    path = "/dashboard/events",
    operation_id = "dashboard_events",
    tag = "dashboard",
    params(EventsParams),
    responses(
        (status = 200, description = "An endless stream of `snapshot`, `update` and `problem` \
            events. The schema describes one event (`event`, `data`, `retry`), as OpenAPI 3.2's \
            `itemSchema` would; `data` is JSON, a `Snapshot` or an `Update`, or a line of text.",
            content_type = "text/event-stream", body = DashboardEvent),
        EventsErrors,
    )
)]
async fn events(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<EventsParams>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    if let Some(id) = &params.page {
        if !valid_page_id(id) {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidPageId,
                "page ids are 1 to 128 characters of A-Z, a-z, 0-9, '_' and '-'",
            ));
        }
    }
    let page = params.page;
    tracing::debug!(page = ?page, "dashboard stream opened");
    let stream = stream::unfold(Phase::Start, move |phase| {
        let (db, fencing, page) = (state.db.clone(), state.fencing, page.clone());
        let draining = state.draining.clone();
        async move {
            match phase {
                Phase::Start => Some(match snapshot(&db, page.as_deref(), fencing).await {
                    Ok((snapshot, tail)) => (
                        Ok(json_event("snapshot", &snapshot).retry(Duration::from_secs(1))),
                        Phase::Tailing {
                            tail: Box::new(tail),
                            full: false,
                        },
                    ),
                    Err(e) => (Ok(problem(e)), Phase::Done),
                }),
                Phase::Tailing { mut tail, mut full } => loop {
                    if !full {
                        tokio::select! {
                            _ = tokio::time::sleep(POLL_INTERVAL) => {}
                            // The gateway is draining: end, the browser reconnects.
                            _ = draining.cancelled() => break None,
                        }
                    }
                    match poll(&db, &mut tail).await {
                        Ok((None, more)) => full = more,
                        Ok((Some(update), more)) => {
                            break Some((
                                Ok(json_event("update", &update)),
                                Phase::Tailing { tail, full: more },
                            ))
                        }
                        Err(e) => break Some((Ok(problem(e)), Phase::Done)),
                    }
                },
                Phase::Done => None,
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// One event of the stream, for the description (see [`crate::openapi`]).
pub struct DashboardEvent;

impl utoipa::PartialSchema for DashboardEvent {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
        crate::openapi::dashboard_event_schema()
    }
}

impl ToSchema for DashboardEvent {
    fn schemas(schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::Schema>)>) {
        use utoipa::PartialSchema;
        schemas.push((Snapshot::name().into(), Snapshot::schema()));
        schemas.push((Update::name().into(), Update::schema()));
        Snapshot::schemas(schemas);
        Update::schemas(schemas);
    }
}

fn json_event(name: &str, data: &impl Serialize) -> Event {
    match Event::default().event(name).json_data(data) {
        Ok(event) => event,
        Err(e) => Event::default()
            .event("problem")
            .data(format!("encode {name}: {e}")),
    }
}

/// The stream ends after this; the browser reconnects and starts over.
fn problem(e: DbError) -> Event {
    tracing::warn!(error = %e, "dashboard stream stopped on a database error");
    Event::default()
        .event("problem")
        .data("the database did not answer; reconnecting")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(seq: i64, page: &str, method: &str, outcome: &str) -> Attempt {
        Attempt {
            seq,
            page_id: page.into(),
            at: Utc::now(),
            method: method.into(),
            outcome: outcome.into(),
            token: Some(seq),
            issuer: Some("default".into()),
            client_id: Some("c".into()),
            version: 1,
            fence_token: Some(seq),
        }
    }

    #[test]
    fn a_row_committed_late_below_the_highest_id_is_still_counted_once() {
        let t0 = Instant::now();
        let mut tail = Tail::new(Some("a".into()), 10, &[], t0);
        // 12 commits before 11.
        let got = tail.absorb(vec![attempt(12, "b", "PUT", "accepted")], t0);
        assert_eq!(got.pages, ["b"]);
        assert_eq!(tail.gaps(), [11]);
        let got = tail.absorb(
            vec![
                attempt(11, "a", "GET", "accepted"),
                attempt(12, "b", "PUT", "accepted"),
            ],
            t0,
        );
        assert_eq!(got.pages, ["a"], "12 is not counted twice");
        assert_eq!(got.attempts.len(), 1);
        assert!(tail.gaps().is_empty());
        assert_eq!(tail.counters("b").unwrap().writes, 1);
        assert_eq!(tail.counters("a").unwrap().reads, 1);
    }

    #[test]
    fn a_gap_that_never_commits_is_given_up_after_the_grace() {
        let t0 = Instant::now();
        let mut tail = Tail::new(None, 0, &[], t0);
        tail.absorb(vec![attempt(3, "a", "PUT", "accepted")], t0);
        assert_eq!(tail.gaps(), [1, 2]);
        tail.absorb(vec![], t0 + GAP_GRACE - Duration::from_millis(1));
        assert_eq!(tail.gaps(), [1, 2]);
        tail.absorb(vec![], t0 + GAP_GRACE);
        assert!(tail.gaps().is_empty());
    }

    #[test]
    fn a_jump_of_the_sequence_opens_at_most_a_window_of_gaps() {
        let t0 = Instant::now();
        let mut tail = Tail::new(None, 0, &[], t0);
        tail.absorb(vec![attempt(1_000_000, "a", "PUT", "accepted")], t0);
        assert_eq!(tail.gaps().len() as i64, GAP_WINDOW);
        assert_eq!(tail.gaps()[0], 1_000_000 - GAP_WINDOW);
    }

    #[test]
    fn refusals_of_any_name_count_as_refused_and_stale_puts_as_lost_updates() {
        let mut c = PageCounters::new("a");
        for (method, outcome) in [
            ("PUT", "accepted"),
            ("PUT", "stale"),
            ("GET", "accepted"),
            ("GET", "stale"),
            ("PUT", "stale_token"),
            ("GET", "issuer_mismatch"),
            ("PUT", "token_not_current"),
            ("PUT", "some_future_refusal"),
        ] {
            c.count(&attempt(1, "a", method, outcome));
        }
        assert_eq!((c.writes, c.reads, c.refused, c.lost_updates), (2, 2, 4, 1));
    }
}
