//! What the worker tells the world: one JSON line per step on stdout (for
//! tests and the chaos runner, with `--events jsonl`), and a human log line per
//! step through `tracing` on stderr.
//!
//! Every JSON line carries `event`, `client`, `page`, `ts` (unix ms) and, inside
//! an edit, `edit` (its number).
//!
//! A thread of its own writes the lines, as another writes the logs
//! ([`crate::log_writer`]): a reader that does not read never blocks the edit
//! loop with a lock in hand. Past [`crate::log_writer::BUFFERED_LINES`]
//! unread lines, new ones are dropped and counted.

use fencelock::Token;
use std::io::Write;
use std::sync::Mutex;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::config::EventsMode;
use crate::log_writer::LogWriter;

/// Where in an edit something happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Connecting to the lock service at startup.
    Connect,
    Acquire,
    Read,
    Write,
    Release,
}

/// One step of the workload.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The page's lock was granted.
    Acquired {
        token: Option<Token>,
        issuer: String,
    },
    /// The page was read (version 0: it does not exist yet).
    Read { version: u64 },
    /// After the lost-lock check, immediately before the PUT is sent (and
    /// again before each retry of a PUT that failed transiently).
    Writing {
        token: Option<Token>,
        /// Whether the token is sent (`--fencing on`).
        fenced: bool,
        line: String,
    },
    /// The gateway acknowledged the write.
    Wrote {
        status: u16,
        version: u64,
        token: Option<Token>,
        line: String,
    },
    /// The gateway refused the read or write (stale token, wrong issuer, version).
    Rejected {
        status: u16,
        error: String,
        token: Option<Token>,
        current: Option<Token>,
        during: Stage,
        message: String,
    },
    /// The lock was released (`ok: false` if the service could not be told).
    Released { ok: bool },
    /// The lost-lock check fired; the edit was abandoned without writing.
    Lost { reason: String },
    /// Something failed; `transient` ones are retried.
    Error {
        during: Stage,
        transient: bool,
        message: String,
    },
    /// The last line: how the edits ended.
    Summary(Summary),
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Event::Acquired { .. } => "acquired",
            Event::Read { .. } => "read",
            Event::Writing { .. } => "writing",
            Event::Wrote { .. } => "wrote",
            Event::Rejected { .. } => "rejected",
            Event::Released { .. } => "released",
            Event::Lost { .. } => "lost",
            Event::Error { .. } => "error",
            Event::Summary(_) => "summary",
        }
    }
}

/// How the edits of one run ended. Every attempted edit (one that got the lock)
/// ends in exactly one of the four outcomes, so
/// `attempted == acknowledged + rejected + abandoned + errors`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Summary {
    /// Edits that got the lock.
    pub attempted: u64,
    /// Writes the gateway acknowledged (200/201).
    pub acknowledged: u64,
    /// Reads or writes refused by the fence (409 stale_token or issuer_mismatch)
    /// or by the gateway's issuer check (409 token_not_current).
    pub rejected: u64,
    /// Edits abandoned because the lost-lock check fired before the write.
    pub abandoned: u64,
    /// Edits that ended in any other error.
    pub errors: u64,
    /// Failed acquire attempts (retried; not edits).
    pub lock_failures: u64,
}

/// Writes events as JSON lines to stdout (or nowhere) and logs them.
pub struct EventSink {
    mode: EventsMode,
    client: String,
    page: String,
    out: Mutex<Box<dyn Write + Send>>,
    /// The stdout writer's thread, flushed on drop.
    writer: Option<LogWriter>,
}

impl EventSink {
    /// Events on stdout, written by a thread of their own.
    pub fn stdout(mode: EventsMode, client: &str, page: &str) -> Self {
        if mode == EventsMode::None {
            return Self::new(mode, client, page, Box::new(std::io::sink()));
        }
        let writer = LogWriter::new(std::io::stdout(), "worker-events");
        let mut sink = Self::new(mode, client, page, Box::new(writer.writer()));
        sink.writer = Some(writer);
        sink
    }

    pub fn new(mode: EventsMode, client: &str, page: &str, out: Box<dyn Write + Send>) -> Self {
        Self {
            mode,
            client: client.to_string(),
            page: page.to_string(),
            out: Mutex::new(out),
            writer: None,
        }
    }

