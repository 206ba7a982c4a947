//! compose.yaml, the Dockerfile and scripts/stack agree with the binaries.
//!
//! No Docker engine runs on these machines, so nothing here starts a container:
//! - compose.yaml is validated by Debian's `docker-compose config` when it is
//!   installed (`.ci/run` installs it), and parsed here with serde_yaml always;
//! - every variable compose passes to a gateway or worker service is one of the
//!   binary's clap arguments (`Config::command()`), and its value parses and
//!   validates, for every `BACKEND`;
//! - the Dockerfile builds and copies exactly the bin targets that `cargo
//!   metadata` lists for the gateway and worker packages, with the workspace's
//!   default features, and compose runs only those binaries;
//! - `scripts/stack env NAME` gives each service the same variables and the same
//!   worker settings as compose.yaml (hosts and ports of the backing services
//!   differ by design: see scripts/stack; key files are the same files, mounted
//!   as compose secrets);
//! - trust: both gateways require keys from demo/api-keys, every worker sends
//!   its own client's key, the fenced gateway checks tokens with all five lock
//!   services (the same ones the workers use) and the unfenced one with none,
//!   and the gateways are published on 127.0.0.1 only;
//! - wiring (issue 16): every host a URL or address names is a service of
//!   compose.yaml and its port one that service listens on; every image is
//!   pinned to a full patch release; the workers run under `init: true`;
//!   ZooKeeper's tick time allows the workers' session timeout; each
//!   healthcheck asks the service's own port; an exported `BACKEND` reaches
//!   the straggler; the image is stripped and has no TLS stack to offer.
//!
//! scripts/compose-smoke (tests/tests/compose_smoke.rs) runs all of this for
//! real, with podman.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory;
use serde_yaml::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The variables read outside clap: tracing's EnvFilter reads RUST_LOG.
const READ_OUTSIDE_CLAP: &[&str] = &["RUST_LOG"];

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
    "GATEWAY_ISSUERS",
];

/// Variables naming a file: in compose a secret under /run/secrets/, in
/// scripts/stack the secret's file itself.
const FILE_VARS: &[&str] = &["GATEWAY_API_KEYS_FILE", "GATEWAY_ADMIN_KEYS_FILE"];

/// The issuers the fenced gateway must trust: every backend with a token.
const ISSUERS: [&str; 5] = [
    "redis",
    "zookeeper",
    "redis-sentinel",
    "lease-postgres",
    "lease-mysql",
];

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

