//! The request deadline: 504 `timeout` while nothing was sent to the
//! database, then the statement's own result if it finishes within the
//! outcome wait, else 504 `outcome_unknown`. A fenced statement, once sent,
//! runs to its end in a task of its own ([`run_fenced`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use fencelock::Token;

use crate::error::ApiError;
use crate::store::{self, Access, Verdict};
use crate::AppState;

/// Default for `--request-timeout`: longest a request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for `--outcome-wait`.
pub const OUTCOME_WAIT: Duration = Duration::from_secs(5);

/// A request's deadline, and what happens when it passes.
///
/// Before the request's statement was sent to the database, passing the
/// deadline answers 504 `timeout`: nothing was written. After, the statement
/// runs to its end in a task of its own whatever happens to the request (see
/// [`run_fenced`]): the request waits up to `outcome_wait` more and answers
/// the statement's result, late but true; if it still has not finished (a
/// lock held for long, a database that stopped answering), 504
/// `outcome_unknown`, which tells the client to read before retrying. A write
/// that lands is never answered with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Longest a request may take (`--request-timeout`).
    pub request: Duration,
    /// How much longer a request whose statement was sent waits for it
    /// (`--outcome-wait`).
    pub outcome_wait: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            request: REQUEST_TIMEOUT,
            outcome_wait: OUTCOME_WAIT,
        }
    }
}

/// What a request has sent to the database: set just before its fenced
/// statement goes out, read by [`deadline`] when the deadline passes.
#[derive(Clone, Default)]
pub struct Sent(Arc<Mutex<SentState>>);

#[derive(Default)]
enum SentState {
    #[default]
    Nothing,
    Statement {
        id: String,
        method: &'static str,
        token: Option<Token>,
    },
    /// The request was answered `outcome_unknown`; the statement goes on.
    AnsweredUnknown,
    /// The deadline passed first and the request was answered `timeout`:
    /// its statement must not be sent any more.
    GaveUp,
}

impl Sent {
    /// About to send the statement: `false` if the request was already
    /// answered `timeout` (then nothing may be sent). Decided under the same
    /// lock as [`Sent::give_up`], so exactly one of the two wins.
    fn statement(&self, access: &Access) -> bool {
        let mut state = self.0.lock().expect("sent");
        if matches!(*state, SentState::GaveUp) {
            return false;
        }
        *state = SentState::Statement {
            id: access.id.clone(),
            method: if access.write.is_some() { "PUT" } else { "GET" },
            token: access.token,
        };
        true
    }

    /// The deadline passed: `true` (and nothing will be sent any more) if no
    /// statement was sent; `false` if one is in flight.
    fn give_up(&self) -> bool {
        let mut state = self.0.lock().expect("sent");
        match *state {
            SentState::Nothing | SentState::GaveUp => {
                *state = SentState::GaveUp;
                true
            }
            SentState::Statement { .. } | SentState::AnsweredUnknown => false,
        }
    }

    /// The statement in flight, if any; marks it answered `outcome_unknown`.
    fn answer_unknown(&self) -> Option<ApiError> {
        let mut state = self.0.lock().expect("sent");
        match std::mem::replace(&mut *state, SentState::AnsweredUnknown) {
            SentState::Statement { id, method, token } => {
                Some(ApiError::OutcomeUnknown { id, method, token })
            }
            other => {
                *state = other;
                None
            }
        }
    }

    fn was_answered_unknown(&self) -> bool {
        matches!(*self.0.lock().expect("sent"), SentState::AnsweredUnknown)
    }
}

/// The request deadline (see [`Deadlines`]). The handler is polled, not
/// dropped, when the deadline passes after its statement was sent.
pub(super) async fn deadline(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let sent = Sent::default();
    req.extensions_mut().insert(sent.clone());
    let deadlines = state.deadlines;
    let run = next.run(req);
    tokio::pin!(run);
    if let Ok(response) = tokio::time::timeout(deadlines.request, &mut run).await {
        return response;
    }
    if sent.give_up() {
        return ApiError::Timeout.into_response();
    }
    state.metrics.deadline_passed_in_flight();
    match tokio::time::timeout(deadlines.outcome_wait, &mut run).await {
        Ok(response) => response,
        Err(_) => match sent.answer_unknown() {
            Some(unknown) => unknown.into_response(),
            None => ApiError::Timeout.into_response(),
        },
    }
}

/// Run the fenced statement(s) in a task of their own, so that once sent
/// they finish whatever happens to the request (its deadline passes, its
/// client hangs up, the gateway drains): a statement is never abandoned
/// midway, its connection goes back to the pool, and [`deadline`] can still
/// answer its result. Marks `sent` just before the first statement goes out;
/// sends nothing if the request was already answered `timeout` (the task may
/// still have been waiting for a connection then).
pub(super) async fn run_fenced(
    state: &AppState,
    access: Access,
    sent: Sent,
) -> Result<(Access, Verdict, store::Row), ApiError> {
    let db = state.db.clone();
    let task = tokio::spawn(async move {
        let result = store::fenced_access(&db, &access, || sent.statement(&access)).await;
        if sent.was_answered_unknown() {
            // Nobody waits for this answer any more: say what happened.
            match &result {
                Ok((verdict, row)) => tracing::warn!(
                    page = %access.id, token = ?access.token, outcome = verdict.as_str(),
                    version = row.version,
                    "a statement answered outcome_unknown finished"
                ),
                Err(e) => tracing::warn!(
                    page = %access.id, token = ?access.token, error = %e,
                    "a statement answered outcome_unknown failed"
                ),
            }
        }
        (access, result)
    });
    match task.await {
        Ok((access, Ok((verdict, row)))) => Ok((access, verdict, row)),
        Ok((_, Err(e))) => Err(e.into()),
        Err(e) => Err(ApiError::Internal(format!("fenced statement task: {e}"))),
    }
}
