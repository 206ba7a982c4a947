//! Every variable compose passes to a gateway or worker is one of the
//! binary's clap arguments (`Config::command()`), and its value parses and
//! validates, for every `BACKEND`; `scripts/stack env NAME` gives each
//! service the same variables and settings.

use std::collections::{BTreeMap, BTreeSet};

use clap::{Args, CommandFactory, Parser};
use serde_yaml::Value;

use super::{
    compose, defaults, docker_compose, environment, interpolate, our_binary, running, secret_file,
    services, stack_env, CONNECTION_VARS, FILE_VARS,
};

fn clap_command(binary: &str) -> clap::Command {
    match binary {
        "gateway" => gateway::Config::command(),
        "gateway setup" => gateway::setup::SetupConfig::augment_args(clap::Command::new("setup")),
        "worker" => worker::config::Config::command(),
        other => panic!("compose runs {other:?}, which is not a binary of this workspace"),
    }
}

/// Turn variables into command-line arguments (so the check does not depend
/// on this process's own environment), failing on any the binary lacks.
fn as_args(binary: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let command = clap_command(binary);
    // `gateway setup`: the subcommand's name comes first, as on a command line.
    let mut args = vec![binary.rsplit(' ').next().unwrap_or(binary).to_owned()];
    for (name, value) in env {
        if READ_OUTSIDE_CLAP.contains(&name.as_str()) {
            continue;
        }
        let arg = command
            .get_arguments()
            .find(|a| a.get_env().and_then(|e| e.to_str()) == Some(name.as_str()))
            .unwrap_or_else(|| {
                panic!("compose passes {name} to {binary}, which has no argument reading it")
            });
        let long = arg.get_long().expect("env-backed args have a long flag");
        if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
            if value == "true" {
                args.push(format!("--{long}"));
            }
        } else {
            args.push(format!("--{long}={value}"));
        }
    }
    args
}

/// `gateway setup` where the service runs that subcommand, else `binary`.
fn subcommand_of(binary: &str, service: &Value) -> String {
    let command = serde_yaml::to_string(&service["command"]).unwrap();
    if binary == "gateway" && command.contains("setup") {
        "gateway setup".to_owned()
    } else {
        binary.to_owned()
    }
}

/// The variables read outside clap: tracing's EnvFilter reads RUST_LOG.
const READ_OUTSIDE_CLAP: &[&str] = &["RUST_LOG"];

/// The worker's configuration from compose's variables `env`, as it would
/// start with them.
#[track_caller]
fn worker_config(env: &BTreeMap<String, String>) -> worker::config::Config {
    let args = as_args("worker", env);
    worker::config::Config::try_parse_from(&args)
        .unwrap_or_else(|e| panic!("the worker rejects {args:?}: {e}"))
}

#[test]
fn every_variable_compose_passes_is_one_the_binaries_accept_for_every_backend() {
    let compose = compose();
    let mut checked = BTreeSet::new();
    for backend in [
        "redis",
        "redis-sentinel",
        "zookeeper",
        "lease-postgres",
        "lease-mysql",
        "redlock",
    ] {
        // Redlock has no fencing token: the tutorial runs it with fencing off.
        let mut vars = BTreeMap::from([("BACKEND", backend)]);
        if backend == "redlock" {
            vars.insert("WORKER_FENCING", "off");
            vars.insert("WORKER_GATEWAY", "http://gateway-unfenced:8081");
        }
        for (name, service) in services(&compose) {
            let Some(binary) = our_binary(&service) else {
                continue;
            };
            let mut env = environment(&service, &vars);
            // The secrets' files stand in for /run/secrets/ (what compose mounts).
            for var in FILE_VARS {
                if let Some(path) = env.get(*var).cloned() {
                    let file = secret_file(&compose, &service, &path);
                    env.insert(var.to_string(), file.display().to_string());
                }
            }
            let binary = subcommand_of(&binary, &service);
            let args = as_args(&binary, &env);
            match binary.as_str() {
                "gateway setup" => {
                    gateway::Cli::try_parse_from(
                        std::iter::once("gateway".to_owned()).chain(args.clone()),
                    )
                    .unwrap_or_else(|e| panic!("{name}: gateway rejects {args:?}: {e}"));
                }
                "gateway" => {
                    let config = gateway::Config::try_parse_from(&args)
                        .unwrap_or_else(|e| panic!("{name}: gateway rejects {args:?}: {e}"));
                    // Keys read from the demo files and issuers parsed, as at start.
                    config.trust_options().unwrap_or_else(|e| {
                        panic!("{name}: the gateway would refuse to start: {e:#}")
                    });
                }
                "worker" => {
                    let config = worker_config(&env);
                    config
                        .validate()
                        .unwrap_or_else(|e| panic!("{name} with BACKEND={backend}: {e}"));
                    assert_eq!(config.backend.name(), backend);
                }
                _ => unreachable!(),
            }
            checked.insert(name);
        }
    }
    for name in [
        "gateway",
        "gateway-unfenced",
        "worker-1",
        "worker-2",
        "worker-3",
        "straggler",
    ] {
        assert!(checked.contains(name), "{name} was not checked");
    }
}

