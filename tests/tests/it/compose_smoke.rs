//! `docker compose up` for real: the tutorial (docs/TUTORIAL.md) followed
//! against the containers of compose.yaml, and the README's five-minute path
//! (`scripts/demo`). Run by `scripts/compose-smoke`, which makes the images
//! (stand-ins for the official ones), starts podman's Docker API and the
//! healthcheck loop podman needs without systemd, and sets `COMPOSE_SMOKE=1`;
//! without it this test only says that it was skipped.
//!
//! In the tutorial's order, on one project:
//! 1. `docker-compose up --build -d` on the unmodified compose.yaml (timed),
//!    then every service running and healthy (timed);
//! 2. every ```` ```console ```` transcript, with the checker of
//!    [`crate::tutorial`] (`harness::transcript`), `docker compose` being
//!    Debian's docker-compose v1 behind a `docker` shim (tests/compose-smoke/bin);
//! 3. the ```` ```sh ```` blocks of step 7 (pause worker-1 past its TTL) and of
//!    steps 7 and 8 (the straggler, fenced and unfenced), run as written, then
//!    checked in the history: the pause cost no acknowledged edit and worker-1
//!    edits again; the fenced straggler's PUT is refused (`token_not_current`
//!    or `stale_token`) and nothing is lost; the unfenced one's lands (`stale`)
//!    and an acknowledged edit is gone from the page;
//! 4. `scripts/demo` as the README writes it (its refused write beside its
//!    lost update);
//! 5. `down` as the tutorial writes it, then no container, network or volume of
//!    the project left.
//!
//! A failure names its step and shows the last log lines of the services it
//! involves.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use harness::process::log_tail as tail;
use harness::stack::{accepted, repo};
use harness::transcript::{self, Block, Run, Step};
use serde_json::Value;

/// Where scripts/compose-smoke keeps its logs (target/compose-smoke).
fn state_dir() -> PathBuf {
    std::env::var_os("COMPOSE_SMOKE_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/compose-smoke"))
}

/// The tutorial's commands of the sh blocks this run executes, each a command
/// line of exactly one block (comments aside).
const PAUSE: &str = "docker compose pause worker-1; sleep 5; docker compose unpause worker-1";
const STRAGGLER: &str = "docker compose --profile demo up -d straggler";
const STRAGGLER_UNFENCED: &str = "docker compose --profile demo up -d straggler-unfenced";
const DOWN: &str = "docker compose --profile demo --profile redlock down -v";

struct Smoke {
    project: String,
    started: Instant,
}

impl Smoke {
    fn elapsed(&self) -> String {
        format!("{:>4}s", self.started.elapsed().as_secs())
    }

    fn note(&self, text: &str) {
        println!("--- [{}] {text}", self.elapsed());
    }

    fn command(program: &str) -> Command {
        let mut command = Command::new(program);
        command.current_dir(repo()).stdin(Stdio::null());
        command
    }

    fn compose(&self, args: &[&str]) -> Output {
        Self::command("docker-compose")
            .args(args)
            .output()
            .expect("run docker-compose")
    }