/// A service's environment after interpolation.
fn environment(service: &Value, vars: &BTreeMap<&str, &str>) -> BTreeMap<String, String> {
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

/// The program a service runs from our image (`gateway` or `worker`), if any.
fn our_binary(service: &Value) -> Option<String> {
    service.get("build")?;
    let command = service.get("command")?.as_sequence()?;
    Some(command.first()?.as_str()?.to_owned())
}

fn clap_command(binary: &str) -> clap::Command {
    match binary {
        "gateway" => gateway::Config::command(),
        "worker" => worker::config::Config::command(),
        other => panic!("compose runs {other:?}, which is not a binary of this workspace"),
    }
}

/// Turn variables into command-line arguments (so the check does not depend
/// on this process's own environment), failing on any the binary lacks.
fn as_args(binary: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let command = clap_command(binary);
    let mut args = vec![binary.to_owned()];
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

#[test]
fn compose_file_passes_docker_compose_config() {
    let Ok(out) = Command::new("docker-compose").arg("version").output() else {
        println!("SKIPPED: docker-compose is not installed (apt-get install docker-compose; .ci/run does); the serde_yaml checks still ran");
        return;
    };
    assert!(out.status.success(), "docker-compose version failed");
    for profile in [&[][..], &["--profile", "redlock", "--profile", "demo"][..]] {
        let out = Command::new("docker-compose")
            .current_dir(repo())
            .args(["-f", "compose.yaml"])
            .args(profile)
            .args(["config", "-q"])
            .output()
            .expect("run docker-compose config");
        assert!(
            out.status.success(),
            "docker-compose {profile:?} config -q rejects compose.yaml:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_service_is_pinned_healthchecked_and_waits_for_healthy_dependencies() {
    let compose = compose();
    let services = services(&compose);
    for name in [
        "postgres",
        "redis",
        "zk1",
        "zk2",
        "zk3",
        "redis-master",
        "redis-replica",
        "sentinel-1",
        "sentinel-2",
        "sentinel-3",
        "mariadb",
        "gateway",
        "gateway-unfenced",
        "worker-1",
        "worker-2",
        "worker-3",
        "redlock-1",
        "redlock-5",
    ] {
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
        let test = service
            .get("healthcheck")
            .and_then(|h| h.get("test"))
            .unwrap_or_else(|| panic!("{name} has no healthcheck"));
        assert!(
            test.as_sequence().is_some_and(|t| !t.is_empty()),
            "{name}: empty healthcheck"
        );
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
                assert_eq!(
                    spec.get("condition").and_then(Value::as_str),
                    Some("service_healthy"),
                    "{name} must wait for {dep} to be healthy"
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
    let gateway = environment(&services["gateway"], &BTreeMap::new());
    let unfenced = environment(&services["gateway-unfenced"], &BTreeMap::new());
    assert_eq!(gateway["GATEWAY_FENCING"], "enforce");
    assert_eq!(unfenced["GATEWAY_FENCING"], "off");
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
        // Redlock has no fencing token: the README runs it with fencing off.
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
            let args = as_args(&binary, &env);
            match binary.as_str() {
                "gateway" => {
                    use clap::Parser;
                    let config = gateway::Config::try_parse_from(&args)
                        .unwrap_or_else(|e| panic!("{name}: gateway rejects {args:?}: {e}"));
                    // Keys read from the demo files and issuers parsed, as at start.
                    config.trust_options().unwrap_or_else(|e| {
                        panic!("{name}: the gateway would refuse to start: {e:#}")
                    });
                }
                "worker" => {
                    use clap::Parser;
                    let config = worker::config::Config::try_parse_from(&args)
                        .unwrap_or_else(|e| panic!("{name}: worker rejects {args:?}: {e}"));
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
fn redlock_with_fencing_on_is_refused_as_the_readme_says() {
    use clap::Parser;
    let services = services(&compose());
    let env = environment(
        &services["worker-1"],
        &BTreeMap::from([("BACKEND", "redlock")]),
    );
    let config = worker::config::Config::try_parse_from(as_args("worker", &env)).expect("parses");
    assert_eq!(
        config.validate(),
        Err(worker::config::ConfigError::RedlockNeedsFencingOff)
    );
}

#[derive(serde::Deserialize)]
struct Metadata {
    packages: Vec<Package>,
}

#[derive(serde::Deserialize)]
struct Package {
    name: String,
    targets: Vec<Target>,
}

#[derive(serde::Deserialize)]
struct Target {
    name: String,
    kind: Vec<String>,
}

#[test]
fn dockerfile_builds_and_copies_the_binaries_the_workspace_defines() {
    let out = Command::new(env!("CARGO"))
        .current_dir(repo())
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Metadata = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("read Dockerfile");

    // The one `cargo build` line: its packages, and no feature changes.
    let build: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.contains("cargo build"))
        .collect();
    assert_eq!(
        build.len(),
        1,
        "expected one cargo build line, got {build:?}"
    );
    let words: Vec<&str> = build[0].split_whitespace().collect();
    for flag in ["--release", "--locked"] {
        assert!(
            words.contains(&flag),
            "the Docker build lacks {flag}: {}",
            build[0]
        );
    }
    assert!(
        !words.iter().any(|w| w.contains("features")),
        "the Docker build changes features; the workspace builds with the defaults: {}",
        build[0]
    );
    let packages: BTreeSet<&str> = words
        .windows(2)
        .filter(|w| w[0] == "-p" || w[0] == "--package")
        .map(|w| w[1])
        .collect();
    assert_eq!(packages, BTreeSet::from(["gateway", "worker"]));

    let bins: BTreeSet<String> = metadata
        .packages
        .iter()
        .filter(|p| packages.contains(p.name.as_str()))
        .flat_map(|p| &p.targets)
        .filter(|t| t.kind.iter().any(|k| k == "bin"))
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(
        bins,
        BTreeSet::from(["gateway".to_owned(), "worker".to_owned()]),
        "the gateway and worker packages define these binaries"
    );
    for bin in &bins {
        assert!(
            dockerfile.contains(&format!("target/release/{bin}")),
            "the Dockerfile does not take {bin} out of the build stage"
        );
        assert!(
            dockerfile.contains(&format!("/out/{bin}")),
            "the Dockerfile does not copy {bin} into the runtime image"
        );
    }
    for (name, service) in services(&compose()) {
        if let Some(binary) = our_binary(&service) {
            assert!(
                bins.contains(&binary),
                "{name} runs {binary}, which the image lacks"
            );
        }
    }

    // The runtime stage runs as a non-root user and has a healthcheck.
    let runtime = dockerfile.rsplit("\nFROM ").next().unwrap();
    let user = runtime
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the runtime image sets USER");
    assert!(
        !["root", "0"].contains(&user.trim()),
        "the runtime image runs as root"
    );
    assert!(
        runtime.contains("HEALTHCHECK"),
        "the runtime image has no HEALTHCHECK"
    );
}

/// `scripts/stack env NAME`, with the defaults (none of the caller's overrides).
fn stack_env(name: &str) -> BTreeMap<String, String> {
    let out = Command::new(repo().join("scripts/stack"))
        .args(["env", name])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .expect("run scripts/stack env");
    assert!(
        out.status.success(),
        "scripts/stack env {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=value");
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// What a connection value says apart from its host and port: the scheme and
/// the path (database name), or for GATEWAY_LISTEN / WORKER_GATEWAY the port
/// the user sees.
fn connection_shape(name: &str, value: &str) -> String {
    match name {
        "GATEWAY_LISTEN" | "WORKER_GATEWAY" => {
            value.rsplit(':').next().unwrap_or_default().to_owned()
        }
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
                let path = rest.split_once('/').map(|(_, p)| p).unwrap_or("");
                format!("{scheme}:/{path}")
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
        let want = environment(&service, &BTreeMap::new());
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
fn every_writer_sends_its_own_key_and_the_gateways_check_what_the_readme_says() {
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

    let mut workers = 0;
    for (name, service) in &services {
        for port in service
            .get("ports")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let port = scalar(port);
            assert!(
                port.starts_with("127.0.0.1:"),
                "{name} publishes {port} on every interface, not on 127.0.0.1 only"
            );
        }
        if our_binary(service).as_deref() != Some("worker") {
            continue;
        }
        let env = environment(service, &BTreeMap::new());
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
        let env = environment(service, &BTreeMap::new());
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
        let worker = environment(&services["worker-1"], &BTreeMap::new());
        let issuers: BTreeMap<&str, &str> = env["GATEWAY_ISSUERS"]
            .split_whitespace()
            .map(|e| e.split_once('=').expect("name=url"))
            .collect();
        assert_eq!(
            issuers.keys().copied().collect::<BTreeSet<_>>(),
            BTreeSet::from(ISSUERS),
            "the fenced gateway trusts every backend with a token, and only those"
        );
        assert_eq!(issuers["redis"], worker["REDIS_URL"]);
        assert_eq!(
            issuers["zookeeper"],
            format!("zookeeper://{}", worker["ZOOKEEPER_CONNECT"])
        );
        // The whole ensemble, and the sentinels with the master's name.
        assert_eq!(
            worker["ZOOKEEPER_CONNECT"].split(',').count(),
            3,
            "the workers connect to all three ZooKeeper servers"
        );
        assert_eq!(
            issuers["redis-sentinel"],
            format!(
                "redis-sentinel://{}/{}",
                worker["REDIS_SENTINELS"], worker["REDIS_SENTINEL_MASTER"]
            )
        );
        assert_eq!(issuers["lease-postgres"], worker["DATABASE_URL"]);
        assert_eq!(issuers["lease-mysql"], worker["MYSQL_URL"]);
    }
}

#[test]
fn connection_shape_ignores_hosts_but_not_databases() {
    assert_eq!(
        connection_shape(
            "DATABASE_URL",
            "postgres://postgres:demo@postgres:5432/pages"
        ),
        connection_shape("DATABASE_URL", "postgres://postgres@127.0.0.1:15432/pages")
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

// ---- Issue 15: the PostgreSQL standby, two fenced gateways, the balancer ----

/// `scripts/stack services`: the services it can start, one a line.
fn stack_services() -> BTreeSet<String> {
    let out = Command::new(repo().join("scripts/stack"))
        .arg("services")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .expect("run scripts/stack services");
    assert!(
        out.status.success(),
        "scripts/stack services: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_owned)
        .collect()
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
    // Issue 14: the ZooKeeper ensemble and the Sentinel group, in both.
    for name in [
        "zk1",
        "zk2",
        "zk3",
        "redis-master",
        "redis-replica",
        "sentinel-1",
        "sentinel-2",
        "sentinel-3",
    ] {
        assert!(compose.contains(name), "no {name}");
    }
}

/// The fenced gateways: our gateway binary with GATEWAY_FENCING=enforce.
fn fenced_gateways(services: &BTreeMap<String, Value>) -> Vec<String> {
    services
        .iter()
        .filter(|(_, s)| our_binary(s).as_deref() == Some("gateway"))
        .filter(|(_, s)| {
            environment(s, &BTreeMap::new())
                .get("GATEWAY_FENCING")
                .map(String::as_str)
                == Some("enforce")
        })
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
        let mut env = environment(&services[name], &BTreeMap::new());
        let listen = env.remove("GATEWAY_LISTEN").expect("GATEWAY_LISTEN");
        (env, listen)
    };
    let (one, listen_1) = without_listen("gateway");
    let (two, listen_2) = without_listen("gateway-2");
    assert_eq!(one, two, "gateway and gateway-2 differ beyond their port");
    assert_ne!(listen_1, listen_2);

    // Every gateway (the unfenced one too) names the primary and the standby
    // and wants the one that accepts writes; the stack's do the same.
    for (name, service) in &services {
        if our_binary(service).as_deref() != Some("gateway") {
            continue;
        }
        let env = environment(service, &BTreeMap::new());
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
    let standby_env = environment(standby, &BTreeMap::new());
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
    for (name, service) in &services {
        if our_binary(service).as_deref() != Some("worker") || name == "straggler-unfenced" {
            continue;
        }
        let env = environment(service, &BTreeMap::new());
        assert_eq!(env["WORKER_GATEWAY"], "http://balancer:8080", "{name}");
    }

    // The balancer: the official haproxy image with demo/haproxy, published
    // where the README's curls go, health-checking exactly the fenced
    // gateways on /readyz.
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
            let env = environment(&services[name], &BTreeMap::new());
            let port = env["GATEWAY_LISTEN"].rsplit(':').next().unwrap().to_owned();
            format!("{name} {name}:{port} check")
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
    let out = Command::new(haproxy)
        .args(["-c", "-f"])
        .arg(dir.path().join("haproxy.cfg"))
        .output()
        .expect("run haproxy -c");
    assert!(
        out.status.success(),
        "haproxy -c rejects demo/haproxy/haproxy.cfg:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- Issue 16: wiring, pinning, init, tick time, healthchecks ----------------

/// Whether `image` names a full patch release: `NAME:X.Y.Z` with an optional
/// `-variant` (`-bookworm`), or `X.Y` for PostgreSQL, whose releases have two
/// numbers since version 10. Not `latest`, `15`, `7.0` or `3.8`.
fn pinned_to_a_patch_release(image: &str) -> bool {
    let Some((name, tag)) = image.rsplit_once(':') else {
        return false;
    };
    let version = tag.split_once('-').map_or(tag, |(v, _)| v);
    let parts: Vec<&str> = version.split('.').collect();
    let numeric = parts
        .iter()
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let wanted = if name.rsplit('/').next() == Some("postgres") {
        2
    } else {
        3
    };
    numeric && parts.len() >= wanted
}

#[test]
fn pinning_means_a_full_patch_release() {
    for good in [
        "postgres:15.18-bookworm",
        "redis:8.10.2-trixie",
        "zookeeper:3.8.7",
        "mariadb:10.11.19",
        "haproxy:2.6.33",
        "rust:1.95.0-bookworm",
    ] {
        assert!(pinned_to_a_patch_release(good), "{good}");
    }
    for bad in [
        "redis:7.0",
        "zookeeper:3.8",
        "postgres:15",
        "postgres:15-bookworm",
        "haproxy:lts",
        "mariadb",
        "redis:7.x.1",
        "redis:latest",
    ] {
        assert!(!pinned_to_a_patch_release(bad), "{bad}");
    }
}

#[test]
fn the_builder_image_is_pinned_too() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("read Dockerfile");
    let builder = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("FROM rust:"))
        .expect("the Dockerfile builds FROM rust:<version>");
    let image = format!("rust:{}", builder.split_whitespace().next().unwrap());
    assert!(pinned_to_a_patch_release(&image), "{image}");
}

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
        "GATEWAY_LISTEN" => Vec::new(),
        "ZOOKEEPER_CONNECT" => host_list(value, 2181),
        "REDIS_SENTINELS" => host_list(value, 26379),
        "REDLOCK_URLS" => value.split(',').flat_map(url_endpoints).collect(),
        "GATEWAY_ISSUERS" => value
            .split_whitespace()
            .flat_map(|entry| url_endpoints(entry.split_once('=').expect("name=url").1))
            .collect(),
        _ => url_endpoints(value),
    }
}

/// A service's command as one string (list or shell form).
fn command_text(service: &Value) -> String {
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
    let env = environment(service, &BTreeMap::new());
    if our_binary(service).as_deref() == Some("gateway") {
        let listen = &env["GATEWAY_LISTEN"];
        return BTreeSet::from([listen.rsplit(':').next().unwrap().parse().unwrap()]);
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
            BTreeSet::from([client.rsplit(':').next().unwrap().parse().unwrap()])
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
        let env = environment(service, &BTreeMap::new());
        for (var, value) in &env {
            if CONNECTION_VARS.contains(&var.as_str()) {
                for (host, port) in endpoints(var, value) {
                    check(&mut errors, name, var, &host, port);
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
                let client = ports.rsplit(';').next().unwrap();
                let client: u16 = client.rsplit(':').next().unwrap().parse().unwrap();
                check(&mut errors, name, "ZOO_SERVERS", host, client);
                let their_id = services
                    .get(host)
                    .map(|s| environment(s, &BTreeMap::new()))
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
        for published in service
            .get("ports")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let container: u16 = scalar(published)
                .rsplit(':')
                .next()
                .unwrap()
                .parse()
                .unwrap();
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

#[test]
fn workers_run_under_init_so_the_straggler_can_stop_itself() {
    let services = services(&compose());
    let mut workers = 0;
    for (name, service) in &services {
        if our_binary(service).as_deref() != Some("worker") {
            continue;
        }
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
        let env = environment(&services[name], &BTreeMap::new());
        assert_eq!(env["WORKER_STOP_SELF_AT"], "writing", "{name}");
        assert_eq!(services[name]["restart"].as_str(), Some("no"), "{name}");
    }
}

#[test]
fn zookeeper_tick_time_allows_the_workers_session_timeout() {
    use clap::Parser;
    let services = services(&compose());
    // ZooKeeper grants session timeouts between 2 and 20 ticks (its default
    // minSessionTimeout and maxSessionTimeout); the worker asks for its TTL.
    for (name, service) in &services {
        if our_binary(service).as_deref() != Some("worker") {
            continue;
        }
        let env = environment(service, &BTreeMap::new());
        let config = worker::config::Config::try_parse_from(as_args("worker", &env)).unwrap();
        let ttl = config.ttl.as_millis();
        for zk in ["zk1", "zk2", "zk3"] {
            let zk_env = environment(&services[zk], &BTreeMap::new());
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
    let primary_db = environment(&services["postgres"], &BTreeMap::new())["POSTGRES_DB"].clone();
    for (name, service) in &services {
        let env = environment(service, &BTreeMap::new());
        let image = service.get("image").and_then(Value::as_str).unwrap_or("");
        let got = test(name);
        let want = match (our_binary(service).as_deref(), image.split(':').next()) {
            (Some("gateway"), _) => {
                let port = env["GATEWAY_LISTEN"].rsplit(':').next().unwrap().to_owned();
                format!("curl -fsS http://127.0.0.1:{port}/healthz")
            }
            (Some("worker"), _) => "curl -fsS \"$$WORKER_GATEWAY/readyz\" >/dev/null".into(),
            (_, Some("postgres")) => format!("pg_isready -U postgres -d {primary_db}"),
            (_, Some("mariadb")) => "healthcheck.sh --connect --innodb_initialized".into(),
            (_, Some("zookeeper")) => "zkServer.sh status".into(),
            (_, Some("haproxy")) => "bash -c exec 3<>/dev/tcp/127.0.0.1/8080".into(),
            (_, Some("redis")) if command_text(service).contains("redis-sentinel") => {
                "redis-cli -p 26379 sentinel get-master-addr-by-name mymaster | grep -q .".into()
            }
            (_, Some("redis")) => "redis-cli ping".into(),
            other => panic!("{name}: no expected healthcheck for {other:?}"),
        };
        assert_eq!(got, want, "{name}");
    }
    // The sentinels are asked about the master they monitor, on their port.
    let sentinel = command_text(&services["sentinel-1"]);
    assert!(sentinel.contains("'port 26379'") && sentinel.contains("monitor mymaster "));
}

#[test]
fn an_exported_backend_reaches_the_straggler() {
    // As compose interpolates: the straggler and the workers get the same
    // backend from one BACKEND in the environment (README step 10: `export`).
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
    let Ok(version) = Command::new("docker-compose").arg("version").output() else {
        println!("SKIPPED (docker-compose part): docker-compose is not installed");
        return;
    };
    assert!(version.status.success());
    for (backend, want) in [(Some("redis"), "redis"), (None, "zookeeper")] {
        let mut command = Command::new("docker-compose");
        command
            .current_dir(repo())
            .args(["-f", "compose.yaml", "--profile", "demo", "config"])
            .env_remove("BACKEND");
        if let Some(backend) = backend {
            command.env("BACKEND", backend);
        }
        let out = command.output().expect("run docker-compose config");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
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

#[test]
fn the_image_ships_stripped_binaries_and_no_tls_it_cannot_use() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("read Dockerfile");
    let (build, runtime) = dockerfile
        .rsplit_once("\nFROM ")
        .expect("a build stage and a runtime stage");
    assert!(
        build.contains("CARGO_PROFILE_RELEASE_STRIP=symbols"),
        "the build stage does not strip the release binaries"
    );
    let instructions: String = runtime
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    assert!(
        !instructions.contains("ca-certificates"),
        "the runtime image installs ca-certificates, and nothing in it speaks TLS"
    );
    // Nothing points a worker at an https:// gateway, which it refuses.
    for (name, service) in services(&compose()) {
        if let Some(url) = environment(&service, &BTreeMap::new()).get("WORKER_GATEWAY") {
            assert!(url.starts_with("http://"), "{name}: {url}");
        }
    }
}

#[test]
fn every_down_in_the_readme_removes_the_profiles_and_the_volumes() {
    // `down` alone leaves the containers of profiles it was not given
    // (straggler, redlock-N) and the anonymous volumes of the databases'
    // images: the README's "a fresh one again" needs every profile and -v.
    let compose = compose();
    let profiles: BTreeSet<String> = services(&compose)
        .values()
        .filter_map(|s| s.get("profiles").and_then(Value::as_sequence))
        .flatten()
        .map(scalar)
        .collect();
    assert!(profiles.contains("demo") && profiles.contains("redlock"));
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("read README.md");
    let downs: Vec<String> = harness::transcript::blocks(&readme)
        .into_iter()
        .filter(|b| b.info == "sh")
        .flat_map(|b| b.lines)
        .filter(|l| l.starts_with("docker compose ") && l.contains(" down"))
        .collect();
    assert!(
        !downs.is_empty(),
        "the README says how to take the demo down"
    );
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