#[test]
fn redlock_with_fencing_on_is_refused_as_the_tutorial_says() {
    let services = services(&compose());
    let env = environment(
        &services["worker-1"],
        &BTreeMap::from([("BACKEND", "redlock")]),
    );
    assert_eq!(
        worker_config(&env).validate(),
        Err(worker::config::ConfigError::RedlockNeedsFencingOff)
    );
}

#[test]
fn zookeeper_tick_time_allows_the_workers_session_timeout() {
    let services = services(&compose());
    // ZooKeeper grants session timeouts between 2 and 20 ticks (its default
    // minSessionTimeout and maxSessionTimeout); the worker asks for its TTL.
    for (name, service) in running(&services, "worker") {
        let ttl = worker_config(&defaults(service)).ttl.as_millis();
        for zk in ["zk1", "zk2", "zk3"] {
            let zk_env = defaults(&services[zk]);
            assert!(
                !zk_env.contains_key("ZOO_CFG_EXTRA"),
                "{zk}: extra settings may change the session bounds; check them here"
            );
            let tick: u128 = zk_env["ZOO_TICK_TIME"]
                .parse()
                .expect("ZOO_TICK_TIME in ms");
            assert!(
                (2 * tick..=20 * tick).contains(&ttl),
                "{name}: WORKER_TTL {ttl} ms is outside what {zk} grants with tickTime \
                 {tick} ms ({} to {} ms)",
                2 * tick,
                20 * tick
            );
        }
    }
}

#[test]
fn an_exported_backend_reaches_the_straggler() {
    // As compose interpolates: the straggler and the workers get the same
    // backend from one BACKEND in the environment (tutorial step 10: `export`).
    let services = services(&compose());
    for backend in ["redis", "lease-mysql"] {
        let vars = BTreeMap::from([("BACKEND", backend)]);
        for name in ["worker-1", "straggler", "straggler-unfenced"] {
            assert_eq!(
                environment(&services[name], &vars)["WORKER_BACKEND"],
                backend,
                "{name}"
            );
        }
    }
    // And as docker-compose itself resolves it, with the demo profile.
    for (backend, want) in [(Some("redis"), "redis"), (None, "zookeeper")] {
        let Some(mut command) = docker_compose("the docker-compose part") else {
            return;
        };
        command
            .args(["--profile", "demo", "config"])
            .env_remove("BACKEND");
        if let Some(backend) = backend {
            command.env("BACKEND", backend);
        }
        let out = harness::process::run_ok(&mut command);
        let config: Value = serde_yaml::from_slice(&out.stdout).expect("config YAML");
        for name in ["straggler", "straggler-unfenced", "worker-1"] {
            assert_eq!(
                config["services"][name]["environment"]["WORKER_BACKEND"].as_str(),
                Some(want),
                "{name} with BACKEND={backend:?}"
            );
        }
    }
}

