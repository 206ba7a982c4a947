//! Trust: both gateways require keys from demo/api-keys, every worker sends
//! its own client's key, the fenced gateway checks tokens with all five lock
//! services (the same ones the workers use) and the unfenced one with none,
//! and the gateways are published on 127.0.0.1 only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use harness::stack::repo;

use super::{compose, defaults, published, raw_environment, running, secret_file, services};

/// The issuers the fenced gateway must trust: every backend with a token.
const ISSUERS: [&str; 5] = [
    "redis",
    "zookeeper",
    "redis-sentinel",
    "lease-postgres",
    "lease-mysql",
];

/// `client=key` lines of a key file (comments and blank lines skipped),
/// checked as the gateway's contract wants them: well formed, keys of at
/// least 16 bytes, no client twice.
fn key_file(path: &Path) -> BTreeMap<String, String> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut keys = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (client, key) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{}:{}: not client=key", path.display(), i + 1));
        assert!(
            key.len() >= 16 && key.bytes().all(|b| b.is_ascii_graphic()),
            "{}:{}: the key of {client} is shorter than 16 bytes or not visible ASCII",
            path.display(),
            i + 1
        );
        assert!(
            keys.insert(client.to_owned(), key.to_owned()).is_none(),
            "{}:{}: {client} named twice",
            path.display(),
            i + 1
        );
    }
    keys
}

#[test]
fn every_writer_sends_its_own_key_and_the_gateways_check_what_the_tutorial_says() {
    let compose = compose();
    let services = services(&compose);
    let writers = key_file(&repo().join("demo/api-keys"));
    let admins = key_file(&repo().join("demo/admin-keys"));
    for client in ["alice", "bob"] {
        assert!(
            writers.contains_key(client),
            "the tutorial writes as {client}"
        );
    }
    assert!(admins.contains_key("admin"), "demo/admin-keys has no admin");
    assert!(
        admins.values().all(|k| !writers.values().any(|w| w == k)),
        "an admin key is also a writer key"
    );

    for (name, service) in &services {
        for port in published(service) {
            assert!(
                port.starts_with("127.0.0.1:"),
                "{name} publishes {port} on every interface, not on 127.0.0.1 only"
            );
        }
    }
    let mut workers = 0;
    for (name, service) in running(&services, "worker") {
        let env = defaults(service);
        let client = &env["WORKER_CLIENT_ID"];
        assert_eq!(
            env.get("WORKER_API_KEY"),
            writers.get(client),
            "{name}: WORKER_API_KEY is not the key demo/api-keys has for {client}"
        );
        workers += 1;
    }
    assert!(workers >= 5, "only {workers} workers checked");

    for (name, fenced) in [("gateway", true), ("gateway-unfenced", false)] {
        let service = &services[name];
        let env = defaults(service);
        assert_eq!(
            env.get("GATEWAY_AUTH").map(String::as_str),
            Some("required")
        );
        let keys = secret_file(&compose, service, &env["GATEWAY_API_KEYS_FILE"]);
        assert_eq!(key_file(&keys), writers, "{name} reads another key file");
        if !fenced {
            assert!(
                !env.contains_key("GATEWAY_ISSUERS"),
                "{name}: fencing off checks no token, so it has no issuers to ask"
            );
            continue;
        }
        let admin = secret_file(&compose, service, &env["GATEWAY_ADMIN_KEYS_FILE"]);
        assert_eq!(key_file(&admin), admins);
        // Each issuer is the very service the workers take their locks from.
        let worker = defaults(&services["worker-1"]);
        let issuers: BTreeMap<&str, &str> = env["GATEWAY_ISSUERS"]
            .split_whitespace()
            .map(|e| e.split_once('=').expect("name=url"))
            .collect();
        assert_eq!(
            issuers.keys().copied().collect::<BTreeSet<_>>(),
            BTreeSet::from(ISSUERS),
            "the fenced gateway trusts every backend with a token, and only those"
        );
        // Redis as the gateways' read-only user, the workers as theirs.
        let (issuer_login, issuer_redis) = login_and_rest(issuers["redis"]);
        let (worker_login, worker_redis) = login_and_rest(&worker["REDIS_URL"]);
        assert_eq!(issuer_redis, worker_redis);
        assert_eq!((issuer_login, worker_login), ("gateway", "worker"));
        // ZooKeeper as the gateways' own (read-only) user.
        let (zk_login, zk_hosts) = login_and_rest(issuers["zookeeper"]);
        assert_eq!(zk_login, "gateway");
        assert_eq!(zk_hosts.trim_end_matches('/'), worker["ZOOKEEPER_CONNECT"]);
        // The whole ensemble, and the sentinels with the master's name.
        assert_eq!(
            worker["ZOOKEEPER_CONNECT"].split(',').count(),
            3,
            "the workers connect to all three ZooKeeper servers"
        );
        let (issuer_login, sentinels) = login_and_rest(issuers["redis-sentinel"]);
        let (worker_login, worker_sentinels) = worker["REDIS_SENTINELS"]
            .split_once('@')
            .expect("the workers' Redis user before the sentinels");
        assert_eq!(
            sentinels,
            format!("{worker_sentinels}/{}", worker["REDIS_SENTINEL_MASTER"])
        );
        assert_eq!(
            (
                issuer_login,
                worker_login.split(':').next().unwrap_or_default()
            ),
            ("gateway", "worker")
        );
        // The same lease table, each with its own login: the issuer's reads.
        let (issuer_login, issuer_table) = login_and_rest(issuers["lease-postgres"]);
        let (worker_login, worker_table) = login_and_rest(&worker["DATABASE_URL"]);
        assert_eq!(issuer_table, worker_table);
        assert_eq!(
            (issuer_login, worker_login),
            ("fence_issuer", "fence_worker_1")
        );
        let (issuer_login, issuer_db) = login_and_rest(issuers["lease-mysql"]);
        let (worker_login, worker_db) = login_and_rest(&worker["MYSQL_URL"]);
        assert_eq!(issuer_db, worker_db);
        assert_eq!(
            (issuer_login, worker_login),
            ("fence_issuer", "fence_lock_client")
        );
    }
}

