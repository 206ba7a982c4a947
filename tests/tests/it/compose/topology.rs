//! What compose.yaml runs and how it hangs together: every service pinned,
//! health-checked on what it is for, started after healthy dependencies;
//! the same services as scripts/stack; the standby and the balancer in front
//! of the fenced gateways; the workers under `init`; a `down` that leaves
//! nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use harness::process::run_ok;
use harness::stack::repo;
use serde_yaml::Value;

use super::image::pinned_to_a_patch_release;
use super::wiring::command_text;
use super::{
    compose, defaults, docker_compose, environment, our_binary, port_of, running, scalar, services,
    stack_env, stack_services, ONE_SHOT,
};

#[test]
fn compose_file_passes_docker_compose_config() {
    for profile in [&[][..], &["--profile", "redlock", "--profile", "demo"][..]] {
        let Some(mut config) =
            docker_compose("docker-compose config; the serde_yaml checks still ran")
        else {
            return;
        };
        run_ok(config.args(profile).args(["config", "-q"]));
    }
}

/// The replicated lock services: the ZooKeeper ensemble and the Sentinel group.
const REPLICATED: [&str; 8] = [
    "zk1",
    "zk2",
    "zk3",
    "redis-master",
    "redis-replica",
    "sentinel-1",
    "sentinel-2",
    "sentinel-3",
];

#[test]
fn every_service_is_pinned_healthchecked_and_waits_for_healthy_dependencies() {
    let compose = compose();
    let services = services(&compose);
    let others = [
        "postgres",
        "redis",
        "mariadb",
        "gateway",
        "gateway-unfenced",
        "worker-1",
        "worker-2",
        "worker-3",
        "redlock-1",
        "redlock-5",
    ];
    for name in REPLICATED.into_iter().chain(others) {
        assert!(
            services.contains_key(name),
            "compose.yaml has no service {name}"
        );
    }
    for (name, service) in &services {
        let image = service.get("image").and_then(Value::as_str);
        if service.get("build").is_none() {
            let image = image.unwrap_or_else(|| panic!("{name} has neither build nor image"));
            assert!(
                pinned_to_a_patch_release(image),
                "{name}: image {image} is not pinned to a full patch release"
            );
        }
        if ONE_SHOT.contains(&name.as_str()) {
            assert_eq!(service["restart"].as_str(), Some("no"), "{name} runs once");
            assert!(service.get("healthcheck").is_none(), "{name} runs once");
        } else {
            let test = service
                .get("healthcheck")
                .and_then(|h| h.get("test"))
                .unwrap_or_else(|| panic!("{name} has no healthcheck"));
            assert!(
                test.as_sequence().is_some_and(|t| !t.is_empty()),
                "{name}: empty healthcheck"
            );
        }
        if let Some(deps) = service.get("depends_on") {
            let deps = deps
                .as_mapping()
                .unwrap_or_else(|| panic!("{name}: depends_on must be a mapping with conditions"));
            for (dep, spec) in deps {
                let dep = dep.as_str().unwrap();
                assert!(
                    services.contains_key(dep),
                    "{name} depends on unknown {dep}"
                );
                let wanted = if ONE_SHOT.contains(&dep) {
                    "service_completed_successfully"
                } else {
                    "service_healthy"
                };
                assert_eq!(
                    spec.get("condition").and_then(Value::as_str),
                    Some(wanted),
                    "{name} must wait for {dep}"
                );
                assert!(
                    services[dep].get("profiles").is_none() || service.get("profiles").is_some(),
                    "{name} (always on) depends on {dep}, which only runs in a profile"
                );
            }
        }
    }
    for i in 1..=5 {
        let profiles = services[&format!("redlock-{i}")].get("profiles").cloned();
        assert_eq!(profiles, Some(serde_yaml::from_str("[redlock]").unwrap()));
    }
    let gateway = defaults(&services["gateway"]);
    let unfenced = defaults(&services["gateway-unfenced"]);
    assert_eq!(gateway["GATEWAY_FENCING"], "enforce");
    assert_eq!(unfenced["GATEWAY_FENCING"], "off");
}

#[test]
fn compose_and_the_stack_script_define_the_same_services() {
    let compose: BTreeSet<String> = services(&compose()).into_keys().collect();
    let stack = stack_services();
    assert_eq!(
        compose.difference(&stack).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "in compose.yaml, not in scripts/stack (all_services)"
    );
    assert_eq!(
        stack.difference(&compose).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "in scripts/stack (all_services), not in compose.yaml"
    );
    for name in ["postgres-standby", "gateway-2", "balancer"] {
        assert!(compose.contains(name), "no {name}");
    }
    // The ZooKeeper ensemble and the Sentinel group, in both.
    for name in REPLICATED {
        assert!(compose.contains(name), "no {name}");
    }
}

