//! Every fencing token is checked with the lock service that issued it. Real Redis, ZooKeeper, PostgreSQL and MariaDB; locks taken with
//! `fencelock` under each client's id, as the worker takes them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{gateway_with, keyed, Api, Reply};
use fencelock::lease_table::{self, Install, LeaseTable};
use fencelock::redis::RedisLock;
use fencelock::zookeeper::{escape_name, ZooKeeperLock, LOCKS_ROOT};
use fencelock::{Backend, Lease, LockService};
use gateway::FenceCheck;
use harness::zookeeper::SecuredZooKeeper;
use rand::Rng;
use serde_json::json;

const PAGE: &str = "shared";
const LOCK: &str = "page:shared";
const TTL: Duration = Duration::from_secs(15);
/// Generous: the machine is shared; the rejection tests set their own.
const ISSUER_TIMEOUT: Duration = Duration::from_secs(5);
/// The backends that mint tokens, as the worker takes their locks.
const ISSUERS: [Backend; 4] = [
    Backend::Redis,
    Backend::Zookeeper,
    Backend::LeasePostgres,
    Backend::LeaseMysql,
];

/// A running lock service, and how the gateway and the clients reach it.
struct Issuer {
    backend: Backend,
    url: String,
    redis: Option<harness::Redis>,
    zookeeper: Option<harness::ZooKeeper>,
}

impl Issuer {
    async fn start(backend: Backend) -> Issuer {
        let mut issuer = Issuer {
            backend,
            url: String::new(),
            redis: None,
            zookeeper: None,
        };
        match backend {
            Backend::Redis => {
                let redis = harness::Redis::start().await;
                issuer.url = redis.url();
                issuer.redis = Some(redis);
            }
            Backend::Zookeeper => {
                let zk = harness::ZooKeeper::start().await;
                issuer.url = format!("zookeeper://{}", zk.connect_string());
                issuer.zookeeper = Some(zk);
            }
            // Installed first, as `gateway setup` does: the gateway only
            // reads the lease table.
            Backend::LeasePostgres => {
                issuer.url = harness::fresh_database().await;
                lease_table::install_postgres(&issuer.url, &Install::new())
                    .await
                    .unwrap();
            }
            Backend::LeaseMysql => {
                issuer.url = harness::fresh_mysql_database().await;
                lease_table::install_mysql(&issuer.url, &Install::new())
                    .await
                    .unwrap();
            }
            other => panic!("{other} is not an issuer of these tests"),
        }
        issuer
    }

    /// The `Fencing-Issuer` its leases carry, which the gateway is told.
    fn name(&self) -> &'static str {
        self.backend.name()
    }

    /// A lock service for `client` (every grant records that client id),
    /// fair (the worker's default) or not (its `--fair false`).
    async fn locks(&self, client: &str, fair: bool) -> Arc<dyn LockService> {
        /// The variant asked for, of a connected lock service.
        macro_rules! variant {
            ($connect:expr) => {{
                let locks = $connect.await.unwrap().with_client_id(client).unwrap();
                Arc::new(if fair { locks } else { locks.non_fair() })
            }};
        }
        match self.backend {
            Backend::Redis => variant!(RedisLock::connect(&self.url)),
            Backend::Zookeeper => variant!(ZooKeeperLock::connect(
                self.url.trim_start_matches("zookeeper://"),
                Duration::from_secs(10),
            )),
            Backend::LeasePostgres => variant!(LeaseTable::postgres(&self.url)),
            Backend::LeaseMysql => variant!(LeaseTable::mysql(&self.url)),
            other => panic!("{other} is not an issuer of these tests"),
        }
    }

    /// Fencing enforced, with this issuer timeout.
    fn enforcing(&self, issuer_timeout: Duration) -> gateway::GatewayOptions {
        self.options(FenceCheck::Enforce)
            .issuer_timeout(issuer_timeout)
    }

    fn options(&self, fencing: FenceCheck) -> gateway::GatewayOptions {
        keyed(fencing)
            .issuer(self.name(), &self.url)
            .issuer_timeout(ISSUER_TIMEOUT)
    }
}

async fn acquire(locks: &Arc<dyn LockService>) -> Lease {
    locks
        .acquire(LOCK, TTL, Duration::from_secs(60))
        .await
        .expect("acquire the page's lock")
}

