//! The edit loop: acquire `page:<id>`, fenced read, append a line, work, check
//! the lease, fenced write, release. Over and over, on any backend.
//!
//! One edit that got the lock ends in exactly one outcome: acknowledged,
//! rejected by the fence, abandoned on a lost lock, or an error. Transient
//! failures (gateway 503 or unreachable, lock service unreachable) are retried
//! with jittered backoff inside the edit while the lease holds; they never end
//! the run.
//!
//! A retried PUT is the same request again (same body, same token), so a
//! retry after a PUT whose answer was lost cannot add the line twice; `writing`
//! is emitted before every attempt. A 504 `outcome_unknown` (the gateway sent
//! the write and its deadline passed first) is not retried blindly: the
//! worker reads the page and counts the edit acknowledged if its line is
//! there, and retries only if it is not. If the lease is lost while retrying, the
//! edit counts as abandoned even though an earlier attempt may have landed:
//! the summary never claims an edit the gateway did not acknowledge.
//!
//! The check in step 5 and the write in step 6 are not atomic, and nothing in a
//! client can make them so: a pause between them (`--stop-self-at writing`) is
//! invisible here. Only the gateway catches it: its issuer check
//! (`token_not_current`: the lock service no longer names us as the holder)
//! or its fence (`stale_token`); both count as rejected.
//!
//! What no retry can fix ends the run with exit code 2 after releasing the
//! lock: 401 (no or unknown API key), 403 (the key belongs to another client
//! than `--client-id`) and 409 `unknown_issuer` (the gateway does not trust
//! our lock service). 503 `issuer_unavailable` is retried like any 503, and
//! 429 `rate_limited` after the `Retry-After` the gateway sent, not sooner.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{raise, Signal};
use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::backend::{self, BackendError};
use crate::client::{GatewayClient, GatewayError, OfferedToken};
use crate::config::{Config, StopAt};
use crate::events::{Event, EventSink, Stage, Summary};
use fencelock::{Lease, LockError, LockService, Token};

/// How long an acquisition in flight at shutdown may still finish, so that a
/// grant it obtained is released instead of left to expire.
const STOP_GRACE: Duration = Duration::from_millis(500);

/// Why the worker could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A configuration that cannot work, or a lock service that cannot be
    /// reached (a wrong setting is `BackendError::Config`).
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(
        "{issuer} granted a lease without a fencing token ({reason}); with --fencing on \
         the worker refuses to write unfenced. Use --fencing off to run without fencing"
    )]
    Unfenced { issuer: String, reason: String },
    #[error("the gateway client could not be built: {0}")]
    Gateway(#[from] GatewayError),
    /// The gateway refused us for a reason no retry can fix (401, 403,
    /// `unknown_issuer`, `no_issuer_for_page`); the lock was released first.
    #[error("{}", misconfigured_message(error, client_id, *has_key))]
    Refused {
        error: GatewayError,
        client_id: String,
        has_key: bool,
    },
}

/// What to fix, in words, for a refusal no retry can cure.
fn misconfigured_message(error: &GatewayError, client_id: &str, has_key: bool) -> String {
    match error {
        GatewayError::Unauthorized { message } if !has_key => format!(
            "the gateway requires an API key and none is configured (401: {message}); set \
             --api-key / WORKER_API_KEY to the key the gateway has for client `{client_id}` \
             (the demo keys are in demo/api-keys)"
        ),
        GatewayError::Unauthorized { message } => format!(
            "the gateway does not know our API key (401: {message}); set --api-key / \
             WORKER_API_KEY to the key the gateway has for client `{client_id}` (the demo \
             keys are in demo/api-keys)"
        ),
        GatewayError::Forbidden {
            code,
            key_client: Some(key_client),
            message,
        } if code == "client_id_mismatch" => format!(
            "our API key belongs to client `{key_client}`, not `{client_id}` (403 \
             client_id_mismatch: {message}). The lock service records `{client_id}` as the \
             holder and the gateway checks the holder against the key's client, so \
             --client-id / WORKER_CLIENT_ID and --api-key / WORKER_API_KEY must be the same \
             client's"
        ),
        GatewayError::Forbidden { code, message, .. } => format!(
            "the gateway refused our API key for this request (403 {code}: {message}); use \
             the writer key of client `{client_id}`"
        ),
        GatewayError::UnknownIssuer {
            issuer,
            known,
            message,
        } => format!(
            "the gateway does not trust our lock service `{issuer}` as an issuer of fencing \
             tokens (409 unknown_issuer; it knows {}: {message}). Add it to the gateway's \
             GATEWAY_ISSUERS, or use one of those backends",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ),
        GatewayError::NoIssuerForPage { message } => format!(
            "the gateway names no lock service for this page (409 no_issuer_for_page: \
             {message}): its operator adds the page to GATEWAY_PAGE_ISSUERS or sets \
             GATEWAY_DEFAULT_ISSUER to our backend"
        ),
        other => format!("the gateway refused us for good: {other}"),
    }
}

