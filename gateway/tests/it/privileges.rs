//! The rights matrix of the page database, PostgreSQL's side: for each
//! login `gateway setup` grants to, what it must be able to do, and that
//! PostgreSQL itself refuses everything else it could use against a fence
//! (SQLSTATE 42501, insufficient privilege), whatever the gateway's code.

use sqlx::{Connection, Executor, PgConnection};

use crate::roles::{database_with_roles, RoleDb};

/// What PostgreSQL answered `sql` run as `url`'s login: `Ok`, or the SQLSTATE.
async fn run_as(url: &str, sql: &str) -> Result<(), String> {
    let mut conn = PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("log in as {url}: {e}"));
    let result = conn.execute(sql).await.map(drop).map_err(|e| match e {
        sqlx::Error::Database(db) => db.code().unwrap_or_default().into_owned(),
        other => panic!("{sql}: not a database error: {other}"),
    });
    conn.close().await.unwrap();
    result
}

/// Each of `allowed` runs; each of `refused` is refused by PostgreSQL as
/// insufficient privilege.
async fn assert_rights(who: &str, url: &str, allowed: &[&str], refused: &[&str]) {
    for sql in allowed {
        if let Err(code) = run_as(url, sql).await {
            panic!("{who} must be able to run {sql:?}, PostgreSQL said {code}");
        }
    }
    for sql in refused {
        match run_as(url, sql).await {
            Err(code) if code == "42501" => {}
            other => panic!("{who}: {sql:?} must be refused with 42501, got {other:?}"),
        }
    }
}

/// A page, a history row and a lease row, written by the superuser.
async fn seeded() -> RoleDb {
    let db = database_with_roles().await;
    let mut conn = PgConnection::connect(&db.admin).await.unwrap();
    conn.execute(
        "insert into pages (id, body, version, fence_issuer, fence_token)
             values ('p', 'text', 1, 'redis', 5);
         insert into page_history (page_id, method, outcome, token, issuer, version, fence_token)
             values ('p', 'PUT', 'accepted', 5, 'redis', 1, 5);
         insert into fencelock_leases (name, holder, client_id, token, expires_at, granted_at)
             values ('page:p', 'h', 'alice', 5, now() + interval '1 minute', now())",
    )
    .await
    .unwrap();
    conn.close().await.unwrap();
    db
}

/// Seed a database, then check the login `login` picks: each of `allowed`
/// runs; each of `refused`, and every write of the lease table, is refused.
async fn check(
    who: &str,
    login: fn(&RoleDb) -> &String,
    allowed: &[&str],
    refused: &[&str],
) -> RoleDb {
    let db = seeded().await;
    let refused: Vec<&str> = refused.iter().copied().chain(LEASE_WRITES).collect();
    assert_rights(who, login(&db), allowed, &refused).await;
    db
}

const LEASE_WRITES: [&str; 3] = [
    "insert into fencelock_leases (name, holder, client_id, token, expires_at, granted_at)
         values ('page:q', 'h', 'mallory', 9223372036854775807, now() + interval '1 hour', now())",
    "update fencelock_leases set token = 9223372036854775807, client_id = 'mallory'",
    "delete from fencelock_leases",
];

#[tokio::test]
async fn the_gateway_login_reads_and_writes_pages_but_cannot_delete_rewrite_history_nor_run_ddl() {
    check(
        "the fenced gateway",
        |db| &db.gateway,
        &[
            "select * from pages",
            "insert into pages (id, body, version, fence_issuer, fence_token) values ('q', 'x', 1, 'redis', 1)",
            "update pages set body = 'y', version = 2, fence_token = 6 where id = 'p'",
            "select * from page_history",
            "insert into page_history (page_id, method, outcome, version) values ('p', 'GET', 'accepted', 2)",
            "select * from fencelock_leases",
            "select version from _sqlx_migrations",
        ],
        &[
            "delete from pages",
            "truncate pages",
            "delete from page_history",
            "update page_history set outcome = 'accepted', fence_token = 0",
            "truncate page_history",
            "create table mine (x int)",
            "alter table pages add column mine int",
            "drop table page_history",
        ],
    )
    .await;
}