/// The fenced gateways: our gateway binary with GATEWAY_FENCING=enforce.
fn fenced_gateways(services: &BTreeMap<String, Value>) -> Vec<String> {
    running(services, "gateway")
        .filter(|(_, s)| defaults(s).get("GATEWAY_FENCING").map(String::as_str) == Some("enforce"))
        .map(|(n, _)| n.clone())
        .collect()
}

/// `host:port` of each server a gateway's DATABASE_URL names, and whether it
/// asks for the one that accepts writes (the gateway's own parser).
fn database_servers(url: &str) -> (Vec<String>, bool) {
    let (targets, read_write) =
        gateway::db::parse_url(url).unwrap_or_else(|e| panic!("DATABASE_URL {url}: {e}"));
    (
        targets
            .iter()
            .map(|t| format!("{}:{}", t.get_host(), t.get_port()))
            .collect(),
        read_write,
    )
}

#[test]
fn gateways_follow_the_primary_and_the_fenced_ones_sit_behind_the_balancer() {
    let compose = compose();
    let services = services(&compose);

    // Two fenced gateways, the same settings but their ports.
    let fenced = fenced_gateways(&services);
    assert_eq!(fenced, ["gateway", "gateway-2"]);
    let without_listen = |name: &str| {
        let mut env = defaults(&services[name]);
        let listen = env.remove("GATEWAY_LISTEN").expect("GATEWAY_LISTEN");
        let probes = env
            .remove("GATEWAY_PROBE_LISTEN")
            .expect("GATEWAY_PROBE_LISTEN");
        (env, (listen, probes))
    };
    let (one, listen_1) = without_listen("gateway");
    let (two, listen_2) = without_listen("gateway-2");
    assert_eq!(one, two, "gateway and gateway-2 differ beyond their ports");
    assert_ne!(listen_1, listen_2);

    // Every gateway (the unfenced one too) names the primary and the standby
    // and wants the one that accepts writes; the stack's do the same.
    for (name, service) in running(&services, "gateway") {
        let env = defaults(service);
        assert_eq!(
            database_servers(&env["DATABASE_URL"]),
            (
                vec![
                    "postgres:5432".to_owned(),
                    "postgres-standby:5432".to_owned()
                ],
                true
            ),
            "{name}"
        );
        let stack = stack_env(name);
        let (servers, read_write) = database_servers(&stack["DATABASE_URL"]);
        assert_eq!(
            (servers.len(), read_write),
            (2, true),
            "{name} in scripts/stack"
        );
    }

    // The standby: the official image, from a base backup of `postgres`, by
    // the repository's entrypoint script; the primary lets it replicate.
    let primary = &services["postgres"];
    let standby = &services["postgres-standby"];
    assert_eq!(standby.get("image"), primary.get("image"));
    let entrypoint = serde_yaml::to_string(&standby["entrypoint"]).unwrap();
    assert!(
        entrypoint.contains("/demo/postgres/standby.sh"),
        "{entrypoint}"
    );
    let mounts = |s: &Value| serde_yaml::to_string(&s["volumes"]).unwrap();
    assert!(mounts(standby).contains("./demo/postgres:/demo/postgres:ro"));
    assert!(
        mounts(primary).contains("./demo/postgres/primary-init.sh:/docker-entrypoint-initdb.d/")
    );
    for script in ["standby.sh", "primary-init.sh"] {
        let text = std::fs::read_to_string(repo().join("demo/postgres").join(script))
            .unwrap_or_else(|e| panic!("demo/postgres/{script}: {e}"));
        assert!(text.starts_with("#!/usr/bin/env bash"), "{script}");
    }
    let standby_script = std::fs::read_to_string(repo().join("demo/postgres/standby.sh")).unwrap();
    assert!(standby_script.contains("pg_basebackup") && standby_script.contains(" -R "));
    let standby_env = defaults(standby);
    assert_eq!(standby_env["PRIMARY_HOST"], "postgres");
    // Asynchronous unless POSTGRES_REPLICATION=sync, in compose and the stack.
    let replication = |vars: &BTreeMap<&str, &str>| {
        environment(primary, vars)
            .remove("POSTGRES_REPLICATION")
            .expect("postgres has POSTGRES_REPLICATION")
    };
    assert_eq!(replication(&BTreeMap::new()), "async");
    assert_eq!(
        replication(&BTreeMap::from([("POSTGRES_REPLICATION", "sync")])),
        "sync"
    );

    // The workers talk to the balancer.
    for (name, service) in running(&services, "worker") {
        if name != "straggler-unfenced" {
            assert_eq!(
                defaults(service)["WORKER_GATEWAY"],
                "http://balancer:8080",
                "{name}"
            );
        }
    }

    // The balancer: the official haproxy image with demo/haproxy, published
    // where the tutorial's curls go, health-checking exactly the fenced
    // gateways on /readyz, at their probe addresses.
    let balancer = &services["balancer"];
    assert!(balancer["image"]
        .as_str()
        .unwrap()
        .starts_with("haproxy:2.6."));
    assert!(mounts(balancer).contains("./demo/haproxy:/usr/local/etc/haproxy:ro"));
    assert_eq!(
        serde_yaml::to_string(&balancer["ports"]).unwrap().trim(),
        "- 127.0.0.1:8080:8080"
    );
    let cfg = std::fs::read_to_string(repo().join("demo/haproxy/haproxy.cfg")).unwrap();
    let lines: Vec<&str> = cfg.lines().map(str::trim).collect();
    assert!(lines.contains(&"bind :8080"));
    assert!(lines.contains(&"option httpchk GET /readyz"));
    assert!(lines.contains(&"http-check expect status 200"));
    let servers: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("server "))
        .collect();
    let want: Vec<String> = fenced
        .iter()
        .map(|name| {
            let env = defaults(&services[name]);
            let port = port_of(&env["GATEWAY_LISTEN"]);
            let probes = port_of(&env["GATEWAY_PROBE_LISTEN"]);
            format!("{name} {name}:{port} check port {probes}")
        })
        .collect();
    assert_eq!(
        servers, want,
        "the balancer's servers are the fenced gateways"
    );
    let errorfile = lines
        .iter()
        .find_map(|l| l.strip_prefix("errorfile 503 /usr/local/etc/haproxy/"))
        .expect("a 503 errorfile in the mounted directory");
    let page = std::fs::read_to_string(repo().join("demo/haproxy").join(errorfile)).unwrap();
    let body = page.split("\r\n\r\n").nth(1).expect("headers, then a body");
    let json: serde_json::Value = serde_json::from_str(body).expect("the 503 body is JSON");
    assert_eq!(json["error"], "no_gateway_available");
}