impl RunError {
    /// 2 for what the user must fix in the configuration, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Unfenced { .. } | RunError::Gateway(_) | RunError::Refused { .. } => 2,
            RunError::Backend(e) => e.exit_code(),
        }
    }
}

/// Run edits until `--edits` or `--duration` is reached or `shutdown`
/// resolves; then finish (or abandon) the current edit, release, emit the
/// summary and return it.
pub async fn run<F>(config: Config, shutdown: F) -> Result<Summary, RunError>
where
    F: Future<Output = ()> + Send + 'static,
{
    config.validate().map_err(BackendError::Config)?;
    let client_id = config.client_id();
    let events = EventSink::stdout(config.events, &client_id, &config.page);

    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown.await;
            tracing::info!("shutdown requested: finishing the current edit");
            stop.cancel();
        }
    });
    if let Some(d) = config.duration {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            stop.cancel();
        });
    }

    let gateway =
        GatewayClient::new(&config.gateway, &client_id)?.with_api_key(config.api_key.clone());
    let Some(locks) = connect(&config, &stop, &events).await? else {
        let summary = Summary::default();
        events.emit(None, Event::Summary(summary));
        return Ok(summary);
    };
    tracing::info!(
        backend = config.backend.name(),
        issuer = locks.issuer(),
        client = %client_id,
        page = %config.page,
        fencing = ?config.fencing,
        fair = config.fair,
        "worker started"
    );
    let mut workload = Workload {
        lock_name: config.lock_name(),
        config,
        client_id,
        events,
        locks,
        gateway,
        stop,
        stopped_self: AtomicBool::new(false),
        summary: Summary::default(),
    };
    let result = workload.run_edits().await;
    let summary = workload.summary;
    workload.events.emit(None, Event::Summary(summary));
    result.map(|()| summary)
}

/// Connect to the lock service, retrying while it is unreachable. `None` when
/// stopped before it answered.
async fn connect(
    config: &Config,
    stop: &CancellationToken,
    events: &EventSink,
) -> Result<Option<Arc<dyn LockService>>, RunError> {
    let mut backoff = Backoff::new();
    loop {
        let attempt = tokio::select! {
            r = backend::connect(config) => r,
            _ = stop.cancelled() => return Ok(None),
        };
        match attempt {
            Ok(locks) => return Ok(Some(locks)),
            Err(e) if e.is_transient() => events.emit(
                None,
                Event::Error {
                    during: Stage::Connect,
                    transient: true,
                    message: e.to_string(),
                },
            ),
            Err(e) => return Err(e.into()),
        }
        if !backoff.sleep_or(stop).await {
            return Ok(None);
        }
    }
}

/// How one edit that got the lock ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Acknowledged,
    /// Refused by the fence or the issuer check. `held`: refused although the
    /// lease is fresh and intact (a counter that went backwards, or a gateway
    /// asking another lock service than ours), so the next edit will be
    /// refused too.
    Rejected {
        held: bool,
    },
    Abandoned,
    Error,
    /// Refused for a reason no retry can fix: the run ends.
    Misconfigured(GatewayError),
}

