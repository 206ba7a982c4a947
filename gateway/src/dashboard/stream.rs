//! `GET /dashboard/events?page=ID`: the server-sent events, a snapshot then
//! updates from the gateway's one tail ([`super::hub`]), until the browser
//! leaves, the database fails or the gateway drains.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use chrono::Utc;
use futures::stream::{self, Stream};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::{self, error::RecvError};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::db::DbError;
use crate::error::ApiError;
use crate::http::extractors::{PageId, QueryParams};
use crate::limits::ClientAddr;
use crate::openapi::errors;
use crate::{AppState, FenceCheck};

use super::hub::{Batch, Follow, Hub, Message};
use super::query::{fencing_name, PageNow, Snapshot, Update};
use super::tail::Attempt;

/// Idle streams send a comment this often; a closed connection is noticed at
/// the latest then, and the stream's polling stops.
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// `/dashboard/events`.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(events))
}

/// `?page=ID`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsParams {
    /// The page to follow; by default the most recently accessed one.
    #[param(pattern = "^[A-Za-z0-9_-]{1,128}$", example = "demo")]
    page: Option<String>,
}

/// Where a stream is.
enum Phase {
    /// To start, following this page (or the page accessed last).
    Start(Option<String>),
    Live(Box<Live>),
    Done,
}

/// A started stream: its place in the broadcast and what it last sent.
struct Live {
    receiver: broadcast::Receiver<Message>,
    page: Option<String>,
    /// The version of the body last sent.
    sent_version: Option<i64>,
    _follow: Option<Follow>,
}

errors!(EventsErrors = [InvalidPageId, InvalidQuery, TooManyStreams]);