#[test]
fn balancer_configuration_is_valid_for_haproxy() {
    let haproxy = ["/usr/sbin/haproxy", "/usr/local/sbin/haproxy"]
        .into_iter()
        .find(|p| Path::new(p).is_file());
    let Some(haproxy) = haproxy else {
        println!("SKIPPED: haproxy is not installed (apt-get install haproxy; .ci/run does)");
        return;
    };
    // As scripts/stack runs it: the errorfile from the repository.
    let dir = tempfile::tempdir().unwrap();
    let cfg = std::fs::read_to_string(repo().join("demo/haproxy/haproxy.cfg"))
        .unwrap()
        .replace(
            "/usr/local/etc/haproxy/",
            &format!("{}/", repo().join("demo/haproxy").display()),
        );
    std::fs::write(dir.path().join("haproxy.cfg"), cfg).unwrap();
    // A rejection shows haproxy's reasons (run_ok's panic).
    run_ok(
        Command::new(haproxy)
            .args(["-c", "-f"])
            .arg(dir.path().join("haproxy.cfg")),
    );
}

#[test]
fn workers_run_under_init_so_the_straggler_can_stop_itself() {
    let services = services(&compose());
    let mut workers = 0;
    for (name, service) in running(&services, "worker") {
        workers += 1;
        assert_eq!(
            service.get("init").and_then(Value::as_bool),
            Some(true),
            "{name}: without init: true the worker is PID 1, and the kernel ignores the \
             SIGSTOP it sends itself (WORKER_STOP_SELF_AT)"
        );
    }
    assert!(workers >= 5, "only {workers} workers");
    for name in ["straggler", "straggler-unfenced"] {
        let env = defaults(&services[name]);
        assert_eq!(env["WORKER_STOP_SELF_AT"], "writing", "{name}");
        assert_eq!(services[name]["restart"].as_str(), Some("no"), "{name}");
    }
}