#[tokio::test]
async fn the_unfenced_login_cannot_touch_the_fence_columns() {
    let db = check(
        "the unfenced gateway",
        |db| &db.unfenced,
        &[
            "select * from pages",
            "update pages set body = 'late', version = version + 1, last_outcome = 'stale', updated_at = now() where id = 'p'",
            "insert into pages (id, body, version, last_outcome, updated_at) values ('q', 'x', 1, 'accepted', now())",
            "select * from page_history",
            "insert into page_history (page_id, method, outcome, token, issuer, version, fence_token) values ('p', 'PUT', 'stale', 1, 'redis', 2, 5)",
            "select version from _sqlx_migrations",
        ],
        &[
            "update pages set fence_token = 9223372036854775807 where id = 'p'",
            "update pages set fence_issuer = 'zz-bogus-issuer' where id = 'p'",
            "update pages set fence_issuer = null, fence_token = null",
            "insert into pages (id, body, version, fence_issuer, fence_token) values ('q', 'x', 1, 'zz-bogus-issuer', 1)",
            "insert into pages (id, fence_token) values ('r', 9223372036854775807)",
            "delete from pages",
            "update page_history set fence_token = 0",
            "delete from page_history",
            "select * from fencelock_leases",
            "create table mine (x int)",
        ],
    )
    .await;
    // Nothing it ran moved the fence.
    let mut conn = PgConnection::connect(&db.admin).await.unwrap();
    let fence: (Option<String>, Option<i64>) =
        sqlx::query_as("select fence_issuer, fence_token from pages where id = 'p'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(fence, (Some("redis".into()), Some(5)));
}

#[tokio::test]
async fn the_issuer_login_can_only_read_the_lease_table() {
    check(
        "the issuer lookups",
        |db| &db.issuer,
        &["select name, client_id, token, expires_at from fencelock_leases"],
        &[
            NO_PAGE_RIGHTS.as_slice(),
            &["select * from fencelock_leases_waiters"],
        ]
        .concat(),
    )
    .await;
}

/// What a login with no right on the page tables is refused.
const NO_PAGE_RIGHTS: [&str; 6] = [
    "select * from pages",
    "update pages set fence_token = 9223372036854775807",
    "insert into pages (id, fence_issuer, fence_token) values ('q', 'redis', 9223372036854775807)",
    "select * from page_history",
    "insert into page_history (page_id, method, outcome, version) values ('p', 'PUT', 'accepted', 1)",
    "create table mine (x int)",
];

/// A worker takes, renews and releases leases through the functions setup
/// installed; it may neither touch the page tables nor read or write the
/// lease tables.
#[tokio::test]
async fn a_worker_login_has_no_right_on_the_page_tables_and_locks_only_through_the_functions() {
    use std::time::Duration;

    use fencelock::lease_table::LeaseTable;
    use fencelock::LockService;

    let db = seeded().await;
    let lease_tables = [
        "select * from fencelock_leases",
        "select * from fencelock_leases_waiters",
        "delete from fencelock_leases_waiters",
    ];
    let refused = [&NO_PAGE_RIGHTS[..], &LEASE_WRITES, &lease_tables].concat();
    assert_rights("a worker", &db.worker, &[], &refused).await;

    let locks = LeaseTable::postgres(&db.worker)
        .await
        .expect("a worker connects without creating anything")
        .with_client_id("alice")
        .unwrap();
    let lease = locks
        .acquire("page:w", Duration::from_secs(30), Duration::from_secs(10))
        .await
        .expect("a lease through the functions");
    assert_eq!(lease.token().unwrap().get(), 1);
    lease.renew().await.unwrap();
    lease.release().await.unwrap();
}

#[tokio::test]
async fn setup_is_idempotent_and_names_a_missing_role() {
    let db = seeded().await;
    let options = gateway::setup::SetupOptions {
        roles: db.roles.clone(),
        ..Default::default()
    };
    // Again: the same rights, nothing lost.
    gateway::setup::run(&db.owner, &options).await.unwrap();
    run_as(&db.unfenced, "update pages set fence_token = 1")
        .await
        .expect_err("still refused");
    run_as(
        &db.gateway,
        "update pages set fence_token = 6 where id = 'p'",
    )
    .await
    .expect("still allowed");

    let mut missing = options.clone();
    missing.roles.unfenced = "fence_nobody_has_made".into();
    let err = gateway::setup::run(&db.owner, &missing)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"fence_nobody_has_made\"") && err.contains("does not exist"),
        "{err}"
    );
}

