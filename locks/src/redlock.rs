//! Redlock: one lock over N independent Redis masters, as the Redis
//! documentation's "Distributed Locks with Redis" page specifies it, and
//! honestly unfenced.
//!
//! # The algorithm
//! For a lock named `N` every node holds the key `redlock:{N}` with a random
//! owner value (`<client id>:<sequence>`) while it is held.
//! 1. Note the start time, then send `SET redlock:{N} owner NX PX ttl` to all
//!    nodes at once over one multiplexed connection per node, each request
//!    with a per-node timeout far below the TTL (default
//!    `clamp(ttl / 200, 5 ms, 50 ms)`, see [`Redlock::with_node_timeout`]).
//!    Replies are counted as they arrive: the round stops as soon as a
//!    majority said OK (or can no longer say it), so the slowest node never
//!    sets the pace; requests still in flight reach their node anyway.
//! 2. Granted only if a majority (`N/2 + 1`) said OK and the elapsed time is
//!    below the TTL minus the clock drift allowance (`ttl × 1 % + 2 ms`). The
//!    lease is then trusted until `start + ttl − drift`, so right after the
//!    grant its remaining validity is `ttl − elapsed − drift`.
//! 3. Otherwise release on EVERY node at once, including those that timed out
//!    (the request may have landed after we stopped waiting), then retry after
//!    a jittered delay until `wait` runs out ([`poll_until_granted`]).
//! 4. Extension ([`EXTEND_SCRIPT`], compare owner then `PEXPIRE`) and release
//!    ([`RELEASE_SCRIPT`], compare owner then `DEL`) go to all nodes at once;
//!    an extension counts only if a majority extended within the validity, and
//!    is tried at most [`EXTEND_ATTEMPTS`] times.
//!
//! A node that is down or frozen (SIGSTOP) costs one per-node timeout, never a
//! TCP or connection timeout: every request is cut off at the per-node
//! timeout; a connection that breaks (not one that is merely slow) is dropped,
//! and a node with no live connection fails at once while a background task
//! reconnects it. A node unreachable at [`Redlock::connect`] is logged and
//! reconnected in the background; connect fails only when fewer than a
//! majority answer.
//!
//! # Why there is no fencing token
//! A lease from this backend is [`Fencing::Unfenced`]. A fencing token must be
//! minted by one counter, in the same atomic step as the grant, and must grow
//! with every grant. Redlock has no such counter:
//! - an `INCR` on each node gives N unrelated numbers: node A's 7 and node B's
//!   7 say nothing about each other, and the majority of one grant need not
//!   overlap the majority of the next on the node whose counter is highest;
//! - the maximum over a majority is not monotonic either: a node that restarts
//!   without persistence starts its counter from zero, and a later majority
//!   that includes it but not the node with the old maximum returns a smaller
//!   number than an earlier grant did;
//! - more basically (Kleppmann, "How to do distributed locking", 2016), the
//!   algorithm's safety rests on timing (bounded pauses, bounded network delay,
//!   clocks that advance at the same rate). The demonstrations in
//!   `locks/tests/it/redlock.rs` show two clients both holding a valid grant after
//!   a node restart without persistence and after a clock jump on one node.
//!   A token derived from such a grant would look safe and would not be.
//!
//! So a worker using Redlock sends no token, and only a storage with fencing
//! off accepts its writes. Use it for efficiency (avoid doing work twice), not
//! for correctness.
//!
//! # Where it breaks, reproducibly (`locks/tests/it/redlock.rs`)
//! - `two_holders_after_node_restart_without_persistence`: client 1 holds A, B,
//!   C of five (D, E unreachable); C crashes and restarts empty; client 2 gets
//!   C, D, E while client 1's lease is still valid.
//! - `two_holders_after_clock_jump_on_one_node`: the same, with C's key expired
//!   early (a clock jump, simulated by `PEXPIRE key 1` because libfaketime
//!   cannot run Debian's redis-server).
//! - `delayed_restart_past_the_ttl_prevents_two_holders` and
//!   `appendfsync_always_prevents_two_holders_after_restart`: the two
//!   mitigations the Redlock page proposes, each preventing the first case.
//! - `minority_partition_still_grants_with_validity_reduced_by_the_wait`: two of
//!   five nodes frozen (SIGSTOP): still granted, after one per-node timeout,
//!   with the validity shortened by that wait.
//!
//! [`Redlock::holders_on_nodes`] shows, node by node, who holds a key: the
//! demonstrations and the chaos suite use it to see two holders at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::{join_all, BoxFuture};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rand::Rng;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Script, Value};
use tokio::time::Instant;

