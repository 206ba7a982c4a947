//! The operator chooses each page's issuer (`GATEWAY_PAGE_ISSUERS`,
//! `GATEWAY_DEFAULT_ISSUER`, or the admin endpoint), never the first client
//! to send a token; and the admin endpoint sets only fences an issuer can
//! reach. Real Redis: two issuer names for the same server, so that a token
//! passes the issuer check under either name and only the page's issuer
//! decides.

use std::time::Duration;

use fencelock::redis::RedisLock;
use fencelock::{Lease, LockService};
use gateway::{FenceCheck, GatewayOptions};
use serde_json::json;

use crate::common::{gateway_with, keyed, outcomes, Api, Reply, ADMIN};

/// A Redis, a gateway that knows it as `redis` and as `other`, pages
/// `tutorial` guarded by `redis` and `demo-*` by `other`, no default.
struct Scene {
    redis: harness::Redis,
    _gw: gateway::RunningGateway,
    api: Api,
}

impl Scene {
    async fn start() -> Scene {
        Scene::with(|o| o).await
    }

    async fn with(more: impl FnOnce(GatewayOptions) -> GatewayOptions) -> Scene {
        let redis = harness::Redis::start().await;
        let options = keyed(FenceCheck::Enforce)
            .issuer("redis", &redis.url())
            .issuer("other", &redis.url())
            .issuer_timeout(Duration::from_secs(5))
            .page_issuer("tutorial", "redis")
            .page_issuer("demo-*", "other");
        let (gw, api, _) = gateway_with(more(options)).await;
        Scene {
            redis,
            _gw: gw,
            api: api.as_client("alice"),
        }
    }

    /// Alice's lease on `page:<page>`.
    async fn lease(&self, page: &str) -> Lease {
        let locks = RedisLock::connect(&self.redis.url())
            .await
            .unwrap()
            .with_client_id("alice")
            .unwrap();
        locks
            .acquire(
                &format!("page:{page}"),
                Duration::from_secs(30),
                Duration::from_secs(10),
            )
            .await
            .unwrap()
    }

    /// A PUT of `page` with the lease's token, sent as a token of `issuer`.
    async fn put(&self, lease: &Lease, issuer: &str, page: &str) -> Reply {
        self.send(lease, issuer, page, Some("by alice")).await
    }

    /// That PUT is refused: the page is `current`'s.
    async fn mismatch(&self, lease: &Lease, offered: &str, page: &str, current: &str) {
        assert_mismatch(self.put(lease, offered, page).await, offered, current);
    }

    /// A PUT (`body`) or a fenced GET (`None`) of `page` with the lease's
    /// token, sent as a token of `issuer`.
    async fn send(&self, lease: &Lease, issuer: &str, page: &str, body: Option<&str>) -> Reply {
        let token = lease.token().unwrap().get().to_string();
        let headers = [
            ("Fencing-Token", token.as_str()),
            ("Fencing-Issuer", issuer),
        ];
        match body {
            Some(body) => self.api.put(page, body, &headers).await,
            None => self.api.get(page, &headers).await,
        }
    }
}

#[track_caller]
fn assert_mismatch(reply: Reply, offered: &str, current: &str) {
    let reply = reply.expect_error(409, "issuer_mismatch");
    assert_eq!(
        (&reply.json["offered_issuer"], &reply.json["current_issuer"]),
        (&json!(offered), &json!(current)),
        "{}",
        reply.json
    );
}

#[tokio::test]
async fn a_first_fenced_read_with_another_issuers_token_no_longer_chooses_the_pages_issuer() {
    let scene = Scene::start().await;
    let lease = scene.lease("tutorial").await;
    // The old attack: a fenced read of a never-written page fixed its issuer.
    assert_mismatch(
        scene.send(&lease, "other", "tutorial", None).await,
        "other",
        "redis",
    );
    assert_eq!(scene.api.fence("tutorial").await, json!(null));
    assert_eq!(
        outcomes(&scene.api.history("tutorial").await),
        ["issuer_mismatch"]
    );
    // The page's own issuer's holder writes, and fences it.
    let written = scene.put(&lease, "redis", "tutorial").await.expect(201);
    assert_eq!(written.json["fence"]["issuer"], "redis");
    scene.mismatch(&lease, "other", "tutorial", "redis").await;

    // A glob: demo-* is `other`'s.
    let demo = scene.lease("demo-1").await;
    scene.mismatch(&demo, "redis", "demo-1", "other").await;
    scene.put(&demo, "other", "demo-1").await.expect(201);
    assert_eq!(scene.api.fence("demo-1").await["issuer"], "other");
}