/// `gateway setup` parses its own flags whatever serve variables the
/// operator's environment holds: parsed beside the serve flags, one
/// `GATEWAY_MAX_STREAMS` made clap read the line as serve flags and refuse
/// it for want of `--database-url`.
#[tokio::test]
async fn the_setup_binary_ignores_the_serve_variables_of_its_environment() {
    let db = seeded().await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["setup", "--database-url", &db.owner])
        .args(["--gateway-role", &db.roles.gateway])
        .args(["--unfenced-role", &db.roles.unfenced])
        .args(["--issuer-role", &db.roles.issuer])
        .args(["--lock-client-role", &db.roles.lock_client])
        .env("GATEWAY_MAX_STREAMS", "4000")
        .env("GATEWAY_LISTEN", "127.0.0.1:1")
        .env("RUST_LOG", "gateway=warn")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The positive control: the gateway's core paths on its own login, with
/// exactly the rights setup gave it: the fenced PUT and GET (the common
/// statement, the locked one, the insert path), the refusals (the issuer
/// check's row, stale_token, issuer_mismatch), the history, the list, the
/// admin's fence, the dashboard's snapshot; and the unfenced gateway's on
/// its login.
#[tokio::test]
async fn the_gateways_serve_every_path_with_exactly_the_rights_setup_gave_them() {
    use std::time::Duration;

    use fencelock::redis::RedisLock;
    use fencelock::LockService;
    use gateway::FenceCheck;
    use serde_json::json;

    use crate::common::{keyed, outcomes, Api, ADMIN};

    let db = database_with_roles().await;
    let redis = harness::Redis::start().await;
    let fenced = gateway::spawn_with_options(
        &db.gateway,
        keyed(FenceCheck::Enforce)
            .migrate(false)
            .issuer("redis", &redis.url())
            .issuer_timeout(Duration::from_secs(5)),
    )
    .await
    .expect("the fenced gateway on its own login");
    let api = Api::new(fenced.url()).as_client("alice");
    let locks = RedisLock::connect(&redis.url())
        .await
        .unwrap()
        .with_client_id("alice")
        .unwrap();
    let lease = locks
        .acquire("page:p", Duration::from_secs(30), Duration::from_secs(10))
        .await
        .unwrap();
    let t = lease.token().unwrap().get();
    let issued = [("Fencing-Issuer", "redis")];

    // Insert path, then the common statement (PUT and fenced GET).
    api.put_fenced_with("p", "one", t, &issued)
        .await
        .expect(201);
    api.put_fenced_with("p", "two", t, &issued)
        .await
        .expect(200);
    let token = t.to_string();
    let fenced_read = [
        ("Fencing-Token", token.as_str()),
        ("Fencing-Issuer", "redis"),
    ];
    api.get("p", &fenced_read).await.expect(200);
    // A fenced read of a page never written: insert path, 404 with its fence.
    let other = locks
        .acquire("page:new", Duration::from_secs(30), Duration::from_secs(10))
        .await
        .unwrap();
    let other_token = other.token().unwrap().get().to_string();
    api.get(
        "new",
        &[
            ("Fencing-Token", other_token.as_str()),
            ("Fencing-Issuer", "redis"),
        ],
    )
    .await
    .expect_error(404, "page_not_found");
    // The issuer check's refusal row.
    api.put_fenced_with("p", "forged", t + 1, &issued)
        .await
        .expect_error(409, "token_not_current");
    // The admin's fence (forced: this Redis cannot say what it minted), then
    // the locked statement's refusal.
    let admin = api.as_client(ADMIN);
    let above = json!({"issuer": "redis", "token": t + 10, "reason": "test", "force": true});
    admin.set_fence("p", &above).await.expect(200);
    api.put_fenced_with("p", "stale", t, &issued)
        .await
        .expect_error(409, "stale_token");
    let back = json!({"issuer": "redis", "token": t, "reason": "back", "force": true});
    admin.set_fence("p", &back).await.expect(200);
    api.put_fenced_with("p", "three", t, &issued)
        .await
        .expect(200);
    assert_eq!(
        outcomes(&api.history("p").await),
        [
            "accepted",
            "fence_set",
            "stale_token",
            "fence_set",
            "token_not_current",
            "accepted",
            "accepted",
            "accepted"
        ]
    );
    let list = api.get_path("/pages").await.expect(200);
    assert_eq!(list.json["pages"][0]["id"], "p");
    let events = api.http.get(api.url("/dashboard/events?page=p")).send();
    assert_eq!(
        events.await.unwrap().status(),
        200,
        "the dashboard's snapshot"
    );
    api.get_path("/readyz").await.expect(200);

    // The unfenced gateway, on its login: insert path, locked statement,
    // a refusal, history.
    let unfenced = gateway::spawn_with_options(&db.unfenced, keyed(FenceCheck::Off).migrate(false))
        .await
        .expect("the unfenced gateway on its own login");
    let off = Api::new(unfenced.url()).as_client("mallory");
    off.put("fresh", "x", &[]).await.expect(201);
    off.put_fenced_with("p", "late", 0, &issued)
        .await
        .expect(200);
    off.put("p", "y", &[("If-Match", "\"1\"")])
        .await
        .expect_error(412, "version_mismatch");
    off.get("p", &[("Fencing-Token", "1")]).await.expect(200);
    assert_eq!(
        outcomes(&off.history("p").await)[..3],
        ["accepted", "version_mismatch", "stale"]
    );
    assert_eq!(off.fence("p").await, json!({"issuer": "redis", "token": t}));
    lease.release().await.unwrap();
    other.release().await.unwrap();
}

