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
//!   stream that falls behind is sent `resync` and a new `snapshot`. A
//!   stream also ends when the gateway starts draining ([`AppState::draining`]),
//!   so that an open dashboard does not hold up a graceful shutdown. Streams
//!   are limited overall and per client address ([`crate::limits`]): beyond
//!   a limit, 503 `too_many_streams` at once.
//!
//! # Where the feed comes from: tailing `page_history`
//! Every fenced GET and every PUT inserts its history row in the same SQL
//! statement that decides it (`sql/fenced_access.sql`), so `page_history` is
//! the complete, committed record of what the storage accepted and refused.
//! One task per gateway (`hub.rs`) polls it every [`POLL_INTERVAL`] with one
//! indexed query (`id > last seen`, on the primary key), keeps every page's
//! counters, and broadcasts what each poll found to every open stream; it
//! runs only while a browser is connected. Alternatives that were not taken:
//! - A broadcast channel inside the gateway, fed by the handlers, would only
//!   see this process's writes: with two gateways on one database (the demo's
//!   fenced and unfenced ones) each dashboard would miss the other's.
//! - `LISTEN/NOTIFY` from a trigger sees every gateway, but a notifying
//!   transaction takes one lock shared by the whole cluster at commit and
//!   holds it until the commit ends, so notifying writes commit one at a
//!   time: every write would pay for the dashboard, watched or not. Polling costs the
//!   write path nothing, and an idle dashboard costs one primary-key range
//!   scan that finds nothing, four times a second, however many are open.
//! - A poll per stream made the database's work grow with the viewers, and
//!   every stream's start counted the whole history: a thousand anonymous
//!   streams took a gateway down.
//!
//! The whole history is counted once, when the first dashboard connects
//! (about 0.3 s for a million rows). A stream's start reads its page's newest
//! attempts on the index by page and id, and its row.

//! # Reading the tail without missing a row
//! Ids come from a sequence when the row is inserted, not when it commits, so
//! across pages a row with a lower id can commit after one with a higher id
//! (within one page they follow commit order: the page's row lock is held from
//! before the id is taken until commit). A tail that only asked for `id > last`
//! would skip such a row for good. So the stream remembers the ids below the
//! highest one it has seen that it has not seen ("gaps"), asks for them again
//! with each poll, and gives up on a gap after [`GAP_GRACE`] (an id taken by a
//! statement that rolled back, or skipped by the sequence after a crash, never
//! appears). The count is consistent with the tail in the same way: it
//! counts exactly the rows up to the highest id it saw, minus the gaps below,
//! and so is a stream's start (see `hub.rs`, "Exactly once").
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
//!
//! # Layout
//! - `page.rs`: `/`, `/dashboard` and its assets.
//! - `stream.rs`: `/dashboard/events`, the server-sent events.
//! - `hub.rs`: the gateway's one tail, and the broadcast to the streams.
//! - `query.rs`: the count, the polls and a stream's start: the SQL, and
//!   what is sent.
//! - `tail.rs`: the tail's position in `page_history` and its counters.

mod hub;
mod page;
mod query;
mod stream;
mod tail;

use utoipa_axum::router::OpenApiRouter;

use crate::AppState;

pub use hub::{Batch, Hub, Message, BACKLOG, POLL_INTERVAL};
pub use query::{PageNow, Snapshot, Update, SNAPSHOT_ATTEMPTS, TAIL_BATCH};
pub use stream::{DashboardEvent, EventsParams, KEEP_ALIVE};
pub use tail::{Absorbed, Attempt, PageCounters, Tail, GAP_GRACE, GAP_WINDOW};

/// `/`, `/dashboard`, its assets and its event stream, with their description.
pub fn router() -> OpenApiRouter<AppState> {
    page::router().merge(stream::router())
}