/// A URL's login and the rest after its `@`: `(fence_issuer, postgres:5432/pages)`.
fn login_and_rest(url: &str) -> (&str, &str) {
    let (_, rest) = url.split_once("://").expect("a URL");
    let (userinfo, rest) = rest.split_once('@').expect("a login");
    (userinfo.split(':').next().unwrap_or_default(), rest)
}

/// Whether `value` carries a password: a URL's `user:password@` (one URL
/// or a list), or a digest `user:password`.
fn holds_password(key: &str, value: &str) -> bool {
    (key.ends_with("_AUTH") && value.contains(':'))
        || value.split([' ', ',']).any(|part| {
            let rest = part.split_once("://").map_or(part, |(_, r)| r);
            rest.split_once('@')
                .is_some_and(|(userinfo, _)| userinfo.contains(':'))
        })
}

#[test]
fn compose_yaml_passes_no_login_in_the_clear_the_secrets_files_do() {
    assert!(holds_password("X", "redis://u:p@h:1"));
    assert!(holds_password("X", "a=redis://h:1 b=postgres://u:p@h/db"));
    assert!(holds_password("X", "u:p@s1:26379,s2:26379"));
    assert!(holds_password("ZOOKEEPER_AUTH", "u:p"));
    assert!(!holds_password("X", "redis://h:1"));
    assert!(!holds_password("GATEWAY_AUTH", "required"));
    assert!(!holds_password("ZOOKEEPER_ADMIN_ID", "admin:digest="));
    for (name, service) in services(&compose()) {
        for (key, value) in raw_environment(&service, &BTreeMap::new()) {
            assert!(
                !holds_password(&key, &value),
                "{name}: {key} passes a password in compose.yaml: put it in the service's \
                 demo/secrets/<service>.env (SECRETS_FILE)"
            );
        }
    }
}