#[tokio::test]
async fn a_page_no_rule_names_is_refused_until_an_admin_gives_it_an_issuer_which_then_wins() {
    let scene = Scene::start().await;
    let lease = scene.lease("unmapped").await;
    let refused = scene
        .send(&lease, "redis", "unmapped", Some("x"))
        .await
        .expect_error(409, "no_issuer_for_page");
    assert_eq!(
        (&refused.json["id"], &refused.json["offered_issuer"]),
        (&json!("unmapped"), &json!("redis"))
    );
    let history = scene.api.history("unmapped").await;
    assert_eq!(outcomes(&history), ["no_issuer_for_page"]);
    assert_eq!(history[0]["fence_token"], json!(null));

    // An admin chooses `other` (forced: this Redis cannot say what it minted).
    let admin = scene.api.as_client(ADMIN);
    let token = lease.token().unwrap().get();
    let body =
        json!({"issuer": "other", "token": token, "reason": "unmapped is other's", "force": true});
    admin.set_fence("unmapped", &body).await.expect(200);
    scene.put(&lease, "other", "unmapped").await.expect(201);
    scene.mismatch(&lease, "redis", "unmapped", "other").await;

    // A fence an admin set wins over the rule too: tutorial is `redis`'s by
    // the rule, `other`'s from now on.
    let tutorial = scene.lease("tutorial").await;
    scene.put(&tutorial, "redis", "tutorial").await.expect(201);
    let token = tutorial.token().unwrap().get();
    let body = json!({"issuer": "other", "token": token, "reason": "moved", "force": true});
    admin.set_fence("tutorial", &body).await.expect(200);
    scene
        .mismatch(&tutorial, "redis", "tutorial", "other")
        .await;
    scene.put(&tutorial, "other", "tutorial").await.expect(200);
}

#[tokio::test]
async fn the_default_issuer_guards_the_pages_no_pattern_matches() {
    let scene = Scene::with(|o| o.default_issuer("other")).await;
    let lease = scene.lease("elsewhere").await;
    scene.mismatch(&lease, "redis", "elsewhere", "other").await;
    scene.put(&lease, "other", "elsewhere").await.expect(201);
}

#[tokio::test]
async fn every_issuer_the_rule_names_must_be_configured() {
    let url = harness::fresh_database().await;
    let redis = "redis://127.0.0.1:1/";
    for (options, said) in [
        (
            keyed(FenceCheck::Enforce)
                .issuer("redis", redis)
                .page_issuer("p", "zookeeper"),
            "GATEWAY_PAGE_ISSUERS",
        ),
        (
            keyed(FenceCheck::Enforce)
                .issuer("redis", redis)
                .default_issuer("zookeeper"),
            "GATEWAY_DEFAULT_ISSUER",
        ),
        (
            keyed(FenceCheck::Enforce).page_issuer("p", "redis"),
            "not configured",
        ),
        (
            keyed(FenceCheck::Enforce).page_issuer("a.b", "redis"),
            "pattern",
        ),
    ] {
        let err = gateway::spawn_with_options(&url, options)
            .await
            .err()
            .expect("refused to start")
            .to_string();
        assert!(err.contains(said), "{err}");
    }
    // Fencing off ignores the rule.
    gateway::spawn_with_options(&url, keyed(FenceCheck::Off).default_issuer("zookeeper"))
        .await
        .expect("fencing off starts");
}

#[tokio::test]
async fn the_admin_sets_no_fence_of_an_unconfigured_issuer_nor_above_what_the_issuer_minted_unforced(
) {
    let scene = Scene::start().await;
    let lease = scene.lease("tutorial").await;
    scene.put(&lease, "redis", "tutorial").await.expect(201);
    let before = scene.api.snapshot("tutorial").await;
    let admin = scene.api.as_client(ADMIN);

    let unknown = json!({"issuer": "zookeeper", "token": 1, "reason": "x", "force": true});
    let r = admin
        .set_fence("tutorial", &unknown)
        .await
        .expect_error(409, "unknown_issuer");
    assert_eq!(r.json["known"], json!(["other", "redis"]));

    let max = i64::MAX as u64;
    let highest = json!({"issuer": "redis", "token": max, "reason": "lock everyone out"});
    let r = admin
        .set_fence("tutorial", &highest)
        .await
        .expect_error(409, "force_required");
    assert_eq!(
        (&r.json["issuer"], &r.json["token"]),
        (&json!("redis"), &json!(max))
    );
    assert!(
        r.json["minted"].is_null() || r.json["minted"].as_u64() < Some(max),
        "{}",
        r.json
    );
    assert_eq!(
        scene.api.snapshot("tutorial").await,
        before,
        "a refusal wrote"
    );

    // Forced: set, and the history says so.
    let mut forced = highest.clone();
    forced["force"] = json!(true);
    admin.set_fence("tutorial", &forced).await.expect(200);
    let audit = &scene.api.history("tutorial").await[0];
    assert_eq!(
        (&audit["outcome"], &audit["fence_token"], &audit["force"]),
        (&json!("fence_set"), &json!(max), &json!(true))
    );
    scene
        .send(&lease, "redis", "tutorial", Some("locked out"))
        .await
        .expect_error(409, "stale_token");
}