/// What a retried gateway call came to.
enum Tried<T> {
    Done(T),
    Failed(GatewayError),
    Lost(String),
    Interrupted,
}

struct Workload {
    config: Config,
    client_id: String,
    lock_name: String,
    events: EventSink,
    locks: Arc<dyn LockService>,
    gateway: GatewayClient,
    stop: CancellationToken,
    stopped_self: AtomicBool,
    summary: Summary,
}

impl Workload {
    async fn run_edits(&mut self) -> Result<(), RunError> {
        let mut backoff = Backoff::new();
        while !self.stop.is_cancelled() {
            if let Some(limit) = self.config.edit_limit() {
                if self.summary.attempted >= limit {
                    break;
                }
            }
            let Some(lease) = self.acquire().await? else {
                break;
            };
            self.summary.attempted += 1;
            let n = self.summary.attempted;
            let outcome = self.edit(n, &lease).await;
            self.release(n, lease).await;
            match &outcome {
                Outcome::Acknowledged => self.summary.acknowledged += 1,
                Outcome::Rejected { .. } => self.summary.rejected += 1,
                Outcome::Abandoned => self.summary.abandoned += 1,
                Outcome::Error => self.summary.errors += 1,
                Outcome::Misconfigured(error) => {
                    self.summary.errors += 1;
                    return Err(RunError::Refused {
                        error: error.clone(),
                        client_id: self.client_id.clone(),
                        has_key: self.config.api_key.is_some(),
                    });
                }
            }
            // Going straight on is right after a normal outcome; after a failure
            // that will repeat (a counter that went backwards, a refused request)
            // back off instead of spinning.
            match outcome {
                Outcome::Rejected { held: true } | Outcome::Error => {
                    backoff.sleep_or(&self.stop).await;
                }
                _ => backoff.reset(),
            }
        }
        Ok(())
    }

    /// Acquire the page's lock, retrying failures. `None` when stopped first.
    async fn acquire(&mut self) -> Result<Option<Lease>, RunError> {
        let mut backoff = Backoff::new();
        loop {
            let mut acquiring =
                self.locks
                    .acquire(&self.lock_name, self.config.ttl, self.config.wait);
            let attempt = tokio::select! {
                r = &mut acquiring => r,
                _ = self.stop.cancelled() => {
                    // The attempt in flight may already have been granted on
                    // the service: let it finish for a moment so that the
                    // grant is released now, not left to block others until
                    // its TTL runs out.
                    if let Ok(Ok(lease)) =
                        tokio::time::timeout(STOP_GRACE, &mut acquiring).await
                    {
                        if let Err(e) = lease.release().await {
                            tracing::warn!("release of a grant that arrived after shutdown: {e}");
                        }
                    }
                    return Ok(None);
                }
            };
            let e = match attempt {
                Ok(lease) => {
                    if self.config.fenced() && lease.token().is_none() {
                        let reason = match lease.fencing() {
                            fencelock::Fencing::Unfenced { reason } => reason.to_string(),
                            fencelock::Fencing::Token(_) => String::new(),
                        };
                        let issuer = lease.issuer().to_string();
                        let _ = lease.release().await;
                        return Err(RunError::Unfenced { issuer, reason });
                    }
                    return Ok(Some(lease));
                }
                Err(e) => e,
            };
            if let LockError::InvalidConfig(_) = e {
                return Err(BackendError::Lock(e).into());
            }
            self.summary.lock_failures += 1;
            let next = self.summary.attempted + 1;
            self.events.emit(
                Some(next),
                Event::Error {
                    during: Stage::Acquire,
                    transient: e.is_transient(),
                    message: e.to_string(),
                },
            );
            if matches!(e, LockError::Timeout { .. }) {
                // Waited the whole --wait already; try again at once.
                if self.stop.is_cancelled() {
                    return Ok(None);
                }
                continue;
            }
            if !backoff.sleep_or(&self.stop).await {
                return Ok(None);
            }
        }
    }