use crate::settings::{Configurable, Settings};
use crate::{
    drift_allowance, poll_until_granted, AcquireOptions, Fencing, Grant, Lease, LockError,
    LockService, NewLease,
};

/// The issuer name of this service (its leases carry no token).
pub const ISSUER: &str = "redlock";

/// Why a Redlock lease carries no fencing token.
pub const UNFENCED_REASON: &str = "Redlock has no single counter: N independent masters cannot \
     mint one monotonic number (per-node counters are not comparable, and a majority's maximum \
     goes backwards after a node restarts without persistence), so no safe fencing token exists";

/// How many times an extension is tried before giving up.
pub const EXTEND_ATTEMPTS: u32 = 3;

/// `KEYS[1]` the node's key, `ARGV[1]` owner, `ARGV[2]` TTL in ms: extend
/// only while the key still holds our owner value (1), else touch nothing
/// (0). Atomic because Redis runs a script without interleaving other
/// commands. (The single-instance lock keeps a hash with a fair queue and a
/// reentrancy count; Redlock's per-node key stays a plain string.)
pub const EXTEND_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// `KEYS[1]` the node's key, `ARGV[1]` owner: delete only while the key
/// still holds our owner value (1), else touch nothing (0).
pub const RELEASE_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// How long connecting to one node may take at [`Redlock::connect`].
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Delay between background reconnection attempts to a node that is down.
const RECONNECT_DELAY: Duration = Duration::from_millis(100);
/// Per-node timeout of the diagnostic [`Redlock::holders_on_nodes`].
const QUERY_TIMEOUT: Duration = Duration::from_millis(250);

fn scripts() -> &'static (Script, Script) {
    static SCRIPTS: std::sync::OnceLock<(Script, Script)> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(|| (Script::new(EXTEND_SCRIPT), Script::new(RELEASE_SCRIPT)))
}

/// The Redis key of lock `name` on every node.
pub fn key_of(name: &str) -> String {
    format!("redlock:{{{name}}}")
}

/// Clock drift allowance for a TTL, as the Redlock page specifies it (the
/// crate's one formula, [`drift_allowance`]).
pub fn drift_of(ttl: Duration) -> Duration {
    drift_allowance(ttl)
}

/// The default per-node timeout for a TTL: `clamp(ttl / 200, 5 ms, 50 ms)`.
pub fn default_node_timeout(ttl: Duration) -> Duration {
    (ttl / 200).clamp(Duration::from_millis(5), Duration::from_millis(50))
}

/// What one node answered.
enum Reply {
    /// The node did what was asked (SET NX stored, script returned 1).
    Yes,
    /// The node answered and refused (key held by someone else, not ours).
    No,
    /// No answer in time: down, frozen, or an error.
    Failed,
}

/// One Redis master and our connection to it.
struct Node {
    /// `host:port`, for logs (never the password).
    label: String,
    client: Client,
    /// The live connection and its generation (to forget only the one that broke).
    conn: Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
    reconnecting: AtomicBool,
}

impl Node {
    /// The live connection, or `None` at once (starting a reconnection in the
    /// background) when there is none: a down node costs nothing.
    fn connection(self: &Arc<Self>) -> Option<(u64, MultiplexedConnection)> {
        let conn = self.conn.lock().expect("node mutex").clone();
        if conn.is_none() {
            self.reconnect_in_background();
        }
        conn
    }

    /// A request failed: drop the connection if it is broken (not for a mere
    /// timeout: a frozen node keeps its socket and answers when it wakes).
    fn failed(self: &Arc<Self>, generation: u64, e: &redis::RedisError) {
        tracing::debug!(node = %self.label, "request failed: {e}");
        if !e.is_unrecoverable_error() {
            return;
        }
        let mut conn = self.conn.lock().expect("node mutex");
        if conn.as_ref().is_some_and(|(g, _)| *g == generation) {
            *conn = None;
            drop(conn);
            tracing::info!(node = %self.label, "redlock node connection lost, reconnecting");
            self.reconnect_in_background();
        }
    }