#[test]
fn every_healthcheck_asks_what_its_service_is_for() {
    let compose = compose();
    let services = services(&compose);
    let test = |name: &str| -> String {
        let test = services[name]["healthcheck"]["test"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{name}: healthcheck test is a list"));
        let words: Vec<String> = test.iter().map(scalar).collect();
        assert!(
            words[0] == "CMD" || words[0] == "CMD-SHELL",
            "{name}: healthcheck starts with CMD or CMD-SHELL"
        );
        words[1..].join(" ")
    };
    let primary_db = defaults(&services["postgres"])["POSTGRES_DB"].clone();
    for (name, service) in &services {
        if ONE_SHOT.contains(&name.as_str()) {
            continue;
        }
        let env = defaults(service);
        let image = service.get("image").and_then(Value::as_str).unwrap_or("");
        let got = test(name);
        let want = match (our_binary(service).as_deref(), image.split(':').next()) {
            (Some("gateway"), _) => {
                let port = port_of(&env["GATEWAY_LISTEN"]);
                format!("curl -fsS http://127.0.0.1:{port}/healthz")
            }
            (Some("worker"), _) => "curl -fsS \"$$WORKER_GATEWAY/readyz\" >/dev/null".into(),
            (_, Some("postgres")) => format!("pg_isready -U postgres -d {primary_db}"),
            (_, Some("mariadb")) => "healthcheck.sh --connect --innodb_initialized".into(),
            (_, Some("zookeeper")) => "zkServer.sh status".into(),
            (_, Some("haproxy")) => "bash -c exec 3<>/dev/tcp/127.0.0.1/8080".into(),
            (_, Some("redis")) if command_text(service).contains("redis-sentinel") => {
                format!(
                    "redis-cli -p 26379 --no-auth-warning --user admin --pass {} \
                     sentinel get-master-addr-by-name mymaster | grep -q .",
                    admin_password("redis-sentinel")
                )
            }
            // As the admin: anonymous clients get NOAUTH.
            (_, Some("redis")) => format!(
                "redis-cli --no-auth-warning --user admin --pass {} ping | grep -q PONG",
                admin_password("redis-users")
            ),
            other => panic!("{name}: no expected healthcheck for {other:?}"),
        };
        assert_eq!(got, want, "{name}");
    }
    // The sentinels are asked about the master they monitor, on their port.
    let sentinel = command_text(&services["sentinel-1"]);
    assert!(sentinel.contains("'port 26379'") && sentinel.contains("monitor mymaster "));
}

#[test]
fn every_down_in_the_docs_removes_the_profiles_and_the_volumes() {
    // `down` alone leaves the containers of profiles it was not given
    // (straggler, redlock-N) and the anonymous volumes of the databases'
    // images: the tutorial's "a fresh one again" needs every profile and -v.
    let compose = compose();
    let profiles: BTreeSet<String> = services(&compose)
        .values()
        .filter_map(|s| s.get("profiles").and_then(Value::as_sequence))
        .flatten()
        .map(scalar)
        .collect();
    assert!(profiles.contains("demo") && profiles.contains("redlock"));
    let docs = [
        "README.md",
        harness::transcript::TUTORIAL,
        "docs/TESTING.md",
    ]
    .map(|path| std::fs::read_to_string(repo().join(path)).expect(path))
    .join("\n");
    let downs: Vec<String> = harness::transcript::blocks(&docs)
        .into_iter()
        .filter(|b| b.info == "sh")
        .flat_map(|b| b.lines)
        .filter(|l| l.starts_with("docker compose ") && l.contains(" down"))
        .collect();
    assert!(!downs.is_empty(), "the docs say how to take the demo down");
    for down in &downs {
        let words: Vec<&str> = down
            .split(" #")
            .next()
            .unwrap()
            .split_whitespace()
            .collect();
        for profile in &profiles {
            assert!(
                words
                    .windows(2)
                    .any(|w| w == ["--profile", profile.as_str()]),
                "`{down}` leaves the containers of profile {profile}"
            );
        }
        assert!(
            words.contains(&"-v") || words.contains(&"--volumes"),
            "`{down}` leaves the anonymous volumes (the data of postgres, mariadb, zookeeper)"
        );
    }
}

/// The shell words that read the Redis admin's password from the secret
/// `name` in a healthcheck.
fn admin_password(name: &str) -> String {
    format!("\"$$(sed -n 's/^user admin on >\\([^ ]*\\).*/\\1/p' /run/secrets/{name})\"")
}