/// A token offered to the gateway on [`PAGE`]: `Fencing-Token`,
/// `Fencing-Issuer`, and `Client-Id` when the sender poses as someone.
#[derive(Clone)]
struct Offer {
    token: u64,
    issuer: String,
    client_id: Option<String>,
}

impl Offer {
    /// A token of `issuer`, whether anybody holds it or not.
    fn new(issuer: &str, token: u64) -> Offer {
        Offer {
            token,
            issuer: issuer.to_owned(),
            client_id: None,
        }
    }

    /// The lease's own token.
    fn of(lease: &Lease) -> Offer {
        Offer::new(lease.issuer(), lease.token().unwrap().get())
    }

    /// PUT `body` with this token.
    async fn put(&self, client: &Api, body: &str) -> Reply {
        self.send(client, PAGE, Some(body)).await
    }

    /// A fenced GET of `page` with this token.
    async fn get(&self, client: &Api, page: &str) -> Reply {
        self.send(client, page, None).await
    }

    async fn send(&self, client: &Api, page: &str, body: Option<&str>) -> Reply {
        let token = self.token.to_string();
        let mut headers = vec![
            ("Fencing-Token", token.as_str()),
            ("Fencing-Issuer", self.issuer.as_str()),
        ];
        if let Some(who) = &self.client_id {
            headers.push(("Client-Id", who));
        }
        match body {
            Some(body) => client.put(page, body, &headers).await,
            None => client.get(page, &headers).await,
        }
    }
}

/// PUT `body` on [`PAGE`] until the gateway reaches the issuer (bounded):
/// the first answer that is not 503.
async fn put_once_the_issuer_answers(client: &Api, body: &str, offer: &Offer) -> Reply {
    harness::wait_until(Duration::from_secs(30), || async {
        let reply = offer.put(client, body).await;
        match reply.status.as_u16() {
            503 => Err(format!("still {}", reply.json)),
            _ => Ok(reply),
        }
    })
    .await
    .expect("the gateway reaches the issuer once it is up")
}

#[track_caller]
fn assert_not_current(reply: Reply, offered: u64, holder: Option<u64>) {
    let reply = reply.expect_error(409, "token_not_current");
    assert_eq!(reply.json["offered_token"], offered, "{}", reply.json);
    assert_eq!(reply.json["holder_token"], json!(holder), "{}", reply.json);
}

// ---- every lock variant the worker can run ----

/// The worker holds the fair lock (its default) or the non-fair one
/// (`--fair false`); Redis keeps either holder in one hash, the lease tables
/// in one row, ZooKeeper in two different places. The issuer check names the
/// holder of each: its write lands, and its token stops counting at release.
#[tokio::test]
async fn fair_and_non_fair_holders_of_every_issuer_write_and_their_tokens_end_at_release() {
    for backend in ISSUERS {
        let issuer = Issuer::start(backend).await;
        let (_gw, api, _) = gateway_with(issuer.options(FenceCheck::Enforce)).await;
        let alice = api.as_client("alice");
        for (fair, status) in [(true, 201), (false, 200)] {
            let lease = acquire(&issuer.locks("alice", fair).await).await;
            let t = lease.token().unwrap().get();
            Offer::of(&lease)
                .put(&alice, &format!("{backend}, fair {fair}"))
                .await
                .expect(status);
            lease.release().await.unwrap();
            assert_not_current(
                Offer::new(issuer.name(), t).put(&alice, "late").await,
                t,
                None,
            );
        }
    }
}

// ---- the rejections, each with nothing written ----