    async fn try_connect(&self) -> Result<(), String> {
        let config = AsyncConnectionConfig::new().set_connection_timeout(CONNECT_TIMEOUT);
        let attempt = self
            .client
            .get_multiplexed_async_connection_with_config(&config);
        match tokio::time::timeout(CONNECT_TIMEOUT * 2, attempt).await {
            Ok(Ok(c)) => {
                let generation = self.generation.fetch_add(1, Ordering::Relaxed);
                *self.conn.lock().expect("node mutex") = Some((generation, c));
                Ok(())
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no connection within {:?}", CONNECT_TIMEOUT * 2)),
        }
    }

    /// Keep trying to connect until it works or the Redlock is dropped.
    fn reconnect_in_background(self: &Arc<Self>) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Node> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(node) = weak.upgrade() else { return };
                match node.try_connect().await {
                    Ok(()) => {
                        tracing::info!(node = %node.label, "redlock node connected");
                        node.reconnecting.store(false, Ordering::Release);
                        return;
                    }
                    Err(e) => tracing::debug!(node = %node.label, "redlock node still down: {e}"),
                }
                drop(node);
                tokio::time::sleep(RECONNECT_DELAY).await;
            }
        });
    }

    /// `SET key owner NX PX ttl`. No deadline here: [`gather`] applies one
    /// deadline to the whole round.
    async fn set_nx(self: &Arc<Self>, key: &str, owner: &str, ttl_ms: u64) -> Reply {
        let Some((generation, mut conn)) = self.connection() else {
            return Reply::Failed;
        };
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(owner).arg("NX").arg("PX").arg(ttl_ms);
        match cmd.query_async::<Value>(&mut conn).await {
            Ok(Value::Okay) => Reply::Yes,
            Ok(Value::Nil) => Reply::No,
            Ok(other) => {
                tracing::warn!(node = %self.label, "unexpected SET reply {other:?}");
                Reply::Failed
            }
            Err(e) => {
                self.failed(generation, &e);
                Reply::Failed
            }
        }
    }

    /// A compare-owner script: 1 is yes. No deadline here, as for `set_nx`.
    async fn script(self: &Arc<Self>, script: &Script, key: &str, args: &[&str]) -> Reply {
        let Some((generation, mut conn)) = self.connection() else {
            return Reply::Failed;
        };
        let mut inv = script.key(key);
        for a in args {
            inv.arg(*a);
        }
        match inv.invoke_async::<i64>(&mut conn).await {
            Ok(1) => Reply::Yes,
            Ok(_) => Reply::No,
            Err(e) => {
                self.failed(generation, &e);
                Reply::Failed
            }
        }
    }

    async fn get(self: &Arc<Self>, key: &str, t: Duration) -> Option<String> {
        let (generation, mut conn) = self.connection()?;
        let get = redis::cmd("GET").arg(key).to_owned();
        match tokio::time::timeout(t, get.query_async::<Option<String>>(&mut conn)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                self.failed(generation, &e);
                None
            }
            Err(_) => None,
        }
    }
}

/// The nodes and what every request to them needs. Shared by the service and
/// its grants.
struct Cluster {
    nodes: Vec<Arc<Node>>,
    /// `None`: derived from each request's TTL ([`default_node_timeout`]).
    node_timeout: Option<Duration>,
}

impl Cluster {
    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| default_node_timeout(ttl))
    }

    /// Whether a round can stop: a majority said yes, or so many said no or
    /// failed that no majority is possible any more.
    fn decided(&self, t: &Tally) -> bool {
        t.yes >= self.quorum() || t.no + t.failed > self.nodes.len() - self.quorum()
    }

    /// Release on every node at once; how many deleted our key.
    async fn release_all(&self, key: &str, owner: &str, t: Duration) -> usize {
        let release = &scripts().1;
        let args = [owner];
        let requests = self.nodes.iter().map(|n| n.script(release, key, &args));
        gather(requests, t, |_| false).await.yes
    }
}

