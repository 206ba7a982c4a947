//! The `LISTEN` connection of a PostgreSQL lease table, and the waiters it
//! wakes.
//!
//! What a listener costs: PostgreSQL before 19 (15 measured here) signals
//! every connection that `LISTEN`s in the database at each commit that
//! notifies, whatever the channel (its `async.c` keeps no table of who
//! listens to what until the model "as of v19"), so each process with a
//! waiter makes every release of the database wake one more server process.
//! Two idle listeners cost one worker alone on the hot page 8 % of its edits
//! and 60 µs per release. Hence the listener closes soon after its process's
//! last waiter ([`LISTEN_IDLE`]), and stays open while waiters keep coming.
//!
//! Each listener also `LISTEN`s on a channel of its own, `fencelock_<key>`
//! (a random key per [`LeaseTable`], shared by its clones; an acquire's id
//! is `<key>.<random>`), on which a release that names one of its waiters
//! notifies it alone. On the table's channel, every other process's
//! listener would receive, parse and drop it: with two other listeners, a
//! notification reached its own listener 44–77 µs later than with none, and
//! 0–18 µs later when they listened on other channels (PostgreSQL still
//! signals them; they send their clients nothing); on the hot page, three
//! workers' fair edits went from 0.87× to 0.89× of one alone.
//! docs/BENCHMARKS.md ("Fair locks on a hot page") has these measurements.
//!
//! [`LeaseTable`]: crate::lease_table::LeaseTable

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::statements::OWN_CHANNEL;
use crate::lease_table::{CONNECT_TIMEOUT, ISSUER_POSTGRES};
use crate::wake::{Registration, Wakers};
use crate::{LockError, Waiter};

/// After the `LISTEN` connection failed, waiters poll this long before it is
/// tried again.
const LISTEN_RETRY: Duration = Duration::from_secs(1);
/// The `LISTEN` connection is closed once three checks this far apart (0.2–0.3 s)
/// found no waiter in this process, and no waiter came and went between
/// them: while it is open, every release of the
/// table, waited for or not, is delivered to it and costs both the server
/// and this process a wake-up (it made uncontended acquire+release 2–3×
/// slower after one contended moment, and still 15 % slower for the 0.5–0.75 s
/// it stayed open before this was shortened). The next refused acquire opens
/// it again (one connection, one round trip).
const LISTEN_IDLE: Duration = Duration::from_millis(100);

/// The own channel of the listener with key `key`.
fn own_channel(key: &str) -> String {
    format!("{OWN_CHANNEL}{key}")
}

/// A PostgreSQL waiter registered before its first try (the `LISTEN`
/// connection was running): it waits right after its first refusal.
pub(super) struct RegisteredWaiter(pub(super) Registration);

impl Waiter for RegisteredWaiter {
    const TRY_AFTER_SETUP: bool = false;

    fn arm(&mut self) {
        self.0.arm();
    }

    async fn wait(&mut self, bound: Duration) -> Result<bool, LockError> {
        Ok(self.0.wait(bound).await)
    }
}

/// The `LISTEN` side of a PostgreSQL lease table: one connection, started
/// by the first waiter, routing the table's notifications to the waiters.
pub(super) struct Listen {
    channel: String,
    /// Random per listener: waiter ids start with it, and the releases
    /// that name one of them notify its own channel alone
    /// ([`own_channel`], listened to beside the table's), so that the other
    /// processes' listeners do not receive them.
    key: String,
    wakers: Arc<Wakers>,
    /// The listening task runs (a mirror of `Phase::Running`, read without
    /// the lock).
    running: Arc<AtomicBool>,
    /// Never held across an `await`: a waiter's future that stops being
    /// polled must not hold up the other waiters (see [`Listen::register`]).
    state: Mutex<ListenState>,
}

#[derive(Default)]
struct ListenState {
    phase: Phase,
    /// Dropping it stops the listening task (or its start).
    _stop: Option<oneshot::Sender<()>>,
}

enum Phase {
    /// Not listening; when the last start failed, if it did.
    Idle {
        failed_at: Option<Instant>,
    },
    /// A start is under way; its outcome (true: listening) comes here.
    Starting(watch::Receiver<Option<bool>>),
    Running,
}

impl Default for Phase {
    fn default() -> Self {
        Phase::Idle { failed_at: None }
    }
}

impl Listen {
    pub(super) fn new(table: &str) -> Self {
        let key = format!("{:016x}", rand::random::<u64>());
        Listen {
            channel: table.to_string(),
            key,
            wakers: Arc::new(Wakers::default()),
            running: Arc::new(AtomicBool::new(false)),
            state: Mutex::new(ListenState::default()),
        }
    }

    /// The key that starts this listener's waiters' ids.
    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// Register a waiter for lock `name` if the table's channel is being
    /// listened to already (no round trip); `None` otherwise. Should the
    /// listening task end right after, it wakes every waiter.
    pub(super) fn register_if_running(
        &self,
        name: &str,
        waiter: Option<Arc<str>>,
        behind: Option<Arc<AtomicBool>>,
        handed: Option<Arc<AtomicI64>>,
    ) -> Option<Registration> {
        if !self.running.load(Ordering::SeqCst) {
            return None;
        }
        let registration = self.wakers.register_behind(name, waiter, behind, handed);
        // Checked again after registering: a task that ended in between
        // woke the waiters registered before us, not us; and a task that
        // stops for want of waiters clears the flag before it looks for
        // them (SeqCst on both sides), so it sees us or we see it stopped.
        self.running.load(Ordering::SeqCst).then_some(registration)
    }