/// The dashboard's feed: server-sent events that do not end.
///
/// First a `snapshot` event (every page with its counters, the chosen page's
/// latest attempts, its body and fence), then an `update` whenever attempts
/// were committed; a comment every 5 s keeps an idle stream open. A stream
/// that fell too far behind is sent `resync`, then a new `snapshot`. A
/// database error sends a `problem` event and ends the stream (the browser
/// reconnects). The stream also ends when the gateway drains. Each event's
/// `data` is JSON. Streams are limited overall and per client address;
/// beyond a limit: 503 `too_many_streams` with `Retry-After`, at once.
#[utoipa::path(
    get,
    path = "/dashboard/events",
    operation_id = "dashboard_events",
    tag = "dashboard",
    params(EventsParams),
    responses(
        (status = 200, description = "An endless stream of `snapshot`, `update`, `resync` and \
            `problem` events. The schema describes one event (`event`, `data`, `retry`), as \
            OpenAPI 3.2's `itemSchema` would; `data` is JSON, a `Snapshot` or an `Update`, or a \
            line of text.",
            content_type = "text/event-stream", body = DashboardEvent),
        EventsErrors,
    )
)]
async fn events(
    State(state): State<AppState>,
    client: Option<Extension<ClientAddr>>,
    QueryParams(params): QueryParams<EventsParams>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    // The same rule as the page routes' ids.
    let page = params.page.map(PageId::parse).transpose()?.map(|p| p.0);
    let permit = state.streams.try_open(ClientAddr::or_unknown(client))?;
    tracing::debug!(page = ?page, "dashboard stream opened");
    let (hub, fencing, draining) = (state.hub.clone(), state.fencing, state.draining.clone());
    let stream = stream::unfold(Phase::Start(page), move |phase| {
        let (hub, draining) = (hub.clone(), draining.clone());
        let _held = &permit; // the stream's slot, freed when the stream is dropped
        async move {
            match phase {
                Phase::Start(page) => Some(match start(&hub, page, fencing).await {
                    Ok((snapshot, live)) => (
                        Ok(json_event("snapshot", &snapshot).retry(Duration::from_secs(1))),
                        Phase::Live(Box::new(live)),
                    ),
                    Err(e) => (Ok(problem(e)), Phase::Done),
                }),
                Phase::Live(mut live) => {
                    let message = tokio::select! {
                        m = live.receiver.recv() => m,
                        // The gateway is draining: end, the browser reconnects.
                        _ = draining.cancelled() => return None,
                    };
                    match message {
                        Ok(Message::Batch(batch)) => {
                            let data = live.update(&batch);
                            let event = Event::default().event("update").data(&*data);
                            Some((Ok(event), Phase::Live(live)))
                        }
                        Ok(Message::Problem) => Some((
                            Ok(problem(DbError::Unavailable("poll failed".into()))),
                            Phase::Done,
                        )),
                        Err(RecvError::Lagged(missed)) => {
                            tracing::debug!(missed, "dashboard stream fell behind");
                            Some((
                                Ok(Event::default()
                                    .event("resync")
                                    .data("fell behind; a new snapshot follows")),
                                Phase::Start(live.page.clone()),
                            ))
                        }
                        Err(RecvError::Closed) => None,
                    }
                }
                Phase::Done => None,
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// The snapshot a stream starts with, and its place in the broadcast.
async fn start(
    hub: &Arc<Hub>,
    page: Option<String>,
    fencing: FenceCheck,
) -> Result<(Snapshot, Live), DbError> {
    let start = hub.subscribe().await?;
    // Without a choice: the page accessed last.
    let page = page.or_else(|| {
        start
            .pages
            .iter()
            .max_by_key(|p| p.last_seq)
            .map(|p| p.id.clone())
    });
    let follow = page.as_deref().map(|id| hub.follow(id));
    let (mut attempts, mut row) = (Vec::new(), None);
    if let Some(id) = &page {
        attempts = hub.attempts(id, &start).await?;
        row = Some(hub.row(id).await?.unwrap_or_else(|| PageNow {
            id: id.clone(),
            version: 0,
            fence: None,
            body: Some(None),
        }));
    }
    let live = Live {
        receiver: start.receiver,
        page,
        sent_version: row.as_ref().map(|p| p.version),
        _follow: follow,
    };
    let snapshot = Snapshot {
        now: Utc::now(),
        fencing: fencing_name(fencing),
        pages: start.pages,
        page: row,
        attempts,
    };
    Ok((snapshot, live))
}

impl Live {
    /// A batch as this stream shows it, as the JSON of an [`Update`]: every
    /// page's counters, its page's attempts and row (the body only when its
    /// version changed). Encoded once per batch for the streams that show
    /// the same.
    fn update(&mut self, batch: &Batch) -> Arc<str> {
        let row = batch
            .rows
            .iter()
            .find(|r| Some(&r.id) == self.page.as_ref());
        let had_attempts = batch
            .attempts
            .iter()
            .any(|a| Some(&a.page_id) == self.page.as_ref());
        let row = row.filter(|_| had_attempts);
        let with_body = row.is_some_and(|r| self.sent_version != Some(r.version));
        if let Some(r) = row {
            self.sent_version = Some(r.version);
        }
        let key = (self.page.clone(), with_body);
        let mut encoded = batch.encoded.lock().unwrap_or_else(|e| e.into_inner());
        encoded
            .entry(key)
            .or_insert_with(|| {
                let update = self.encode(batch, with_body);
                serde_json::to_string(&update)
                    .unwrap_or_else(|e| format!("{{\"problem\":\"encode update: {e}\"}}"))
                    .into()
            })
            .clone()
    }

    /// The [`Update`] of `batch` for this stream's page.
    fn encode(&self, batch: &Batch, with_body: bool) -> Update {
        let attempts: Vec<Attempt> = batch
            .attempts
            .iter()
            .filter(|a| Some(&a.page_id) == self.page.as_ref())
            .cloned()
            .collect();
        let mut page = None;
        if !attempts.is_empty() {
            page = batch
                .rows
                .iter()
                .find(|r| Some(&r.id) == self.page.as_ref())
                .cloned();
        }
        if let Some(p) = &mut page {
            if !with_body {
                p.body = None;
            }
        }
        Update {
            now: batch.now,
            pages: batch.pages.clone(),
            page,
            attempts,
        }
    }
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