#[tokio::test]
async fn every_token_the_issuer_did_not_grant_to_this_client_is_refused_and_writes_nothing() {
    let issuer = Issuer::start(Backend::Redis).await;
    let (_gw, api, _) = gateway_with(issuer.options(FenceCheck::Enforce)).await;
    let alice = api.as_client("alice");
    let bob = api.as_client("bob");

    let lease = acquire(&issuer.locks("alice", true).await).await;
    let t = lease.token().unwrap().get();
    Offer::of(&lease).put(&alice, "by alice").await.expect(201);
    let (page, mut history) = api.snapshot(PAGE).await;

    // Not an issuer of this gateway (also the default issuer): no history row.
    let token = t.to_string();
    for h in [
        vec![
            ("Fencing-Token", token.as_str()),
            ("Fencing-Issuer", "zookeeper"),
        ],
        vec![("Fencing-Token", token.as_str())],
    ] {
        let r = alice
            .put(PAGE, "x", &h)
            .await
            .expect_error(409, "unknown_issuer");
        assert_eq!(r.json["known"], json!(["redis"]), "{}", r.json);
        assert_eq!(api.snapshot(PAGE).await, (page.clone(), history.clone()));
    }

    // From the future (higher than the page's fence, so the fence alone
    // would take it), guessed, copied by another client, as a PUT and as a
    // fenced GET: each leaves one history row and nothing else.
    let cases: Vec<(&str, &Api, &str, u64, &str)> = vec![
        ("future", &alice, "PUT", t + 1000, "alice"),
        (
            "future, the largest token",
            &alice,
            "PUT",
            i64::MAX as u64,
            "alice",
        ),
        ("guessed", &bob, "PUT", t - 1, "bob"),
        ("copied", &bob, "PUT", t, "bob"),
        ("copied, fenced read", &bob, "GET", t, "bob"),
        ("future, fenced read", &alice, "GET", t + 1, "alice"),
    ];
    for (what, client, method, token, who) in cases {
        let offer = Offer::new("redis", token);
        let reply = match method {
            "PUT" => offer.put(client, "forged").await,
            _ => offer.get(client, PAGE).await,
        };
        assert_not_current(reply, token, Some(t));
        let (now_page, now_history) = api.snapshot(PAGE).await;
        assert_eq!(now_page, page, "{what}: the page changed");
        assert_eq!(now_history.len(), history.len() + 1, "{what}");
        let row = &now_history[0];
        assert_eq!(
            (
                row["outcome"].clone(),
                row["method"].clone(),
                row["token"].clone()
            ),
            (json!("token_not_current"), json!(method), json!(token)),
            "{what}: {row}"
        );
        assert_eq!(row["client_id"], who, "{what}: {row}");
        assert_eq!(row["fence_token"], t, "{what}: the fence moved: {row}");
        assert_eq!(row["version"], 1, "{what}: {row}");
        history = now_history;
    }

    // A fenced read of a page nobody wrote, with a forged token, fences nothing.
    assert_not_current(
        Offer::new("redis", 1 << 40).get(&bob, "unwritten").await,
        1 << 40,
        None,
    );
    assert_eq!(api.fence("unwritten").await, json!(null));

    // Released: the token is no longer current, even for its own client.
    lease.release().await.unwrap();
    assert_not_current(Offer::new("redis", t).put(&alice, "late").await, t, None);
    assert_eq!(api.snapshot(PAGE).await.0, page);
}

#[tokio::test]
async fn an_issuer_down_at_start_answers_503_then_the_gateway_recovers_by_itself() {
    let mut issuer = Issuer::start(Backend::Redis).await;
    issuer.redis.as_mut().unwrap().kill();
    // The gateway starts while its issuer is down.
    let (_gw, api, _) = gateway_with(issuer.enforcing(Duration::from_millis(500))).await;
    let alice = api.as_client("alice");
    let offer = Offer::new("redis", 1);
    let r = offer
        .put(&alice, "unchecked")
        .await
        .expect_error(503, "issuer_unavailable");
    assert_eq!(r.json["issuer"], "redis");
    offer
        .get(&alice, PAGE)
        .await
        .expect_error(503, "issuer_unavailable");
    assert_eq!(
        api.snapshot(PAGE).await,
        (None, vec![]),
        "a 503 wrote something"
    );
    // Unfenced reads and the rest do not depend on the issuer.
    api.get_path("/readyz").await.expect(200);

    issuer.redis.as_mut().unwrap().start_again().await;
    let lease = acquire(&issuer.locks("alice", true).await).await;
    let offer = Offer::of(&lease);
    put_once_the_issuer_answers(&alice, "checked", &offer)
        .await
        .expect(201);

    // Slower than the issuer timeout (the server frozen): 503, in bounded time.
    issuer.redis.as_mut().unwrap().process().pause();
    let started = std::time::Instant::now();
    offer
        .put(&alice, "while frozen")
        .await
        .expect_error(503, "issuer_unavailable");
    let waited = started.elapsed();
    issuer.redis.as_mut().unwrap().process().resume();
    assert!(waited < Duration::from_secs(5), "took {waited:?}");
    assert_eq!(api.get(PAGE, &[]).await.expect(200).json["body"], "checked");
    offer.put(&alice, "after").await.expect(200);
}