    fn podman(&self, args: &[&str]) -> String {
        let out = Self::command("podman")
            .args(args)
            .output()
            .expect("run podman");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A tutorial command or block, as a user's shell runs it (bash; errors
    /// stop it), within `timeout`.
    fn shell(&self, script: &str, timeout: Duration) -> Output {
        Self::command("timeout")
            .arg(timeout.as_secs().to_string())
            .args(["bash", "-e", "-c", script])
            .output()
            .expect("run bash")
    }

    /// The last log lines of `services`, for a failure report.
    fn logs(&self, services: &[&str]) -> String {
        if services.is_empty() {
            return String::new();
        }
        let mut args = vec!["logs", "--no-color", "--tail", "40"];
        args.extend_from_slice(services);
        let out = self.compose(&args);
        format!(
            "\n--- last log lines of {} ---\n{}{}",
            services.join(", "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Fail step `step` with `message`, the logs of `services` and the
    /// project's network as each of them sees it.
    #[track_caller]
    fn fail(&self, step: &str, services: &[&str], message: &str) -> ! {
        panic!(
            "compose smoke: FAILED at step: {step}\n{message}{}{}",
            self.logs(services),
            self.network(services)
        );
    }

    /// For a failure report: every container's address(es), and what each of
    /// `services` resolves every service name to (a lock service that "timed
    /// out" right after `docker compose restart` is an address question).
    fn network(&self, services: &[&str]) -> String {
        let addresses = self.inspect_all(
            "{{index .Config.Labels \"com.docker.compose.service\"}} {{.State.Status}} \
             {{range $n, $s := .NetworkSettings.Networks}}{{$n}}={{$s.IPAddress}} {{end}}",
        );
        if addresses.is_empty() {
            return String::new();
        }
        let names: Vec<&str> = addresses
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let mut report = format!("\n--- containers and their addresses ---\n{addresses}");
        for service in services {
            let mut script = String::from("getent hosts");
            for name in &names {
                script.push(' ');
                script.push_str(name);
            }
            script.push_str("; cat /etc/resolv.conf");
            let out = self.compose(&["exec", "-T", service, "sh", "-c", &script]);
            report.push_str(&format!(
                "--- names as {service} resolves them ---\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        report
    }

    /// The services `up` starts: those of `docker-compose config` without a
    /// profile (v1's `config --services` lists the profiles' too).
    fn services(&self) -> Vec<String> {
        let out = self.compose(&["config"]);
        assert!(out.status.success(), "docker-compose config");
        let config: Value = serde_yaml::from_slice(&out.stdout).expect("config YAML");
        config["services"]
            .as_object()
            .expect("services")
            .iter()
            .filter(|(_, service)| service.get("profiles").is_none())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The one-shot services (`restart: "no"`, outside any profile: the
    /// operator's `setup`): they run to the end before what waits for them.
    fn one_shots(&self) -> Vec<String> {
        let out = self.compose(&["config"]);
        let config: Value = serde_yaml::from_slice(&out.stdout).expect("config YAML");
        config["services"]
            .as_object()
            .expect("services")
            .iter()
            .filter(|(_, s)| s.get("profiles").is_none() && s["restart"] == "no")
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The ids of every container of the project.
    fn containers(&self) -> Vec<String> {
        let label = format!("label=com.docker.compose.project={}", self.project);
        self.podman(&["ps", "-aq", "--filter", &label])
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    /// `podman inspect --format FORMAT` of every container of the project
    /// (empty without any).
    fn inspect_all(&self, format: &str) -> String {
        let ids = self.containers();
        if ids.is_empty() {
            return String::new();
        }
        let mut args = vec!["inspect", "--format", format];
        args.extend(ids.iter().map(String::as_str));
        self.podman(&args)
    }

    /// `(service, state, health)` of every container of the project; a
    /// container that exited with status 0 is `completed`.
    fn states(&self) -> Vec<(String, String, String)> {
        self.inspect_all(
            "{{index .Config.Labels \"com.docker.compose.service\"}} {{.State.Status}} {{.State.ExitCode}} {{.State.Health.Status}}",
        )
        .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let service = w.next()?.to_owned();
                let state = match (w.next()?, w.next()?) {
                    ("exited", "0") => "completed".to_owned(),
                    (state, _) => state.to_owned(),
                };
                Some((service, state, w.next().unwrap_or("").to_owned()))
            })
            .collect()
    }

    fn state(&self, service: &str) -> String {
        self.states()
            .into_iter()
            .find(|(s, _, _)| s == service)
            .map(|(_, state, _)| state)
            .unwrap_or_else(|| "absent".into())
    }

    /// `curl -sf http://localhost:8080PATH`, or `None` without an answer.
    fn curl(&self, path: &str) -> Option<String> {
        let out = Self::command("curl")
            .args(["-sf", "--max-time", "10"])
            .arg(format!("http://localhost:8080{path}"))
            .output()
            .expect("run curl");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Page `demo`'s history, oldest first (empty while no gateway answers).
    fn history(&self) -> Vec<Value> {
        let mut entries: Vec<Value> = Vec::new();
        loop {
            let before = entries
                .last()
                .map_or(i64::MAX, |e| e["seq"].as_i64().unwrap_or(0));
            let path = format!("/pages/demo/history?limit=1000&before={before}");
            let Some(got) = self.curl(&path) else {
                return Vec::new();
            };
            let v: Value = serde_json::from_str(&got).expect("history JSON");
            let page = v["history"].as_array().cloned().unwrap_or_default();
            let full = page.len() == 1000;
            entries.extend(page);
            if !full {
                break;
            }
        }
        entries.reverse();
        entries
    }

    /// Acknowledged edits of page `demo` whose line is not in it now.
    fn lost_edits(&self) -> Vec<Value> {
        let history = self.history();
        let page: Value = serde_json::from_str(&self.curl("/pages/demo").unwrap_or_default())
            .unwrap_or(Value::Null);
        transcript::lost_edits(&history, page["body"].as_str().unwrap_or(""))
    }

    /// Wait (bounded) until `done` holds, or fail `step`.
    #[track_caller]
    fn wait(
        &self,
        step: &str,
        services: &[&str],
        what: &str,
        timeout: Duration,
        mut done: impl FnMut() -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        while !done() {
            if Instant::now() > deadline {
                self.fail(step, services, &format!("not within {timeout:?}: {what}"));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// Highest token of an accepted PUT of page `demo` (optionally by `client`).
fn highest_accepted(history: &[Value], client: Option<&str>) -> i64 {
    history
        .iter()
        .filter(|e| accepted(e))
        .filter(|e| client.is_none_or(|c| e["client_id"] == c))
        .filter_map(|e| e["token"].as_i64())
        .max()
        .unwrap_or(0)
}

/// The services a console command touches, for its failure report.
fn services_of(command: &str) -> Vec<String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let mut services: Vec<String> = words
        .windows(3)
        .filter(|w| w[0] == "compose")
        .map(|w| {
            if w[1] == "exec" {
                words
                    .iter()
                    .skip_while(|x| **x != "-T")
                    .nth(1)
                    .unwrap_or(&"")
                    .to_string()
            } else {
                w[2].to_owned()
            }
        })
        .filter(|s| !s.starts_with('$') && !s.is_empty())
        .collect();
    if command.contains("localhost:808") {
        services.extend(["balancer", "gateway", "gateway-2"].map(String::from));
    }
    // The lock service a `worker lock --backend X` talks to.
    let backend = words.windows(2).find(|w| w[0] == "--backend").map(|w| w[1]);
    let lock_services: &[&str] = match backend {
        Some("redis") => &["redis"],
        Some("zookeeper") => &["zk1", "zk2", "zk3"],
        Some("lease-postgres") => &["postgres"],
        Some("lease-mysql") => &["mariadb"],
        Some("redis-sentinel") => &["redis-master", "sentinel-1"],
        _ => &[],
    };
    services.extend(lock_services.iter().map(|s| s.to_string()));
    services.sort();
    services.dedup();
    services
}

/// What the tutorial asks this run to do, in its order.
enum Item {
    Console(Step, Run),
    Sh(&'static str, Block),
}

fn tutorial_items(tutorial: &str) -> Vec<Item> {
    let mut items: Vec<(usize, Item)> = transcript::checked_steps(tutorial)
        .into_iter()
        .map(|(step, run)| (step.line, Item::Console(step, run)))
        .collect();
    for marker in [PAUSE, STRAGGLER, STRAGGLER_UNFENCED] {
        let block = transcript::sh_block_with(tutorial, marker);
        items.push((block.line, Item::Sh(marker, block)));
    }
    items.sort_by_key(|(line, _)| *line);
    items.into_iter().map(|(_, item)| item).collect()
}

#[test]
fn compose_up_runs_the_tutorial_and_the_demo_and_down_leaves_nothing() {
    if std::env::var("COMPOSE_SMOKE").as_deref() != Ok("1") {
        println!(
            "SKIPPED: the compose smoke run needs its images and podman's socket: run scripts/compose-smoke (scripts/test does when podman is installed)"
        );
        return;
    }
    let tutorial =
        std::fs::read_to_string(repo().join(transcript::TUTORIAL)).expect("read the tutorial");
    assert!(
        transcript::has_sh_command(&tutorial, DOWN),
        "{} has no ```sh command `{DOWN}`",
        transcript::TUTORIAL
    );
    let items = tutorial_items(&tutorial);
    let smoke = Smoke {
        project: std::env::var("COMPOSE_PROJECT_NAME").expect("COMPOSE_PROJECT_NAME"),
        started: Instant::now(),
    };

    // 1. up, build included, then everything healthy. docker-compose v1
    // waits for a dependency's health without a limit, and a container that
    // exited keeps its last health status: watch for that, and for the time.
    let step = "docker-compose up --build -d";
    smoke.note(step);
    let up_log = state_dir().join("up.log");
    let mut up = Smoke::command("docker-compose")
        .args(["up", "--build", "-d"])
        .stdout(std::fs::File::create(&up_log).expect("create up.log"))
        .stderr(Stdio::from(
            std::fs::File::options()
                .append(true)
                .open(&up_log)
                .expect("open up.log"),
        ))
        .spawn()
        .expect("run docker-compose up");
    let up_deadline = Instant::now() + Duration::from_secs(40 * 60);
    let one_shots = smoke.one_shots();
    let up_status = loop {
        if let Some(status) = up.try_wait().expect("wait for docker-compose up") {
            break Some(status);
        }
        let exited: Vec<String> = smoke
            .states()
            .into_iter()
            .filter(|(service, state, _)| {
                state == "exited" || (state == "completed" && !one_shots.contains(service))
            })
            .map(|(service, _, _)| service)
            .collect();
        if !exited.is_empty() || Instant::now() > up_deadline {
            let _ = up.kill();
            let _ = up.wait();
            let names: Vec<&str> = exited.iter().map(String::as_str).collect();
            smoke.fail(
                step,
                &names,
                &format!(
                    "exited while `up` waited: {exited:?} (or 40 min passed)\n{}",
                    tail(&up_log, 30)
                ),
            );
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    if !up_status.is_some_and(|s| s.success()) {
        let troubled: Vec<String> = smoke
            .states()
            .into_iter()
            .filter(|(service, state, health)| {
                let done = state == "completed" && one_shots.contains(service);
                !done && (state != "running" || (!health.is_empty() && health != "healthy"))
            })
            .map(|(service, _, _)| service)
            .collect();
        let names: Vec<&str> = troubled.iter().map(String::as_str).collect();
        smoke.fail(step, &names, &tail(&up_log, 60));
    }
    let up_took = smoke.started.elapsed();
    smoke.note(&format!("up returned after {} s", up_took.as_secs()));
    check_binaries_are_stripped(&smoke);

    let step = "every service healthy";
    let services = smoke.services();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let states = smoke.states();
        let waiting: Vec<String> = services
            .iter()
            .filter(|s| {
                !states.iter().any(|(n, state, health)| {
                    n == *s
                        && ((state == "running" && health == "healthy")
                            || (state == "completed" && one_shots.contains(n)))
                })
            })
            .cloned()
            .collect();
        if waiting.is_empty() {
            break;
        }
        // Unhealthy: its retries are spent. Docker would go on checking, but
        // nothing waits for a recovery at start-up: fail now, as for exited.
        let failed: Vec<&str> = states
            .iter()
            .filter(|(service, state, health)| {
                state == "exited"
                    || health == "unhealthy"
                    || (state == "completed" && !one_shots.contains(service))
            })
            .map(|(service, _, _)| service.as_str())
            .collect();
        if !failed.is_empty() {
            // A worker is healthy while the balancer finds a ready gateway:
            // its failure is told by their logs, not by its own.
            let mut shown = failed.clone();
            if failed.iter().any(|s| s.starts_with("worker")) {
                shown.extend(["balancer", "gateway", "gateway-2", "postgres"]);
            }
            smoke.fail(
                step,
                &shown,
                &format!("unhealthy or exited: {failed:?}\n{states:?}"),
            );
        }
        if Instant::now() > deadline {
            let names: Vec<&str> = waiting.iter().map(String::as_str).collect();
            smoke.fail(
                step,
                &names,
                &format!("not running and healthy after 300 s: {waiting:?}\n{states:?}"),
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    smoke.note(&format!(
        "all {} services healthy {} s after `up` began",
        services.len(),
        smoke.started.elapsed().as_secs()
    ));
    // Step 1 reads the workers' page: wait until they have written it.
    smoke.wait(
        "workers write page demo",
        &["worker-1", "worker-2", "worker-3", "gateway"],
        "page demo exists",
        Duration::from_secs(120),
        || smoke.curl("/pages/demo").is_some(),
    );

    // 2. and 3. The tutorial, in its order.
    let mut vars = transcript::Vars::default();
    for item in &items {
        match item {
            Item::Console(step, run) => {
                let result = transcript::run_step(step, run, &mut vars, |command, vars| {
                    let mut script = String::new();
                    for (name, value) in vars {
                        script.push_str(&format!("{name}='{value}'\n"));
                    }
                    script.push_str(command);
                    let out = smoke.shell(&script, Duration::from_secs(180));
                    if !out.status.success() {
                        let services = services_of(command);
                        let names: Vec<&str> = services.iter().map(String::as_str).collect();
                        smoke.fail(
                            &format!("{}:{} `{}`", transcript::TUTORIAL, step.line, step.command),
                            &names,
                            &format!(
                                "exit {:?}\n{}{}",
                                out.status.code(),
                                String::from_utf8_lossy(&out.stdout),
                                String::from_utf8_lossy(&out.stderr)
                            ),
                        );
                    }
                    String::from_utf8_lossy(&out.stdout).into_owned()
                });
                if let Err(difference) = result {
                    let services = services_of(&step.command);
                    let names: Vec<&str> = services.iter().map(String::as_str).collect();
                    smoke.fail(
                        &format!("{}:{} transcript", transcript::TUTORIAL, step.line),
                        &names,
                        &difference,
                    );
                }
            }
            Item::Sh(marker, block) => run_sh_block(&smoke, marker, block),
        }
    }
    smoke.note("the tutorial's transcripts and demos passed");

    // 4. The README's five-minute path on the same stack.
    run_demo(&smoke);

    // 5. down, as the tutorial writes it; nothing of the project left.
    let step = format!("`{DOWN}`");
    let volumes: BTreeSet<String> = smoke
        .containers()
        .iter()
        .flat_map(|id| {
            smoke
                .podman(&[
                    "inspect",
                    "--format",
                    "{{range .Mounts}}{{if eq .Type \"volume\"}}{{.Name}} {{end}}{{end}}",
                    id,
                ])
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    smoke.note(&format!("{DOWN} ({} volumes attached)", volumes.len()));
    let out = smoke.shell(DOWN, Duration::from_secs(180));
    if !out.status.success() {
        smoke.fail(&step, &[], &String::from_utf8_lossy(&out.stderr));
    }
    let label = format!("label=com.docker.compose.project={}", smoke.project);
    let containers = smoke.podman(&["ps", "-a", "--filter", &label, "--format", "{{.Names}}"]);
    let networks = smoke.podman(&["network", "ls", "--format", "{{.Name}}"]);
    let networks: Vec<&str> = networks
        .lines()
        .filter(|n| n.starts_with(&format!("{}_", smoke.project)))
        .collect();
    let all_volumes = smoke.podman(&["volume", "ls", "--format", "{{.Name}}"]);
    let left: Vec<&str> = all_volumes
        .lines()
        .filter(|v| volumes.contains(*v) || v.starts_with(&format!("{}_", smoke.project)))
        .collect();
    if !containers.trim().is_empty() || !networks.is_empty() || !left.is_empty() {
        smoke.fail(
            &format!("nothing left after {step}"),
            &[],
            &format!("containers: {containers:?}\nnetworks: {networks:?}\nvolumes: {left:?}"),
        );
    }
    smoke.note(&format!(
        "passed: up {} s, whole run {} s",
        up_took.as_secs(),
        smoke.started.elapsed().as_secs()
    ));
}

/// The image compose built ships stripped binaries: no symbol table, no
/// debug info, checked with readelf on copies taken out of it.
fn check_binaries_are_stripped(smoke: &Smoke) {
    let step = "the image's binaries are stripped";
    let dir = state_dir().join("binaries");
    std::fs::create_dir_all(&dir).expect("create the binaries dir");
    let name = format!("{}-binaries", smoke.project);
    smoke.podman(&["rm", "-f", &name]);
    smoke.podman(&["create", "--name", &name, "fencing-tokens:dev"]);
    let mut sizes = Vec::new();
    for binary in ["gateway", "worker"] {
        let copy = dir.join(binary);
        let _ = std::fs::remove_file(&copy);
        smoke.podman(&[
            "cp",
            &format!("{name}:/usr/local/bin/{binary}"),
            &copy.display().to_string(),
        ]);
        let sections = Smoke::command("readelf")
            .args(["-S", "-W"])
            .arg(&copy)
            .output()
            .expect("run readelf (binutils)");
        let sections = String::from_utf8_lossy(&sections.stdout);
        let size = std::fs::metadata(&copy).map(|m| m.len()).unwrap_or(0);
        if size == 0 || sections.contains(".symtab") || sections.contains(".debug_") {
            smoke.podman(&["rm", "-f", &name]);
            smoke.fail(
                step,
                &[],
                &format!("/usr/local/bin/{binary} ({size} bytes) is not stripped:\n{sections}"),
            );
        }
        sizes.push(format!("{binary} {:.1} MB", size as f64 / 1e6));
    }
    smoke.podman(&["rm", "-f", &name]);
    smoke.note(&format!("stripped: {}", sizes.join(", ")));
}

/// The README's five-minute path (`scripts/demo`) on the running containers:
/// it prints what the README says, or the run fails here.
fn run_demo(smoke: &Smoke) {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("read README.md");
    let step = transcript::demo_step(&readme);
    let name = format!("README.md:{} `{}`", step.line, step.command);
    smoke.note(&name);
    let out = smoke.shell(&step.command, Duration::from_secs(300));
    let printed = String::from_utf8_lossy(&out.stdout);
    let services = [
        "straggler",
        "straggler-unfenced",
        "gateway",
        "gateway-unfenced",
    ];
    if !out.status.success() {
        smoke.fail(
            &name,
            &services,
            &format!(
                "exit {:?}\n{printed}{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ),
        );
    }
    if let Err(difference) = transcript::check_output("README.md", &step, &printed) {
        smoke.fail(&name, &services, &difference);
    }
}

/// Run one of the tutorial's sh blocks as written, then check what it shows.
fn run_sh_block(smoke: &Smoke, marker: &str, block: &Block) {
    let (name, services): (&str, &[&str]) = match marker {
        PAUSE => ("step 7: pause worker-1 past its TTL", &["worker-1"]),
        STRAGGLER => ("step 7: the straggler, fenced", &["straggler", "gateway"]),
        _ => (
            "step 8: the straggler, unfenced",
            &["straggler-unfenced", "gateway-unfenced"],
        ),
    };
    let step = format!("{name} ({}:{})", transcript::TUTORIAL, block.line);
    smoke.note(&step);
    let before = smoke.history();
    let script = block.lines.join("\n");
    let out = smoke.shell(&script, Duration::from_secs(240));
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        smoke.fail(
            &step,
            services,
            &format!("the block exited {:?}:\n{printed}", out.status.code()),
        );
    }
    println!("{}", printed.trim_end());

    match marker {
        PAUSE => {
            // The lock moved on while worker-1 was frozen, and worker-1 edits
            // again after it (with a token above everything accepted so far).
            let during = smoke.history();
            let moved_on = highest_accepted(&during, None);
            if moved_on <= highest_accepted(&before, None) {
                smoke.fail(&step, services, "no edit was acknowledged during the pause");
            }
            if smoke.state("worker-1") != "running" {
                smoke.fail(&step, services, "worker-1 is not running after unpause");
            }
            smoke.wait(
                &step,
                services,
                "worker-1 gets an edit acknowledged after the pause",
                Duration::from_secs(60),
                || highest_accepted(&smoke.history(), Some("worker-1")) > moved_on,
            );
            let lost = smoke.lost_edits();
            if !lost.is_empty() {
                smoke.fail(
                    &step,
                    services,
                    &format!("acknowledged edits lost: {lost:?}"),
                );
            }
        }
        _ => {
            let client = if marker == STRAGGLER {
                "straggler"
            } else {
                "straggler-unfenced"
            };
            let mut put = None;
            smoke.wait(
                &step,
                services,
                &format!("{client}'s PUT in the history"),
                Duration::from_secs(30),
                || {
                    put = smoke
                        .history()
                        .into_iter()
                        .find(|e| e["client_id"] == client && e["method"] == "PUT");
                    put.is_some()
                },
            );
            let put = put.expect("found");
            let history = smoke.history();
            let get = history
                .iter()
                .find(|e| e["client_id"] == client && e["method"] == "GET")
                .unwrap_or_else(|| smoke.fail(&step, services, "no fenced GET of the straggler"));
            if put["token"] != get["token"] {
                smoke.fail(&step, services, &format!("GET {get} and PUT {put}"));
            }
            let moved_on = history.iter().any(|e| {
                e["client_id"] != client
                    && e["method"] == "PUT"
                    && e["outcome"] == "accepted"
                    && e["token"].as_i64() > put["token"].as_i64()
            });
            if !moved_on {
                smoke.fail(
                    &step,
                    services,
                    &format!(
                        "no other worker edited with a higher token while it was frozen: {put}"
                    ),
                );
            }
            let lost = smoke.lost_edits();
            if marker == STRAGGLER {
                if put["outcome"] != "token_not_current" && put["outcome"] != "stale_token" {
                    smoke.fail(
                        &step,
                        services,
                        &format!("the fenced gateway did not refuse the straggler's PUT: {put}"),
                    );
                }
                if !lost.is_empty() {
                    smoke.fail(
                        &step,
                        services,
                        &format!("acknowledged edits lost: {lost:?}"),
                    );
                }
            } else {
                if put["outcome"] != "stale" {
                    smoke.fail(
                        &step,
                        services,
                        &format!("the unfenced straggler's PUT did not land as stale: {put}"),
                    );
                }
                if lost.is_empty() {
                    smoke.fail(
                        &step,
                        services,
                        "no acknowledged edit was lost without fencing",
                    );
                }
                smoke.note(&format!("lost without fencing: {lost:?}"));
            }
        }
    }
}

#[test]
fn services_of_a_command_name_what_it_touches() {
    assert_eq!(
        services_of("docker compose exec -T worker-1 worker lock --backend redis"),
        ["redis", "worker-1"]
    );
    assert_eq!(
        services_of("docker compose kill $LEADER"),
        Vec::<String>::new()
    );
    assert_eq!(
        services_of("curl -s localhost:8080/pages/demo"),
        ["balancer", "gateway", "gateway-2"]
    );
    assert_eq!(services_of("docker compose restart redis"), ["redis"]);
}