#[tokio::test]
async fn the_serving_gateway_does_not_migrate_and_says_to_run_setup() {
    let url = harness::fresh_database().await;
    let options = crate::common::keyed(gateway::FenceCheck::Enforce).migrate(false);
    let err = gateway::spawn_with_options(&url, options.clone())
        .await
        .err()
        .expect("no schema: refused")
        .to_string();
    assert!(err.contains("run `gateway setup`"), "{err}");
    assert_eq!(
        run_as(&url, "select 1 from pages").await,
        Err("42P01".into()),
        "the gateway created the tables"
    );
    // Once set up, the same gateway starts.
    gateway::schema::migrate(&gateway::connect(&url, 1).await.unwrap())
        .await
        .unwrap();
    gateway::spawn_with_options(&url, options).await.unwrap();
}

#[tokio::test]
async fn setup_accepts_a_database_migrated_before_a_migration_was_reworded() {
    let url = harness::fresh_database().await;
    let db = gateway::connect(&url, 1).await.unwrap();
    gateway::schema::migrate(&db).await.unwrap();
    let (version, old) = gateway::schema::REWORDED[0];
    sqlx::query("update _sqlx_migrations set checksum = decode($1, 'hex') where version = $2")
        .bind(old)
        .bind(version)
        .execute(&db)
        .await
        .unwrap();
    // As a database migrated before the rewording: the serving check refuses it...
    let err = gateway::schema::check(&db).await.unwrap_err().to_string();
    assert!(err.contains("other contents"), "{err}");
    // ...and setup, which the refusal asks for, accepts it.
    gateway::schema::migrate(&db).await.unwrap();
    gateway::schema::check(&db).await.unwrap();
}