#[tokio::test]
async fn a_zookeeper_restart_answers_503_while_it_is_down_and_the_gateway_recovers_by_itself() {
    let mut issuer = Issuer::start(Backend::Zookeeper).await;
    let (_gw, api, _) = gateway_with(issuer.enforcing(Duration::from_secs(1))).await;
    let alice = api.as_client("alice");
    let lease = acquire(&issuer.locks("alice", true).await).await;
    Offer::of(&lease).put(&alice, "before").await.expect(201);

    let zk = issuer.zookeeper.as_mut().unwrap();
    zk.kill();
    Offer::of(&lease)
        .put(&alice, "during")
        .await
        .expect_error(503, "issuer_unavailable");
    assert_eq!(api.get(PAGE, &[]).await.expect(200).json["body"], "before");

    zk.start_again().await;
    drop(lease);
    let lease = acquire(&issuer.locks("alice", true).await).await;
    put_once_the_issuer_answers(&alice, "after", &Offer::of(&lease))
        .await
        .expect(200);
    lease.release().await.unwrap();
}

#[tokio::test]
async fn with_fencing_off_no_issuer_is_asked() {
    // An issuer nobody listens on: with fencing on it could only answer 503.
    let dead = format!("redis://127.0.0.1:{}/", harness::free_port());
    let (_gw, api, _) = gateway_with(keyed(FenceCheck::Off).issuer("redis", &dead)).await;
    api.put_issued(PAGE, "x", 5, "redis").await.expect(201);
    // Not even the issuer's name is looked at: fencing off checks nothing.
    api.put_issued(PAGE, "y", 5, "elsewhere").await.expect(200);
    let (_gw2, api2, _) = gateway_with(
        keyed(FenceCheck::Enforce)
            .issuer("redis", &dead)
            .issuer_timeout(Duration::from_millis(200)),
    )
    .await;
    api2.put_issued(PAGE, "x", 5, "redis")
        .await
        .expect_error(503, "issuer_unavailable");
}

// ---- ZooKeeper: planted nodes, and the gateway's own user ----

/// Data naming `client` as the holder, as the recipe writes it.
fn claiming(client: &str) -> Vec<u8> {
    format!("00000000-0000-0000-0000-000000000000\n{client}").into_bytes()
}

/// Nodes planted in the page lock's queue by a client with every right
/// (anyone, on a server without ACLs): a persistent node at the non-fair
/// lock's path naming alice, which was taken as her holder forever; one
/// named to head the queue; and, once alice holds, an ephemeral node named
/// to sort before hers. None of their czxids is a token the gateway takes,
/// and alice's real one is.
#[tokio::test]
async fn planted_zookeeper_nodes_are_no_holders_and_their_czxids_are_refused() {
    let issuer = Issuer::start(Backend::Zookeeper).await;
    let (_gw, api, _) = gateway_with(issuer.options(FenceCheck::Enforce)).await;
    let alice = api.as_client("alice");
    let planter = zookeeper_client::Client::connect(issuer.url.trim_start_matches("zookeeper://"))
        .await
        .unwrap();
    let parent = format!("{LOCKS_ROOT}/{}", escape_name(LOCK).unwrap());
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    planter.mkdir(&parent, &persistent).await.unwrap();
    let first_by_name =
        |kind: &str| format!("{parent}/_c_00000000-0000-0000-0000-000000000000-{kind}--2147483648");
    let mut planted = Vec::new();
    for path in [format!("{parent}/lock"), first_by_name("lock")] {
        let (stat, _) = planter
            .create(&path, &claiming("alice"), &persistent)
            .await
            .unwrap();
        planted.push(stat.czxid as u64);
    }
    for &czxid in &planted {
        let offer = Offer::new("zookeeper", czxid);
        let reply = put_once_the_issuer_answers(&alice, "planted", &offer).await;
        assert_not_current(reply, czxid, None);
    }
    assert_eq!(
        api.fence(PAGE).await,
        json!(null),
        "a planted node moved the fence"
    );

    // Alice's real lock is granted at once past them, and only its token writes.
    let lease = acquire(&issuer.locks("alice", true).await).await;
    let t = lease.token().unwrap().get();
    let ephemeral =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    let (stat, _) = planter
        .create(&first_by_name("write"), &claiming("alice"), &ephemeral)
        .await
        .unwrap();
    planted.push(stat.czxid as u64);
    for &czxid in &planted {
        assert_not_current(
            Offer::new("zookeeper", czxid).put(&alice, "planted").await,
            czxid,
            Some(t),
        );
    }
    Offer::of(&lease).put(&alice, "alice's").await.expect(201);
    assert_eq!(api.fence(PAGE).await["token"], t);
    lease.release().await.unwrap();
}