    /// Log the event for humans and, with `--events jsonl`, write and flush its line.
    pub fn emit(&self, edit: Option<u64>, event: Event) {
        log(edit, &event);
        if self.mode == EventsMode::None {
            return;
        }
        let mut line = self.render(edit, &event);
        line.push('\n');
        let mut out = self.out.lock().expect("event sink mutex");
        // A closed stdout (reader gone) must not stop the work; the log has it.
        let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
    }

    fn render(&self, edit: Option<u64>, event: &Event) -> String {
        let mut map = match serde_json::to_value(event) {
            Ok(Value::Object(m)) => m,
            _ => {
                let mut m = Map::new();
                m.insert("event".into(), event.name().into());
                m
            }
        };
        map.insert("client".into(), self.client.clone().into());
        map.insert("page".into(), self.page.clone().into());
        if let Some(n) = edit {
            map.insert("edit".into(), n.into());
        }
        let ts = chrono::Utc::now().timestamp_millis();
        map.insert("ts".into(), ts.into());
        Value::Object(map).to_string()
    }
}

fn token_text(token: Option<Token>) -> String {
    token.map_or_else(|| "none".into(), |t| t.to_string())
}

/// The human side: one log line per event, in words.
fn log(edit: Option<u64>, event: &Event) {
    let n = edit.unwrap_or(0);
    match event {
        Event::Acquired { token, issuer } => {
            tracing::info!(
                edit = n,
                "acquired the lock from {issuer}, token {}",
                token_text(*token)
            )
        }
        Event::Read { version } => tracing::info!(edit = n, "read the page at version {version}"),
        Event::Writing { token, fenced, .. } => {
            if *fenced {
                tracing::info!(edit = n, "writing with token {}", token_text(*token))
            } else {
                tracing::info!(edit = n, "writing WITHOUT a fencing token (--fencing off)")
            }
        }
        Event::Wrote {
            status, version, ..
        } => tracing::info!(
            edit = n,
            "write acknowledged ({status}), page now at version {version}"
        ),
        Event::Rejected { message, .. } => tracing::warn!(edit = n, "{message}"),
        Event::Released { ok: true } => tracing::debug!(edit = n, "released the lock"),
        Event::Released { ok: false } => {
            tracing::warn!(
                edit = n,
                "could not release the lock; it will expire by itself"
            )
        }
        Event::Lost { reason } => tracing::warn!(
            edit = n,
            "the lease was lost before the write ({reason}); edit abandoned, nothing written"
        ),
        Event::Error {
            during,
            transient,
            message,
        } => {
            if *transient {
                tracing::warn!(edit = n, "{during:?} failed, retrying: {message}")
            } else {
                tracing::error!(edit = n, "{during:?} failed: {message}")
            }
        }
        Event::Summary(s) => tracing::info!(
            "summary: {} edits attempted, {} acknowledged, {} rejected by the fence or the \
             issuer check, {} abandoned on a lost lock, {} errors ({} failed lock attempts retried)",
            s.attempted,
            s.acknowledged,
            s.rejected,
            s.abandoned,
            s.errors,
            s.lock_failures
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_writer::SharedBuf;

    #[test]
    fn events_are_one_json_object_per_line_with_the_agreed_fields() {
        let buf = SharedBuf::default();
        let sink = EventSink::new(EventsMode::Jsonl, "w1", "demo", Box::new(buf.clone()));
        sink.emit(
            Some(3),
            Event::Acquired {
                token: Token::new(7),
                issuer: "redis".into(),
            },
        );
        sink.emit(None, Event::Summary(Summary::default()));
        let lines: Vec<Value> = buf
            .lines()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["event"], "acquired");
        assert_eq!(lines[0]["token"], 7);
        assert_eq!(lines[0]["issuer"], "redis");
        assert_eq!(lines[0]["client"], "w1");
        assert_eq!(lines[0]["page"], "demo");
        assert_eq!(lines[0]["edit"], 3);
        assert!(lines[0]["ts"].as_i64().unwrap() > 0);
        assert_eq!(lines[1]["event"], "summary");
        assert_eq!(lines[1]["attempted"], 0);
    }

    #[test]
    fn events_mode_none_writes_nothing() {
        let buf = SharedBuf::default();
        let sink = EventSink::new(EventsMode::None, "w1", "demo", Box::new(buf.clone()));
        sink.emit(Some(1), Event::Read { version: 0 });
        assert!(buf.lines().is_empty());
    }
}