/// Replies of one round to all nodes.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    yes: usize,
    no: usize,
    /// Errors, no connection, or no answer within the per-node timeout.
    failed: usize,
    /// Not answered yet when the outcome was already decided.
    pending: usize,
}

/// Send every request at once and count replies as they arrive, until
/// `decided` says the outcome is known, every node answered, or the per-node
/// timeout `t` passes (one deadline for the round: the requests all left at
/// the same moment). Requests still in flight are not withdrawn: they reach
/// their node anyway, which is why a failed round releases on every node.
async fn gather<F>(
    requests: impl IntoIterator<Item = F>,
    t: Duration,
    decided: impl Fn(&Tally) -> bool,
) -> Tally
where
    F: std::future::Future<Output = Reply>,
{
    let mut pending: FuturesUnordered<F> = requests.into_iter().collect();
    let total = pending.len();
    let mut tally = Tally::default();
    let deadline = tokio::time::sleep(t);
    tokio::pin!(deadline);
    loop {
        if decided(&tally) {
            tally.pending = total - tally.yes - tally.no - tally.failed;
            return tally;
        }
        tokio::select! {
            biased;
            reply = pending.next() => match reply {
                Some(Reply::Yes) => tally.yes += 1,
                Some(Reply::No) => tally.no += 1,
                Some(Reply::Failed) => tally.failed += 1,
                None => return tally,
            },
            _ = &mut deadline => {
                tally.failed = total - tally.yes - tally.no;
                return tally;
            }
        }
    }
}

/// Redlock over N independent Redis masters. Cheap to share behind an `Arc`.
pub struct Redlock {
    cluster: Arc<Cluster>,
    /// Random prefix of every owner value this instance writes (unique even
    /// when two processes share a client id).
    instance: String,
    /// Who this client is ([`LockService::client_id`]); no fair variant.
    settings: Settings,
    sequence: AtomicU64,
}

impl Configurable for Redlock {
    fn settings_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }
}

