//! Wiring: every place compose.yaml names another service by host and port
//! (URLs, addresses, `ZOO_SERVERS`, sentinels, replicas) names a service of
//! compose.yaml and a port that service listens on; what a service publishes
//! and health-checks is a port it listens on.

use std::collections::{BTreeMap, BTreeSet};

use harness::stack::repo;
use serde_yaml::Value;

use super::{compose, defaults, our_binary, port_of, published, scalar, services, CONNECTION_VARS};

/// The default port of a URL scheme, where a URL leaves it out.
fn default_port(scheme: &str) -> u16 {
    match scheme {
        "http" => 80,
        "redis" => 6379,
        "redis-sentinel" => 26379,
        "postgres" | "postgresql" => 5432,
        "mysql" => 3306,
        "zookeeper" => 2181,
        other => panic!("no default port for {other}://"),
    }
}

/// `host:port` pairs of a comma-separated list (`zk1:2181,zk2:2181`).
fn host_list(list: &str, default: u16) -> Vec<(String, u16)> {
    list.split(',')
        .map(|hp| match hp.rsplit_once(':') {
            Some((h, p)) => (
                h.to_owned(),
                p.parse().unwrap_or_else(|_| panic!("port of {hp}")),
            ),
            None => (hp.to_owned(), default),
        })
        .collect()
}

/// The hosts and ports a URL names: `scheme://[user@]h:p[,h:p]/...`.
fn url_endpoints(url: &str) -> Vec<(String, u16)> {
    let (scheme, rest) = url
        .split_once("://")
        .unwrap_or_else(|| panic!("{url} is not a URL"));
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    host_list(hosts, default_port(scheme))
}

/// The servers a variable names (none for GATEWAY_LISTEN, an address to bind).
fn endpoints(name: &str, value: &str) -> Vec<(String, u16)> {
    match name {
        // Addresses or host names without a port (trusted proxies: checked below).
        "GATEWAY_LISTEN" | "GATEWAY_PROBE_LISTEN" | "GATEWAY_TRUSTED_PROXIES" => Vec::new(),
        "ZOOKEEPER_CONNECT" => host_list(value, 2181),
        // `user:password@` once, before the first sentinel.
        "REDIS_SENTINELS" => host_list(value.rsplit_once('@').map_or(value, |(_, h)| h), 26379),
        "REDLOCK_URLS" => value.split(',').flat_map(url_endpoints).collect(),
        "GATEWAY_ISSUERS" => value
            .split_whitespace()
            .flat_map(|entry| url_endpoints(entry.split_once('=').expect("name=url").1))
            .collect(),
        _ => url_endpoints(value),
    }
}

/// A service's command as one string (list or shell form).
pub(super) fn command_text(service: &Value) -> String {
    match service.get("command") {
        Some(Value::Sequence(words)) => words.iter().map(scalar).collect::<Vec<_>>().join(" "),
        Some(other) => scalar(other),
        None => String::new(),
    }
}