    #[tracing::instrument(name = "edit", skip_all, fields(n = n, token = ?lease.token()))]
    async fn edit(&self, n: u64, lease: &Lease) -> Outcome {
        let token = lease.token();
        let page_id = &self.config.page;
        self.emit(
            n,
            Event::Acquired {
                token,
                issuer: lease.issuer().to_string(),
            },
        );
        let fence = match (self.config.fenced(), token) {
            (true, Some(token)) => Some(OfferedToken {
                token,
                issuer: lease.issuer().to_string(),
            }),
            _ => None,
        };

        // 2. Fenced read; a page that does not exist yet reads as empty.
        let page = match self
            .retrying(n, Stage::Read, lease, || {
                self.gateway.get(page_id, fence.as_ref())
            })
            .await
        {
            Tried::Done(page) => page,
            Tried::Failed(e) => return self.refused(n, Stage::Read, lease, e),
            Tried::Lost(reason) => return self.lost(n, reason),
            Tried::Interrupted => return self.interrupted(n, Stage::Read),
        };
        self.emit(
            n,
            Event::Read {
                version: page.version,
            },
        );
        self.maybe_stop_self(StopAt::Read);

        // 3. Append our line.
        let line = format!(
            "{} #{n} token={}",
            self.client_id,
            token.map_or_else(|| "none".to_string(), |t| t.to_string())
        );
        let mut body = page.body;
        if !body.is_empty() && !body.ends_with('\n') {
            body.push('\n');
        }
        body.push_str(&line);
        body.push('\n');

        // 4. Work.
        tokio::time::sleep(Duration::from_millis(self.config.work_ms)).await;

        // 5. The lost-lock check: the last moment a client can notice.
        if let Some(reason) = lease.lost_reason() {
            return self.lost(n, reason);
        }

        // 6. Fenced write. From `writing` on, a pause goes unnoticed here.
        // If-Match only for a page that existed: the gateway refuses any
        // If-Match on a page never written.
        let if_match = (self.config.if_match && page.version > 0).then_some(page.version);
        let (line_ref, body_ref, fence_ref) = (&line, &body, fence.as_ref());
        let put = move || async move {
            self.emit(
                n,
                Event::Writing {
                    token,
                    fenced: fence_ref.is_some(),
                    line: line_ref.clone(),
                },
            );
            self.maybe_stop_self(StopAt::Writing);
            self.gateway
                .put(page_id, body_ref, fence_ref, if_match)
                .await
        };
        let mut written = self.retrying(n, Stage::Write, lease, put).await;
        // 504 outcome_unknown: the gateway sent the write and does not know
        // whether it landed. Check before retrying: read the page (unfenced:
        // it must not move the fence) and look for our line, which no other
        // edit writes. After such an answer, If-Match refusing the retry may
        // just mean that the first attempt landed: check that too.
        let mut unsure = false;
        loop {
            let mismatch = match &written {
                Tried::Failed(GatewayError::OutcomeUnknown { .. }) => false,
                Tried::Failed(GatewayError::VersionMismatch { .. }) if unsure => true,
                _ => break,
            };
            unsure = true;
            if let Tried::Failed(e) = &written {
                self.emit(
                    n,
                    Event::Error {
                        during: Stage::Write,
                        transient: true,
                        message: format!("{e}; reading the page to see whether it landed"),
                    },
                );
            }
            match self
                .retrying(n, Stage::Read, lease, || self.gateway.get(page_id, None))
                .await
            {
                Tried::Done(page) if page.body.lines().any(|l| l == line) => {
                    self.emit(
                        n,
                        Event::Wrote {
                            status: 200,
                            // The page's version when our line was found.
                            version: page.version,
                            token,
                            line,
                        },
                    );
                    return Outcome::Acknowledged;
                }
                Tried::Done(_) if mismatch => break,
                Tried::Done(_) => written = self.retrying(n, Stage::Write, lease, put).await,
                Tried::Failed(e) => return self.refused(n, Stage::Read, lease, e),
                Tried::Lost(reason) => return self.lost(n, reason),
                Tried::Interrupted => return self.interrupted(n, Stage::Write),
            }
        }
        match written {
            Tried::Done(w) => {
                self.emit(
                    n,
                    Event::Wrote {
                        status: w.status,
                        version: w.page.version,
                        token,
                        line,
                    },
                );
                Outcome::Acknowledged
            }
            Tried::Failed(e) => self.refused(n, Stage::Write, lease, e),
            Tried::Lost(reason) => self.lost(n, reason),
            Tried::Interrupted => self.interrupted(n, Stage::Write),
        }
    }