impl Redlock {
    /// Connect to N ≥ 3 independent masters (5 is the usual deployment).
    ///
    /// Fewer than 3 URLs or a URL that does not parse: `InvalidConfig`. Nodes
    /// that do not answer are logged and reconnected in the background; fewer
    /// than a majority answering: `Unavailable`.
    pub async fn connect(urls: &[String]) -> Result<Self, LockError> {
        if urls.len() < 3 {
            return Err(LockError::InvalidConfig(format!(
                "redlock needs at least 3 independent redis nodes, got {}",
                urls.len()
            )));
        }
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            let client = Client::open(url.as_str()).map_err(|e| {
                LockError::InvalidConfig(format!(
                    "redlock node url {:?}: {e}",
                    crate::redact_url(url)
                ))
            })?;
            let addr = client.get_connection_info().addr.to_string();
            nodes.push(Arc::new(Node {
                label: addr,
                client,
                conn: Mutex::new(None),
                generation: AtomicU64::new(0),
                reconnecting: AtomicBool::new(false),
            }));
        }
        let results = join_all(nodes.iter().map(|n| n.try_connect())).await;
        let mut down = Vec::new();
        for (node, result) in nodes.iter().zip(results) {
            if let Err(e) = result {
                tracing::warn!(node = %node.label, "redlock node unreachable at connect: {e}");
                down.push(format!("{}: {e}", node.label));
                node.reconnect_in_background();
            }
        }
        let quorum = nodes.len() / 2 + 1;
        let up = nodes.len() - down.len();
        if up < quorum {
            return Err(LockError::unavailable(
                ISSUER,
                format!(
                    "only {up} of {} redlock nodes reachable, a majority is {quorum}: {}",
                    nodes.len(),
                    down.join("; ")
                ),
            ));
        }
        Ok(Self {
            cluster: Arc::new(Cluster {
                nodes,
                node_timeout: None,
            }),
            instance: uuid::Uuid::new_v4().simple().to_string(),
            settings: Settings::default(),
            sequence: AtomicU64::new(0),
        })
    }

    /// Fix the per-node timeout instead of deriving it from each TTL. It must
    /// be far below the TTLs used: acquisitions whose TTL is not at least
    /// twice this timeout are refused with `InvalidConfig`.
    pub fn with_node_timeout(mut self, timeout: Duration) -> Result<Self, LockError> {
        if timeout.is_zero() {
            return Err(LockError::InvalidConfig(
                "redlock node timeout is zero".into(),
            ));
        }
        let cluster = Arc::get_mut(&mut self.cluster).ok_or_else(|| {
            LockError::InvalidConfig("node timeout must be set before the first grant".into())
        })?;
        cluster.node_timeout = Some(timeout);
        Ok(self)
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.cluster.nodes.len()
    }

    /// How many nodes must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.cluster.quorum()
    }

    /// The per-node timeout used for requests with this TTL.
    pub fn node_timeout(&self, ttl: Duration) -> Duration {
        self.cluster.node_timeout(ttl)
    }

    /// Set the client id reported by [`LockService::client_id`]. Redlock
    /// keeps no record a storage could check it against (no token), so it
    /// only names this client in logs.
    pub fn with_client_id(self, id: impl Into<String>) -> Result<Self, LockError> {
        self.set_client_id(id)
    }

    /// Every owner value this instance writes starts with `"<instance_id>:"`.
    pub fn instance_id(&self) -> &str {
        &self.instance
    }

    /// Whether an owner value (from [`Redlock::holders_on_nodes`]) was written
    /// by this instance.
    pub fn owns(&self, owner: &str) -> bool {
        owner
            .strip_prefix(self.instance.as_str())
            .is_some_and(|rest| rest.starts_with(':'))
    }

    /// For demonstrations and chaos tests: the owner value of lock `name` on
    /// each node, in the order of the URLs. `None` when the key is absent or
    /// the node did not answer within 250 ms.
    pub async fn holders_on_nodes(&self, name: &str) -> Vec<Option<String>> {
        let key = key_of(name);
        join_all(
            self.cluster
                .nodes
                .iter()
                .map(|n| n.get(&key, QUERY_TIMEOUT)),
        )
        .await
    }

    /// One round of the algorithm. `Ok(None)`: not granted (and cleaned up).
    /// The flag records whether a majority answered at all.
    async fn try_once(
        &self,
        name: &str,
        opts: AcquireOptions,
        majority_answered: &AtomicBool,
    ) -> Result<Option<Lease>, LockError> {
        let cluster = &self.cluster;
        let key = key_of(name);
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        let owner = format!("{}:{seq}", self.instance);
        let ttl_ms = opts.ttl.as_millis() as u64;
        let t = cluster.node_timeout(opts.ttl);
        let drift = drift_of(opts.ttl);

        let start = Instant::now();
        let requests = cluster.nodes.iter().map(|n| n.set_nx(&key, &owner, ttl_ms));
        let tally = gather(requests, t, |t| cluster.decided(t)).await;
        let elapsed = start.elapsed();
        let Tally {
            yes,
            no,
            failed,
            pending,
        } = tally;
        // Reachable: everyone but the nodes that failed.
        majority_answered.store(
            cluster.nodes.len() - failed >= cluster.quorum(),
            Ordering::Relaxed,
        );

        if yes >= cluster.quorum() && elapsed + drift < opts.ttl {
            tracing::debug!(lock = %name, yes, no, failed, pending, ?elapsed, "redlock granted");
            let grant = RedlockGrant {
                cluster: cluster.clone(),
                name: name.to_string(),
                key,
                owner,
                node_timeout: t,
            };
            return Ok(Some(Lease::new(NewLease {
                name: name.to_string(),
                issuer: ISSUER.to_string(),
                client_id: self.settings.client_id().to_string(),
                fencing: Fencing::Unfenced {
                    reason: UNFENCED_REASON,
                },
                ttl: opts.ttl,
                requested_at: start,
                // Every key expires no earlier than start + ttl (on the
                // node's clock); the drift covers clocks running apart.
                validity: Some(opts.ttl - drift),
                auto_renew: opts.auto_renew,
                grant: Arc::new(grant),
                lost_trigger: None,
            })));
        }
        tracing::debug!(lock = %name, yes, no, failed, pending, ?elapsed, "redlock not granted, releasing");
        // Including the nodes that failed: a timed-out SET may still land.
        cluster.release_all(&key, &owner, t).await;
        Ok(None)
    }
}