/// On a ZooKeeper whose lock nodes only named users may read, the gateway
/// reads as its own (`zookeeper://gateway:PW@hosts/`), and a lock client
/// with credentials writes through it; without that user it cannot read
/// who holds the lock (ZooKeeper refuses: NoAuth), so it writes nothing.
#[tokio::test]
async fn the_gateway_reads_a_secured_zookeeper_as_its_own_user() {
    let zk = SecuredZooKeeper::start().await;
    let cs = zk.connect_string();
    let locks = ZooKeeperLock::connect_with(&cs, TTL, &zk.lock_client_access("worker-1"))
        .await
        .unwrap()
        .with_client_id("alice")
        .unwrap();
    let lease = locks.acquire(LOCK, TTL, Duration::ZERO).await.unwrap();
    let offer = Offer::of(&lease);

    let anonymous = keyed(FenceCheck::Enforce)
        .issuer("zookeeper", &format!("zookeeper://{cs}/"))
        .issuer_timeout(Duration::from_secs(2));
    let (_anon, anon_api, _) = gateway_with(anonymous).await;
    for _ in 0..3 {
        offer
            .put(&anon_api.as_client("alice"), "unchecked")
            .await
            .expect_error(503, "issuer_unavailable");
    }
    assert_eq!(anon_api.snapshot(PAGE).await, (None, vec![]));

    // The password percent-encoded, as a URL may carry it.
    let url = format!("zookeeper://gateway:gateway%2Dsecret@{cs}/");
    let (_gw, api, _) = gateway_with(keyed(FenceCheck::Enforce).issuer("zookeeper", &url)).await;
    put_once_the_issuer_answers(&api.as_client("alice"), "checked", &offer)
        .await
        .expect(201);
    lease.release().await.unwrap();
}

// ---- the headline: two keyed workers and a forger on one page ----

/// What the forger sent, and what came back.
struct Forgery {
    what: &'static str,
    reply: Reply,
}