    /// Call the gateway, retrying transient failures with backoff while the
    /// lease holds.
    async fn retrying<T, F, Fut>(&self, n: u64, stage: Stage, lease: &Lease, mut op: F) -> Tried<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, GatewayError>>,
    {
        let mut backoff = Backoff::new();
        loop {
            match op().await {
                Ok(v) => return Tried::Done(v),
                Err(e) if e.is_transient() => {
                    self.emit(
                        n,
                        Event::Error {
                            during: stage,
                            transient: true,
                            message: e.to_string(),
                        },
                    );
                    let slept = match e.retry_after() {
                        // The gateway said how long: not sooner.
                        Some(wait) => sleep_or(wait, &self.stop).await,
                        None => backoff.sleep_or(&self.stop).await,
                    };
                    if !slept {
                        return Tried::Interrupted;
                    }
                    if let Some(reason) = lease.lost_reason() {
                        return Tried::Lost(reason);
                    }
                }
                Err(e) => return Tried::Failed(e),
            }
        }
    }

    /// The gateway refused the read or the write for good.
    fn refused(&self, n: u64, during: Stage, lease: &Lease, e: GatewayError) -> Outcome {
        let what = if during == Stage::Read {
            "read"
        } else {
            "write"
        };
        let (status, code) = e.status_and_code();
        let show = |t: Option<Token>| t.map_or_else(|| "?".to_string(), |t| t.to_string());
        let (token, current, message, outcome) = match &e {
            GatewayError::StaleToken {
                offered, current, ..
            } => {
                // Refused although we were granted the lock a moment ago, without a
                // pause, and still hold it: the fence can only be ahead of us if the
                // lock service handed out lower numbers than it did before.
                let regressed = !lease.is_lost() && lease.acquired_at().elapsed() < lease.ttl();
                let message = if regressed {
                    format!(
                        "the lock service's token counter went backwards: {issuer} granted us \
                         token {} a moment ago and the lease still holds, yet the page's fence \
                         is already at {}. A lock service that forgets its counter (for example \
                         Redis restarted without persistence) issues tokens the gateway has \
                         already passed, so every holder is rejected: safe, but stuck until the \
                         counter is raised past the fence. See docs/OPERATIONS.md",
                        show(*offered),
                        show(*current),
                        issuer = lease.issuer(),
                    )
                } else {
                    format!(
                        "lease was lost and the fence rejected the {what} (offered token {}, \
                         page fence {})",
                        show(*offered),
                        show(*current)
                    )
                };
                (
                    *offered,
                    *current,
                    message,
                    Outcome::Rejected { held: regressed },
                )
            }
            GatewayError::TokenNotCurrent {
                issuer,
                offered,
                holder,
                message,
            } => {
                // Normally our lease ended (a pause, a delay) and the lock
                // moved on. Refused while our lease is fresh and intact means
                // the gateway asks a lock service that does not see our
                // grant: another server than ours, or one that lost it.
                let held = !lease.is_lost() && lease.acquired_at().elapsed() < lease.ttl();
                let text = if held {
                    format!(
                        "the gateway's issuer `{issuer}` says our token {} is not the current \
                         holder's (holder token {}) although our lease is fresh and intact: \
                         the gateway is probably asking another lock service than the one we \
                         use (compare its GATEWAY_ISSUERS with our backend's URL), or that \
                         service lost our grant ({message})",
                        show(*offered),
                        show(*holder),
                    )
                } else {
                    format!(
                        "lease was lost and the issuer check rejected the {what}: `{issuer}` \
                         no longer names us as the holder of token {} (holder token {})",
                        show(*offered),
                        show(*holder)
                    )
                };
                (*offered, None, text, Outcome::Rejected { held })
            }
            config if config.is_config_error() => {
                self.emit(
                    n,
                    Event::Error {
                        during,
                        transient: false,
                        message: config.to_string(),
                    },
                );
                return Outcome::Misconfigured(config.clone());
            }
            GatewayError::IssuerMismatch { message } => (
                lease.token(),
                None,
                format!(
                    "the fence rejected the {what}: the page is fenced by another lock service \
                     than {} and tokens of different services are never comparable ({message})",
                    lease.issuer()
                ),
                Outcome::Rejected { held: false },
            ),
            GatewayError::VersionMismatch { message } => (
                lease.token(),
                None,
                format!(
                    "If-Match refused the {what}: the page changed since it was read ({message})"
                ),
                Outcome::Error,
            ),
            other => {
                self.emit(
                    n,
                    Event::Error {
                        during,
                        transient: false,
                        message: other.to_string(),
                    },
                );
                return Outcome::Error;
            }
        };
        self.emit(
            n,
            Event::Rejected {
                status,
                error: code.to_string(),
                token,
                current,
                during,
                message,
            },
        );
        outcome
    }