/// The port after `marker` in `text` (`port 26379`, `--port 6380`).
fn port_after(text: &str, marker: &str) -> Option<u16> {
    let at = text.find(marker)? + marker.len();
    let digits: String = text[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The ports a service listens on, from its settings: our gateways' listen
/// address, the balancer's `bind` lines, a sentinel's `port`, a ZooKeeper
/// server's client port in ZOO_SERVERS, and the images' defaults otherwise.
fn service_ports(services: &BTreeMap<String, Value>, name: &str) -> BTreeSet<u16> {
    let service = &services[name];
    let env = defaults(service);
    if our_binary(service).as_deref() == Some("gateway") {
        let probes = env.get("GATEWAY_PROBE_LISTEN").map(|p| port_of(p));
        return BTreeSet::from_iter(
            [Some(port_of(&env["GATEWAY_LISTEN"])), probes]
                .into_iter()
                .flatten(),
        );
    }
    if our_binary(service).is_some() {
        return BTreeSet::new(); // workers listen on nothing
    }
    let image = service["image"].as_str().expect("image");
    let command = command_text(service);
    let repository = image.split(':').next().unwrap();
    match repository {
        "postgres" => BTreeSet::from([5432]),
        "mariadb" => BTreeSet::from([3306]),
        "redis" => BTreeSet::from([port_after(&command, "'port ")
            .or_else(|| port_after(&command, "--port"))
            .unwrap_or(6379)]),
        "zookeeper" => {
            let me = format!("server.{}=", env["ZOO_MY_ID"]);
            let entry = env["ZOO_SERVERS"]
                .split_whitespace()
                .find(|e| e.starts_with(&me))
                .unwrap_or_else(|| panic!("{name}: ZOO_SERVERS has no {me}"));
            let client = entry.rsplit_once(';').expect("server.N=...;clientPort").1;
            BTreeSet::from([port_of(client)])
        }
        "haproxy" => {
            let cfg = std::fs::read_to_string(repo().join("demo/haproxy/haproxy.cfg")).unwrap();
            cfg.lines()
                .filter_map(|l| l.trim().strip_prefix("bind :"))
                .map(|p| p.trim().parse().unwrap())
                .collect()
        }
        other => panic!("{name}: no rule for the ports of image {other}"),
    }
}

/// Every place compose.yaml names another service by host and port, checked:
/// the host is a service, and the port one it listens on. Returns what is wrong.
fn wiring_errors(compose: &Value) -> Vec<String> {
    let services = services(compose);
    let mut errors = Vec::new();
    let check = |errors: &mut Vec<String>, from: &str, what: &str, host: &str, port: u16| {
        if !services.contains_key(host) {
            errors.push(format!(
                "{from}: {what} names {host}:{port}, and compose.yaml has no service {host}"
            ));
        } else if !service_ports(&services, host).contains(&port) {
            errors.push(format!(
                "{from}: {what} names {host}:{port}, and {host} listens on {:?}",
                service_ports(&services, host)
            ));
        }
    };
    for (name, service) in &services {
        let env = defaults(service);
        for (var, value) in &env {
            if CONNECTION_VARS.contains(&var.as_str()) {
                for (host, port) in endpoints(var, value) {
                    check(&mut errors, name, var, &host, port);
                }
            }
        }
        // The balancers a gateway trusts to name clients: services of compose.
        if let Some(list) = env.get("GATEWAY_TRUSTED_PROXIES") {
            for host in list.split([',', ' ']).filter(|h| !h.is_empty()) {
                if host.parse::<std::net::IpAddr>().is_err() && !services.contains_key(host) {
                    errors.push(format!(
                        "{name}: GATEWAY_TRUSTED_PROXIES names {host}, which is no service"
                    ));
                }
            }
        }
        if let (Some(host), Some(port)) = (env.get("PRIMARY_HOST"), env.get("PRIMARY_PORT")) {
            check(
                &mut errors,
                name,
                "PRIMARY_HOST",
                host,
                port.parse().unwrap(),
            );
        }
        if let Some(servers) = env.get("ZOO_SERVERS") {
            for entry in servers.split_whitespace() {
                let (id, rest) = entry.split_once('=').expect("server.N=host:...");
                let (host, ports) = rest.split_once(':').expect("host:peer:election;client");
                let id = id.strip_prefix("server.").expect("server.N");
                let client = port_of(ports.rsplit(';').next().unwrap());
                check(&mut errors, name, "ZOO_SERVERS", host, client);
                let their_id = services
                    .get(host)
                    .map(defaults)
                    .and_then(|e| e.get("ZOO_MY_ID").cloned());
                if their_id.as_deref() != Some(id) {
                    errors.push(format!(
                        "{name}: ZOO_SERVERS says {host} is server {id}, its ZOO_MY_ID is {their_id:?}"
                    ));
                }
            }
        }
        let command = command_text(service);
        for marker in ["sentinel monitor mymaster ", "--replicaof "] {
            if let Some(at) = command.find(marker) {
                let mut words = command[at + marker.len()..].split_whitespace();
                let host = words.next().unwrap_or("");
                let port = words
                    .next()
                    .unwrap_or("")
                    .trim_matches(|c: char| !c.is_ascii_digit())
                    .parse()
                    .unwrap_or(0);
                check(&mut errors, name, marker.trim(), host, port);
            }
        }
        // What is published and what is health-checked is what it listens on.
        let own = || service_ports(&services, name);
        for published in published(service) {
            let container = port_of(&published);
            if !own().contains(&container) {
                errors.push(format!(
                    "{name}: publishes container port {container}, and listens on {:?}",
                    own()
                ));
            }
        }
        let test = service
            .get("healthcheck")
            .and_then(|h| h.get("test"))
            .map(|t| serde_yaml::to_string(t).unwrap())
            .unwrap_or_default();
        for marker in ["http://127.0.0.1:", "/dev/tcp/127.0.0.1/", "redis-cli -p "] {
            if let Some(port) = port_after(&test, marker) {
                if !own().contains(&port) {
                    errors.push(format!(
                        "{name}: its healthcheck asks port {port}, and it listens on {:?}",
                        own()
                    ));
                }
            }
        }
    }
    errors
}

#[test]
fn every_url_names_a_service_of_compose_and_a_port_it_listens_on() {
    let compose = compose();
    let errors = wiring_errors(&compose);
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    // The check sees what it is there for: a misspelt service, a wrong port.
    let broken = |service: &str, var: &str, value: &str| {
        let mut c = compose.clone();
        c["services"][service]["environment"][var] = Value::String(value.to_owned());
        wiring_errors(&c)
    };
    let typo = broken("worker-2", "WORKER_GATEWAY", "http://balancr:8080");
    assert!(
        typo.iter().any(|e| e.contains("no service balancr")),
        "{typo:?}"
    );
    let port = broken("worker-1", "REDIS_URL", "redis://redis:6380");
    assert!(port.iter().any(|e| e.contains("redis:6380")), "{port:?}");
    let issuer = broken(
        "gateway",
        "GATEWAY_ISSUERS",
        "zookeeper=zookeeper://zk1:2181,zk4:2181",
    );
    assert!(
        issuer.iter().any(|e| e.contains("no service zk4")),
        "{issuer:?}"
    );
    let listen = broken("gateway-2", "GATEWAY_LISTEN", "0.0.0.0:8084");
    assert!(
        listen
            .iter()
            .any(|e| e.contains("publishes container port 8083")),
        "{listen:?}"
    );
}

#[test]
fn url_parsing_finds_every_host_of_a_value() {
    assert_eq!(
        endpoints(
            "DATABASE_URL",
            "postgres://postgres:demo@postgres:5432,postgres-standby:5432/pages?target_session_attrs=read-write"
        ),
        [("postgres".to_owned(), 5432), ("postgres-standby".to_owned(), 5432)]
    );
    assert_eq!(
        endpoints(
            "GATEWAY_ISSUERS",
            "redis-sentinel=redis-sentinel://s1:26379,s2/mymaster"
        ),
        [("s1".to_owned(), 26379), ("s2".to_owned(), 26379)]
    );
    assert_eq!(
        endpoints("REDLOCK_URLS", "redis://a:1,redis://b"),
        [("a".to_owned(), 1), ("b".to_owned(), 6379)]
    );
    assert_eq!(
        endpoints("WORKER_GATEWAY", "http://balancer:8080"),
        [("balancer".to_owned(), 8080)]
    );
    assert!(endpoints("GATEWAY_LISTEN", "0.0.0.0:8082").is_empty());
}
