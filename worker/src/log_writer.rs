//! Output that never blocks the edit loop: a writer thread per stream.
//!
//! A worker writes to a pipe (a script, a container runtime, a test). A pipe
//! holds 64 KiB; a reader that stops reading, or reads only at the end, would
//! block a worker that writes from its edit loop, with the lock in hand, until
//! its lease lapsed and the other workers waited out the TTL. Here the edit
//! loop only queues the line; the stream's thread writes it. A reader that
//! falls more than [`BUFFERED_LINES`] behind loses the newest lines, counted,
//! instead of stalling the page.
//!
//! `tracing-appender`'s non-blocking writer does the same, but cannot wait
//! until what was queued is written; `--stop-self-at` must, or its reader
//! would not see the event it stopped at ([`flush_all`]).

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};

/// Lines queued for a stream before new ones are dropped.
pub const BUFFERED_LINES: usize = 128_000;

/// How long dropping a [`LogWriter`] waits for a reader that does not read.
const DROP_WAIT: Duration = Duration::from_secs(1);

enum Msg {
    Line(Vec<u8>),
    /// Answered once every line queued before it is written and flushed.
    Flush(Sender<()>),
}

/// The queue of every live [`LogWriter`], for [`flush_all`].
static WRITERS: Mutex<Vec<(u64, Sender<Msg>)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// One stream's writer thread. Dropping it writes out what is queued,
/// waiting at most [`DROP_WAIT`].
pub struct LogWriter {
    id: u64,
    queue: Queue,
    name: &'static str,
}

/// What the edit loop writes to: each `write` queues one whole line.
#[derive(Clone)]
pub struct Queue {
    tx: Sender<Msg>,
    dropped: Arc<AtomicUsize>,
}

impl Write for Queue {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.tx.try_send(Msg::Line(buf.to_vec())) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogWriter {
    /// A thread named `name` writing to `out`.
    pub fn new<W: Write + Send + 'static>(out: W, name: &'static str) -> Self {
        let (tx, rx) = crossbeam_channel::bounded(BUFFERED_LINES);
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || write_lines(out, rx))
            .expect("spawn an output thread");
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        WRITERS.lock().expect("writers lock").push((id, tx.clone()));
        Self {
            id,
            queue: Queue {
                tx,
                dropped: Arc::new(AtomicUsize::new(0)),
            },
            name,
        }
    }

    /// A handle that queues lines; `move || handle.clone()` makes it a
    /// `tracing` writer.
    pub fn writer(&self) -> Queue {
        self.queue.clone()
    }

    /// Lines dropped so far because the reader was too far behind.
    pub fn dropped(&self) -> usize {
        self.queue.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        WRITERS
            .lock()
            .expect("writers lock")
            .retain(|(id, _)| *id != self.id);
        let dropped = self.dropped();
        if dropped > 0 {
            // To the log, not into the stream: stdout is JSON lines.
            tracing::warn!(
                "{dropped} line(s) of {} dropped: the reader fell more than \
                 {BUFFERED_LINES} lines behind",
                self.name
            );
        }
        flush(&self.queue.tx, DROP_WAIT);
    }
}

/// Wait, at most `timeout` per stream, until every line queued so far on
/// every stream is written and flushed. True if all were.
pub fn flush_all(timeout: Duration) -> bool {
    let writers: Vec<Sender<Msg>> = WRITERS
        .lock()
        .expect("writers lock")
        .iter()
        .map(|(_, tx)| tx.clone())
        .collect();
    writers.iter().all(|tx| flush(tx, timeout))
}

fn flush(tx: &Sender<Msg>, timeout: Duration) -> bool {
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    tx.send_timeout(Msg::Flush(done_tx), timeout).is_ok() && done_rx.recv_timeout(timeout).is_ok()
}

fn write_lines<W: Write>(mut out: W, rx: Receiver<Msg>) {
    while let Ok(msg) = rx.recv() {
        let mut next = Some(msg);
        // Write what is queued, then flush once.
        while let Some(msg) = next.take() {
            match msg {
                Msg::Line(line) => {
                    let _ = out.write_all(&line);
                }
                Msg::Flush(done) => {
                    let _ = out.flush();
                    let _ = done.send(());
                }
            }
            next = rx.try_recv().ok();
        }
        let _ = out.flush();
    }
}

/// A writer into shared memory, for the tests of this crate's output.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct SharedBuf(Arc<Mutex<Vec<u8>>>);

#[cfg(test)]
impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
impl SharedBuf {
    /// What was written, as lines.
    pub(crate) fn lines(&self) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_lines(w: &mut Queue, n: usize) {
        for i in 0..n {
            w.write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
    }

    #[test]
    fn a_flush_returns_once_every_queued_line_is_written_in_order() {
        let out = SharedBuf::default();
        let log = LogWriter::new(out.clone(), "test-flush");
        queue_lines(&mut log.writer(), 1000);
        assert!(flush_all(Duration::from_secs(10)));
        let lines = out.lines();
        assert_eq!(lines.len(), 1000);
        assert!(lines
            .iter()
            .enumerate()
            .all(|(i, l)| *l == format!("line {i}")));
    }

    /// A writer that blocks until told to go on, as a pipe nobody reads.
    struct Stuck(Receiver<()>, SharedBuf);

    impl Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            self.1.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_reader_that_does_not_read_costs_lines_not_time() {
        let (go, wait) = crossbeam_channel::unbounded();
        let out = SharedBuf::default();
        let log = LogWriter::new(Stuck(wait, out.clone()), "test-stuck");
        // The thread takes one line and blocks on it; the queue holds the
        // next BUFFERED_LINES; the rest are dropped without blocking.
        queue_lines(&mut log.writer(), BUFFERED_LINES + 100);
        assert!(log.dropped() >= 99, "dropped {}", log.dropped());
        assert!(!flush(&log.queue.tx, Duration::from_millis(50)));
        drop(go);
        assert!(flush(&log.queue.tx, Duration::from_secs(10)));
        assert_eq!(out.lines().len() + log.dropped(), BUFFERED_LINES + 100);
    }
}