    /// Register a waiter for lock `name`; the table's channel is `LISTEN`ed
    /// to (confirmed by the server) before this returns. `None` when that
    /// failed: the waiter polls.
    ///
    /// The connection is started by a task of its own, which every waiter
    /// that comes meanwhile waits for: when the start ran in the first
    /// waiter's future under a lock, a future that stopped being polled
    /// there (dropped neither, as a task stuck elsewhere) kept every later
    /// waiter of the service from registering, past its own `wait`.
    pub(super) async fn register(
        self: &Arc<Self>,
        pool: &PgPool,
        name: &str,
        waiter: Option<Arc<str>>,
        behind: Option<Arc<AtomicBool>>,
        handed: Option<Arc<AtomicI64>>,
    ) -> Option<Registration> {
        let registration = self.wakers.register_behind(name, waiter, behind, handed);
        let mut outcome = {
            let mut state = self.state.lock().expect("listen state");
            match &state.phase {
                Phase::Running => return Some(registration),
                Phase::Idle {
                    failed_at: Some(at),
                } if at.elapsed() < LISTEN_RETRY => return None,
                Phase::Starting(outcome) => outcome.clone(),
                Phase::Idle { .. } => self.start(pool, &mut state),
            }
        };
        let listening = outcome
            .wait_for(Option::is_some)
            .await
            .is_ok_and(|started| *started == Some(true));
        listening.then_some(registration)
    }

    /// Start the listening task; the receiver says whether it listens.
    fn start(
        self: &Arc<Self>,
        pool: &PgPool,
        state: &mut ListenState,
    ) -> watch::Receiver<Option<bool>> {
        let (outcome_tx, outcome) = watch::channel(None);
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        state.phase = Phase::Starting(outcome.clone());
        state._stop = Some(stop_tx);
        let me: Weak<Listen> = Arc::downgrade(self);
        let wakers = self.wakers.clone();
        let pool = pool.clone();
        let channels = [self.channel.clone(), own_channel(&self.key)];
        tokio::spawn(async move {
            let connect = tokio::time::timeout(CONNECT_TIMEOUT, async {
                let mut listener = PgListener::connect_with(&pool).await?;
                listener
                    .listen_all(channels.iter().map(String::as_str))
                    .await?;
                Ok::<_, sqlx::Error>(listener)
            });
            let started = tokio::select! {
                started = connect => started,
                _ = &mut stop_rx => return,
            };
            let Some(listen) = me.upgrade() else { return };
            let mut listener = {
                let mut state = listen.state.lock().expect("listen state");
                match started {
                    Ok(Ok(l)) => {
                        state.phase = Phase::Running;
                        listen.running.store(true, Ordering::SeqCst);
                        l
                    }
                    failed => {
                        tracing::debug!(
                            issuer = ISSUER_POSTGRES,
                            "LISTEN unavailable, polling: {failed:?}"
                        );
                        state.phase = Phase::Idle {
                            failed_at: Some(Instant::now()),
                        };
                        state._stop = None;
                        outcome_tx.send_replace(Some(false));
                        return;
                    }
                }
            };
            drop(listen);
            outcome_tx.send_replace(Some(true));
            let mut idle = tokio::time::interval(LISTEN_IDLE);
            idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut quiet_ticks = 0;
            let mut seen = wakers.registrations();
            loop {
                tokio::select! {
                    _ = idle.tick() => {
                        // Quiet: nobody waits now AND nobody registered
                        // since the last tick. Looking only at the moment
                        // of the tick closed the listener about once a
                        // second on a hot lock, whose waiters come and go
                        // every millisecond: each time a tick fell while
                        // this process held the lock.
                        let registrations = wakers.registrations();
                        let quiet = wakers.is_empty() && registrations == seen;
                        seen = registrations;
                        quiet_ticks = if quiet { quiet_ticks + 1 } else { 0 };
                        if quiet_ticks < 3 {
                            continue;
                        }
                        let Some(me) = me.upgrade() else { return };
                        let mut state = me.state.lock().expect("listen state");
                        me.running.store(false, Ordering::SeqCst);
                        if wakers.is_empty() {
                            state.phase = Phase::default();
                            state._stop = None;
                            tracing::debug!(issuer = ISSUER_POSTGRES, "no waiter: UNLISTEN");
                            return;
                        }
                        // A waiter registered meanwhile: go on listening.
                        me.running.store(true, Ordering::SeqCst);
                        quiet_ticks = 0;
                    }
                    got = listener.try_recv() => match got {
                        Ok(Some(n)) => {
                            if let Some((target, name)) = n.payload().split_once(' ') {
                                // `<waiter>=<token>`: a release handed the
                                // lock to that waiter.
                                match target.split_once('=').map(|(w, t)| (w, t.parse())) {
                                    Some((waiter, Ok(token))) => {
                                        wakers.hand_over(name, waiter, token)
                                    }
                                    _ => wakers.notify(name, target),
                                }
                            }
                        }
                        // The connection was lost (the listener reconnects
                        // and listens again at the next call): a notification
                        // may have been lost with it.
                        Ok(None) => wakers.notify_all(),
                        Err(e) => {
                            tracing::debug!(issuer = ISSUER_POSTGRES, "LISTEN failed: {e}");
                            break;
                        }
                    },
                    _ = &mut stop_rx => return,
                }
            }
            if let Some(me) = me.upgrade() {
                let mut state = me.state.lock().expect("listen state");
                state.phase = Phase::default();
                me.running.store(false, Ordering::SeqCst);
                state._stop = None;
            }
            wakers.notify_all();
        });
        outcome
    }
}