async fn workers_edit_while_a_forger_sends_forged_guessed_and_copied_tokens(backend: Backend) {
    const EDITS: usize = 5;
    let issuer = Arc::new(Issuer::start(backend).await);
    let (gw, api, _) = gateway_with(issuer.options(FenceCheck::Enforce)).await;
    // The current holder, as the forger learns it (say, by sniffing).
    let holder: Arc<Mutex<Option<(String, u64)>>> = Arc::default();
    let granted: Arc<Mutex<Vec<u64>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));

    let mut workers = Vec::new();
    for name in ["worker-1", "worker-2"] {
        let (issuer, api, holder, granted) = (
            issuer.clone(),
            api.as_client(name),
            holder.clone(),
            granted.clone(),
        );
        workers.push(tokio::spawn(async move {
            let locks = issuer.locks(name, true).await;
            let mut acknowledged = Vec::new();
            for n in 0..EDITS {
                let lease = acquire(&locks).await;
                let token = lease.token().unwrap().get();
                granted.lock().unwrap().push(token);
                *holder.lock().unwrap() = Some((name.to_owned(), token));
                let offer = Offer::of(&lease);
                let read = offer.get(&api, PAGE).await;
                let body = match read.status.as_u16() {
                    200 => read.json["body"].as_str().unwrap().to_owned(),
                    404 => String::new(),
                    s => panic!("{name}'s fenced read: {s} {}", read.json),
                };
                let line = format!("{name} #{n} token={token}\n");
                let reply = offer.put(&api, &format!("{body}{line}")).await;
                assert!(
                    reply.status.is_success(),
                    "{name}'s edit with its own current token was refused: {} {}",
                    reply.status,
                    reply.json
                );
                acknowledged.push(line);
                lease.release().await.expect("released while held");
            }
            acknowledged
        }));
    }

    let forger = {
        let (mallory, holder, granted, done, issuer_name) = (
            api.as_client("mallory"),
            holder.clone(),
            granted.clone(),
            done.clone(),
            issuer.name(),
        );
        tokio::spawn(async move {
            let mut sent = Vec::new();
            let mut round = 0_u64;
            while !done.load(Ordering::SeqCst) || sent.len() < 24 {
                round += 1;
                let max = granted.lock().unwrap().iter().copied().max().unwrap_or(1);
                let current = holder.lock().unwrap().clone();
                let guess = rand::rng().random_range(0..=max);
                let (what, token, client_id) = match round % 5 {
                    0 => ("future", max + 1 + round, None),
                    1 => ("future, the largest token", i64::MAX as u64, None),
                    2 => ("guessed", guess, None),
                    3 => ("copied", current.as_ref().map_or(max, |c| c.1), None),
                    _ => match current {
                        Some((who, t)) => ("copied, posing as its holder", t, Some(who)),
                        None => ("guessed", guess, None),
                    },
                };
                let offer = Offer {
                    client_id,
                    ..Offer::new(issuer_name, token)
                };
                let reply = if round.is_multiple_of(2) {
                    offer.put(&mallory, "forged by mallory").await
                } else {
                    offer.get(&mallory, PAGE).await
                };
                sent.push(Forgery { what, reply });
            }
            sent
        })
    };

    let mut acknowledged = Vec::new();
    for w in workers {
        acknowledged.extend(w.await.expect("worker"));
    }
    done.store(true, Ordering::SeqCst);
    let forgeries = forger.await.expect("forger");

    // No forgery got through: refused by the issuer check (or, posing as
    // another client, by authentication).
    for f in &forgeries {
        let (status, json) = (f.reply.status.as_u16(), &f.reply.json);
        match (f.what, status, json["error"].as_str()) {
            ("copied, posing as its holder", 403, Some("client_id_mismatch")) => {}
            (_, 409, Some("token_not_current")) => {}
            _ => panic!("{} forgery answered {status}: {json}", f.what),
        }
    }
    let refused_by_issuer = forgeries
        .iter()
        .filter(|f| f.reply.status.as_u16() == 409)
        .count();

    // Every worker edit landed, none was lost, nothing else is in the page.
    let page = api.get(PAGE, &[]).await.expect(200);
    let body = page.json["body"].as_str().unwrap();
    let mut lines: Vec<_> = body.lines().map(|l| format!("{l}\n")).collect();
    lines.sort();
    acknowledged.sort();
    assert_eq!(
        lines, acknowledged,
        "the page is not exactly the acknowledged edits"
    );
    assert_eq!(page.json["version"], (2 * EDITS) as i64);

    // The history: the forger's attempts are all token_not_current rows that
    // left the fence where it was; every accepted token was really granted.
    let granted = granted.lock().unwrap().clone();
    let history = api.history(PAGE).await;
    let by_mallory: Vec<_> = history
        .iter()
        .filter(|h| h["client_id"] == "mallory")
        .collect();
    assert_eq!(by_mallory.len(), refused_by_issuer);
    assert!(by_mallory
        .iter()
        .all(|h| h["outcome"] == "token_not_current"));
    for h in history.iter().filter(|h| h["outcome"] == "accepted") {
        let token = h["token"].as_u64().unwrap();
        assert!(
            granted.contains(&token),
            "accepted a token never granted: {h}"
        );
    }

    // The fence never passed the issuer's counter: it is the last grant, and
    // the issuer's next grant is above it.
    let fence = page.json["fence"]["token"].as_u64().unwrap();
    assert_eq!(fence, granted.iter().copied().max().unwrap());
    assert_eq!(page.json["fence"]["issuer"], issuer.name());
    let next = acquire(&issuer.locks("worker-3", true).await).await;
    assert!(
        next.token().unwrap().get() > fence,
        "issuer's counter {next:?} <= fence {fence}"
    );
    next.release().await.unwrap();
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn redis_forged_guessed_and_copied_tokens_never_write_and_every_worker_edit_lands() {
    workers_edit_while_a_forger_sends_forged_guessed_and_copied_tokens(Backend::Redis).await;
}

#[tokio::test]
async fn zookeeper_forged_guessed_and_copied_tokens_never_write_and_every_worker_edit_lands() {
    workers_edit_while_a_forger_sends_forged_guessed_and_copied_tokens(Backend::Zookeeper).await;
}

#[tokio::test]
async fn lease_postgres_forged_guessed_and_copied_tokens_never_write_and_every_worker_edit_lands() {
    workers_edit_while_a_forger_sends_forged_guessed_and_copied_tokens(Backend::LeasePostgres)
        .await;
}

#[tokio::test]
async fn lease_mysql_forged_guessed_and_copied_tokens_never_write_and_every_worker_edit_lands() {
    workers_edit_while_a_forger_sends_forged_guessed_and_copied_tokens(Backend::LeaseMysql).await;
}
