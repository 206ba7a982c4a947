//! compose.yaml, the Dockerfile and scripts/stack agree with the binaries.
//!
//! No Docker engine runs on these machines, so nothing here starts a
//! container (scripts/compose-smoke, [`crate::compose_smoke`], runs all of
//! this for real, with podman). This module reads compose.yaml and
//! scripts/stack; the checks, by role:
//! - [`topology`]: compose.yaml passes `docker-compose config`; every service
//!   is pinned, health-checked (on what it is for) and waits for healthy
//!   dependencies; compose and scripts/stack define the same services; the
//!   standby and the balancer in front of the fenced gateways; the workers
//!   run under `init: true`; every `down` of the docs removes everything;
//! - [`variables`]: every variable compose passes to a gateway or worker is
//!   one of the binary's clap arguments, and its value parses and validates,
//!   for every `BACKEND`; `scripts/stack env NAME` gives each service the
//!   same (hosts and ports of the backing services differ by design, key
//!   files are the same files, mounted as compose secrets); ZooKeeper's tick
//!   time allows the workers' session timeout; an exported `BACKEND` reaches
//!   the straggler;
//! - [`image`]: the Dockerfile builds and copies exactly the bin targets that
//!   `cargo metadata` lists, with the default features, stripped, without a
//!   TLS stack, from pinned images;
//! - [`trust`]: both gateways require keys from demo/api-keys, every worker
//!   sends its own client's key, the fenced gateway checks tokens with all
//!   five lock services (the ones the workers use) and the unfenced one with
//!   none, and the gateways are published on 127.0.0.1 only;
//! - [`wiring`]: every host a URL or address names is a service of
//!   compose.yaml and its port one that service listens on.

mod image;
mod topology;
mod trust;
mod variables;
mod wiring;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use harness::process::run_ok;
use harness::stack::repo;
use serde_yaml::Value;

/// Variables whose values name a host and port, which differ between compose
/// (service names) and scripts/stack (127.0.0.1 and its own ports).
const CONNECTION_VARS: &[&str] = &[
    "DATABASE_URL",
    "MYSQL_URL",
    "REDIS_URL",
    "REDLOCK_URLS",
    "ZOOKEEPER_CONNECT",
    "REDIS_SENTINELS",
    "WORKER_GATEWAY",
    "GATEWAY_LISTEN",
    "GATEWAY_PROBE_LISTEN",
    "GATEWAY_ISSUERS",
    "GATEWAY_TRUSTED_PROXIES",
    "GATEWAY_SETUP_ZOOKEEPER_URL",
    "GATEWAY_SETUP_MYSQL_URL",
];

/// Variables naming a file: in compose a secret under /run/secrets/, in
/// scripts/stack the secret's file itself.
const FILE_VARS: &[&str] = &["GATEWAY_API_KEYS_FILE", "GATEWAY_ADMIN_KEYS_FILE"];

fn compose() -> Value {
    let text = std::fs::read_to_string(repo().join("compose.yaml")).expect("read compose.yaml");
    let mut value: Value = serde_yaml::from_str(&text).expect("compose.yaml is valid YAML");
    // apply_merge resolves one level of `<<` per mapping; ours nest (worker-1
    // merges x-worker, which merges x-app), so repeat until none is left.
    for _ in 0..8 {
        value.apply_merge().expect("compose.yaml merge keys");
    }
    assert!(
        !serde_yaml::to_string(&value).unwrap().contains("<<:"),
        "merge keys nested deeper than 8 levels"
    );
    value
}

fn services(compose: &Value) -> BTreeMap<String, Value> {
    let services = compose
        .get("services")
        .and_then(Value::as_mapping)
        .expect("compose.yaml has services");
    services
        .iter()
        .map(|(k, v)| (k.as_str().expect("service name").to_owned(), v.clone()))
        .collect()
}

/// `${VAR:-default}` and `${VAR}` as compose interpolates them, with `vars`
/// standing in for the caller's environment.
fn interpolate(text: &str, vars: &BTreeMap<&str, &str>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').expect("unclosed ${") + start;
        let inner = &rest[start + 2..end];
        let (name, default) = inner.split_once(":-").unwrap_or((inner, ""));
        out.push_str(vars.get(name).copied().unwrap_or(default));
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("environment value {other:?} is not a scalar"),
    }
}

