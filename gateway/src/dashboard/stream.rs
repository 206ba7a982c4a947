//! `GET /dashboard/events?page=ID`: the server-sent events, a snapshot then
//! updates, until the browser leaves, the database fails or the gateway
//! drains.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::stream::{self, Stream};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::db::DbError;
use crate::error::ApiError;
use crate::http::extractors::{PageId, QueryParams};
use crate::openapi::errors;
use crate::AppState;

use super::query::{poll, snapshot, Snapshot, Update};
use super::tail::Tail;

/// How often a stream asks the database for new attempts.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
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
    // The same rule as the page routes' ids.
    let page = params.page.map(PageId::parse).transpose()?.map(|p| p.0);
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