/// What a connection value says apart from its host and port: the scheme and
/// the path (database name), or for GATEWAY_LISTEN / WORKER_GATEWAY the port
/// the user sees.
fn connection_shape(name: &str, value: &str) -> String {
    match name {
        "GATEWAY_LISTEN" | "GATEWAY_PROBE_LISTEN" | "WORKER_GATEWAY" => {
            value.rsplit(':').next().unwrap_or_default().to_owned()
        }
        // The balancer's address differs (a container's, a loopback one):
        // how many balancers are trusted does not.
        "GATEWAY_TRUSTED_PROXIES" => value
            .split([',', ' '])
            .filter(|s| !s.is_empty())
            .count()
            .to_string(),
        // `name=url name=url`: each issuer's name and its URL's shape.
        "GATEWAY_ISSUERS" => value
            .split_whitespace()
            .map(|entry| {
                let (issuer, url) = entry.split_once('=').unwrap_or((entry, ""));
                format!("{issuer}={}", connection_shape("URL", url))
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => value
            .split(',')
            .map(|url| {
                let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
                let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
                // The login: the same in both, hosts and passwords aside.
                let login = authority.rsplit_once('@').map_or("", |(l, _)| l);
                let login = login.split(':').next().unwrap_or_default();
                format!("{scheme}://{login}@/{path}")
            })
            .collect::<Vec<_>>()
            .join(","),
    }
}

#[test]
fn stack_script_gives_each_service_the_variables_and_settings_compose_gives_it() {
    let compose = compose();
    let mut compared = 0;
    for (name, service) in services(&compose) {
        if our_binary(&service).is_none() {
            continue;
        }
        let want = defaults(&service);
        let got = stack_env(&name);
        assert_eq!(
            want.keys().collect::<Vec<_>>(),
            got.keys().collect::<Vec<_>>(),
            "{name}: compose.yaml and scripts/stack pass different variables"
        );
        for (key, value) in &want {
            if FILE_VARS.contains(&key.as_str()) {
                let secret = secret_file(&compose, &service, value);
                assert_eq!(
                    std::fs::canonicalize(&secret).expect("the secret's file"),
                    std::fs::canonicalize(&got[key])
                        .unwrap_or_else(|e| panic!("{name}: {key}={}: {e}", got[key])),
                    "{name}: {key} is the secret {value} (file {}) in compose, {} in scripts/stack",
                    secret.display(),
                    got[key]
                );
            } else if CONNECTION_VARS.contains(&key.as_str()) {
                assert_eq!(
                    connection_shape(key, value),
                    connection_shape(key, &got[key]),
                    "{name}: {key} is {value} in compose, {} in scripts/stack",
                    got[key]
                );
            } else {
                assert_eq!(
                    value, &got[key],
                    "{name}: {key} differs between compose and scripts/stack"
                );
            }
        }
        compared += 1;
    }
    assert!(compared >= 7, "only {compared} services compared");
}

#[test]
fn connection_shape_ignores_hosts_but_not_databases() {
    assert_eq!(
        connection_shape(
            "DATABASE_URL",
            "postgres://fence_gateway:pw@postgres:5432/pages"
        ),
        connection_shape(
            "DATABASE_URL",
            "postgres://fence_gateway:pw@127.0.0.1:15432/pages"
        )
    );
    assert_ne!(
        connection_shape("DATABASE_URL", "postgres://fence_gateway:pw@h:1/pages"),
        connection_shape("DATABASE_URL", "postgres://postgres:pw@h:1/pages")
    );
    assert_ne!(
        connection_shape("DATABASE_URL", "postgres://p@h:1/pages"),
        connection_shape("DATABASE_URL", "postgres://p@h:1/other")
    );
    assert_eq!(connection_shape("GATEWAY_LISTEN", "0.0.0.0:8081"), "8081");
    assert_eq!(
        connection_shape("WORKER_GATEWAY", "http://gateway:8080"),
        "8080"
    );
    assert_eq!(
        interpolate(
            "${BACKEND:-redis}",
            &BTreeMap::from([("BACKEND", "zookeeper")])
        ),
        "zookeeper"
    );
    assert_eq!(interpolate("a ${X:-b} c", &BTreeMap::new()), "a b c");
    assert_eq!(
        connection_shape(
            "GATEWAY_ISSUERS",
            "redis=redis://redis:6379 lease-mysql=mysql://root:demo@mariadb:3306/locks"
        ),
        connection_shape(
            "GATEWAY_ISSUERS",
            "redis=redis://127.0.0.1:16379 lease-mysql=mysql://root@127.0.0.1:13306/locks"
        )
    );
    assert_ne!(
        connection_shape("GATEWAY_ISSUERS", "redis=redis://r:1"),
        connection_shape("GATEWAY_ISSUERS", "zookeeper=redis://r:1")
    );
}