impl LockService for Redlock {
    fn issuer(&self) -> &str {
        ISSUER
    }

    fn client_id(&self) -> &str {
        self.settings.client_id()
    }

    fn acquire_with<'a>(
        &'a self,
        name: &'a str,
        opts: AcquireOptions,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        async move {
            opts.validate(name)?;
            let t = self.cluster.node_timeout(opts.ttl);
            if opts.ttl < t * 2 {
                return Err(LockError::InvalidConfig(format!(
                    "redlock ttl {:?} is not far above the per-node timeout {t:?}",
                    opts.ttl
                )));
            }
            let majority_answered = AtomicBool::new(true);
            let result = poll_until_granted(name, opts.wait, || {
                self.try_once(name, opts, &majority_answered)
            })
            .await;
            match result {
                Err(LockError::Timeout { waited, .. })
                    if !majority_answered.load(Ordering::Relaxed) =>
                {
                    Err(LockError::unavailable(
                        ISSUER,
                        format!(
                            "fewer than {} of {} nodes answered within {t:?} (waited {waited:?})",
                            self.quorum(),
                            self.nodes()
                        ),
                    ))
                }
                other => other,
            }
        }
        .boxed()
    }
}

/// One Redlock grant: the key and owner value on every node.
struct RedlockGrant {
    cluster: Arc<Cluster>,
    name: String,
    key: String,
    owner: String,
    /// The per-node timeout of the acquisition, reused for the release.
    node_timeout: Duration,
}

impl Grant for RedlockGrant {
    fn renew(&self, ttl: Duration) -> BoxFuture<'_, Result<Duration, LockError>> {
        async move {
            let cluster = &self.cluster;
            let t = cluster.node_timeout(ttl);
            let drift = drift_of(ttl);
            let ttl_ms = (ttl.as_millis() as u64).to_string();
            let extend = &scripts().0;
            let args = [self.owner.as_str(), ttl_ms.as_str()];
            let first = Instant::now();
            let mut last = String::new();
            for attempt in 1..=EXTEND_ATTEMPTS {
                let start = if attempt == 1 { first } else { Instant::now() };
                let requests = cluster.nodes.iter().map(|n| n.script(extend, &self.key, &args));
                let Tally {
                    yes, no, failed, ..
                } = gather(requests, t, |t| cluster.decided(t)).await;
                let elapsed = start.elapsed();
                if yes >= cluster.quorum() && elapsed + drift < ttl {
                    // Valid until start + ttl − drift; counted from the first attempt.
                    return Ok((start - first) + ttl - drift);
                }
                if no > cluster.nodes.len() - cluster.quorum() {
                    // A majority answered "not yours": no retry can change that.
                    return Err(LockError::NotHeld {
                        name: self.name.clone(),
                        reason: format!(
                            "extension refused by {no} of {} nodes (the key expired or has another owner)",
                            cluster.nodes.len()
                        ),
                    });
                }
                last = format!("attempt {attempt}: {yes} extended, {no} refused, {failed} no answer, in {elapsed:?}");
                tracing::debug!(lock = %self.name, "redlock extension failed: {last}");
                if attempt < EXTEND_ATTEMPTS {
                    let pause = t.mul_f64(rand::rng().random_range(0.5..1.5));
                    tokio::time::sleep(pause).await;
                }
            }
            // Not refused, not confirmed: transient. The lease's own deadline
            // fires its lost signal if no later extension succeeds in time.
            Err(LockError::unavailable(
                ISSUER,
                format!("no majority extended after {EXTEND_ATTEMPTS} attempts ({last})"),
            ))
        }
        .boxed()
    }

    fn release(&self) -> BoxFuture<'_, Result<(), LockError>> {
        async move {
            let t = self.node_timeout;
            let deleted = self.cluster.release_all(&self.key, &self.owner, t).await;
            tracing::debug!(lock = %self.name, deleted, "redlock released");
            Ok(())
        }
        .boxed()
    }
}