    fn lost(&self, n: u64, reason: String) -> Outcome {
        self.emit(n, Event::Lost { reason });
        Outcome::Abandoned
    }

    fn interrupted(&self, n: u64, during: Stage) -> Outcome {
        self.emit(
            n,
            Event::Error {
                during,
                transient: false,
                message: "shutting down while retrying; edit abandoned".into(),
            },
        );
        Outcome::Error
    }

    async fn release(&self, n: u64, lease: Lease) {
        let limit = lease.ttl().max(Duration::from_secs(2));
        let ok = match tokio::time::timeout(limit, lease.release()).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(edit = n, "release failed: {e}");
                false
            }
            Err(_) => {
                tracing::warn!(edit = n, "release timed out after {limit:?}");
                false
            }
        };
        self.emit(n, Event::Released { ok });
    }

    fn emit(&self, n: u64, event: Event) {
        self.events.emit(Some(n), event);
    }

    /// `--stop-self-at`: SIGSTOP this process once, right after the event was
    /// written (and flushed, with the log). Every thread stops, the lease
    /// watchdog and the ZooKeeper heartbeats included, as in a GC pause.
    fn maybe_stop_self(&self, at: StopAt) {
        if self.config.stop_self_at != Some(at) || self.stopped_self.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::warn!(
            "stopping myself with SIGSTOP at `{}` (--stop-self-at); SIGCONT resumes",
            match at {
                StopAt::Read => "read",
                StopAt::Writing => "writing",
            }
        );
        // Stopped, the output threads would stop too: the reader must see
        // the event and this line first.
        if !crate::log_writer::flush_all(Duration::from_secs(5)) {
            tracing::warn!("the output was not all written before stopping: nobody reads it");
        }
        if let Err(e) = raise(Signal::SIGSTOP) {
            tracing::error!("could not SIGSTOP myself: {e}");
        }
    }
}

/// Sleep `delay`; `false` if `stop` fired first.
async fn sleep_or(delay: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => true,
        _ = stop.cancelled() => false,
    }
}

/// Jittered exponential backoff, 50 ms doubling to 2 s.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(2);

    fn new() -> Self {
        Self { next: Self::FIRST }
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    /// Sleep the next delay; `false` if `stop` fired first.
    async fn sleep_or(&mut self, stop: &CancellationToken) -> bool {
        let delay = self.next.mul_f64(rand::rng().random_range(0.5..1.5));
        self.next = (self.next * 2).min(Self::MAX);
        sleep_or(delay, stop).await
    }
}