/// A service's environment after interpolation, as its binary sees it: the
/// file SECRETS_FILE names (a secret) read in, without overriding.
fn environment(service: &Value, vars: &BTreeMap<&str, &str>) -> BTreeMap<String, String> {
    let mut env = raw_environment(service, vars);
    if let Some(path) = env.remove("SECRETS_FILE") {
        let file = secret_file(&compose(), service, &path);
        let lines = dotenvy::from_path_iter(&file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        for line in lines {
            let (key, value) = line.unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            env.entry(key).or_insert(value);
        }
    }
    env
}

/// A service's environment as compose.yaml writes it, after interpolation.
fn raw_environment(service: &Value, vars: &BTreeMap<&str, &str>) -> BTreeMap<String, String> {
    let Some(env) = service.get("environment") else {
        return BTreeMap::new();
    };
    let env = env
        .as_mapping()
        .expect("environment is a mapping (KEY: value)");
    env.iter()
        .map(|(k, v)| {
            (
                k.as_str().expect("variable name").to_owned(),
                interpolate(&scalar(v), vars),
            )
        })
        .collect()
}

/// A service's environment as compose gives it with none of the caller's
/// variables set (the defaults of every `${VAR:-default}`).
fn defaults(service: &Value) -> BTreeMap<String, String> {
    environment(service, &BTreeMap::new())
}

/// The program a service runs from our image (`gateway` or `worker`), if any.
fn our_binary(service: &Value) -> Option<String> {
    service.get("build")?;
    let command = service.get("command")?.as_sequence()?;
    Some(command.first()?.as_str()?.to_owned())
}

/// The ports a service publishes (`127.0.0.1:8080:8080`).
fn published(service: &Value) -> Vec<String> {
    let ports = service.get("ports").and_then(Value::as_sequence);
    ports.into_iter().flatten().map(scalar).collect()
}

/// The port at the end of an address (`0.0.0.0:8081`, `zk1:2888:3888`,
/// `127.0.0.1:8080:8080`: the container's).
fn port_of(address: &str) -> u16 {
    let port = address.rsplit(':').next().unwrap_or_default();
    port.parse()
        .unwrap_or_else(|_| panic!("no port at the end of {address}"))
}

/// The one-shot services: they run once, to the end, before the ones that
/// wait for them (`service_completed_successfully`); no healthcheck.
const ONE_SHOT: &[&str] = &["setup"];

/// The long-running services that run `binary` (`gateway`, `worker`) from
/// our image.
fn running<'a>(
    services: &'a BTreeMap<String, Value>,
    binary: &'a str,
) -> impl Iterator<Item = (&'a String, &'a Value)> {
    services.iter().filter(move |(name, s)| {
        our_binary(s).as_deref() == Some(binary) && !ONE_SHOT.contains(&name.as_str())
    })
}

/// The file behind `/run/secrets/NAME` in `service`: the secret must be
/// declared at the top level with a `file` and listed by the service.
fn secret_file(compose: &Value, service: &Value, path: &str) -> PathBuf {
    let name = path
        .strip_prefix("/run/secrets/")
        .unwrap_or_else(|| panic!("{path} is not a compose secret (/run/secrets/NAME)"));
    let listed = service
        .get("secrets")
        .and_then(Value::as_sequence)
        .is_some_and(|s| {
            s.iter().any(|e| {
                e.as_str() == Some(name) || e.get("source").and_then(Value::as_str) == Some(name)
            })
        });
    assert!(
        listed,
        "the service reads {path} but does not list the secret {name}"
    );
    let file = compose
        .get("secrets")
        .and_then(|s| s.get(name))
        .and_then(|s| s.get("file"))
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("compose.yaml declares no secret {name} with a file"));
    repo().join(file)
}

/// `scripts/stack ARGS` with the defaults (none of the caller's
/// overrides): the lines it printed.
fn stack_lines(args: &[&str]) -> Vec<String> {
    let out = run_ok(
        Command::new(repo().join("scripts/stack"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default()),
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    text.lines().map(str::to_owned).collect()
}

/// `scripts/stack env NAME`: the variables the stack gives service NAME.
fn stack_env(name: &str) -> BTreeMap<String, String> {
    stack_lines(&["env", name])
        .into_iter()
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=value");
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// `scripts/stack services`: the services it can start.
fn stack_services() -> BTreeSet<String> {
    stack_lines(&["services"]).into_iter().collect()
}

/// Debian's `docker-compose` on compose.yaml, in the repository; `None`,
/// after saying that `what` was skipped, when it is not installed.
fn docker_compose(what: &str) -> Option<Command> {
    if Command::new("docker-compose")
        .arg("version")
        .output()
        .is_err()
    {
        println!("SKIPPED ({what}): docker-compose is not installed (apt-get install docker-compose; .ci/run does)");
        return None;
    }
    let mut command = Command::new("docker-compose");
    command.current_dir(repo()).args(["-f", "compose.yaml"]);
    Some(command)
}
