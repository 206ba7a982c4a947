//! The tutorial (docs/TUTORIAL.md), run against the real stack so it cannot
//! rot; and `scripts/demo`, the README's five-minute path, against the same.
//!
//! # The convention
//! Stated in the tutorial and in `harness::transcript`, which holds the checker;
//! [`crate::compose_smoke`] runs the same transcripts against the containers
//! of compose.yaml. Here the `docker compose` commands run with
//! `scripts/stack`, which has the ones console blocks use.
//!
//! # The stack
//! `scripts/stack up` starts the same topology as compose.yaml from the Debian
//! packages ([`harness::stack`]: on free ports, in a temp state dir, with the
//! binaries `cargo build --workspace --bins` left in the target dir, which
//! scripts/test builds before the tests). The tutorial's curls go to its
//! ports; `scripts/stack down` runs on drop, also when an assertion fails.
//!
//! # The straggler (tutorial steps 7 and 8)
//! Those steps use `docker compose`, so they cannot run here as written; the
//! same scenario runs on `scripts/stack` (`start straggler`, `unpause
//! straggler`), and the test checks what the tutorial says the history and the
//! page show: refused through the fenced gateway (by its issuer check,
//! `token_not_current`, or by its fence, `stale_token`); through the unfenced
//! one, accepted (marked `stale`) with the edits acknowledged in the meantime
//! gone from the page. And a worker's own database login cannot move a
//! fence behind the gateway's back, nor an anonymous client plant a
//! ZooKeeper holder, nor the workers' Redis user write outside the locks.

use std::time::Duration;

use harness::stack::{accepted, repo, Stack};
use harness::transcript;
use serde_json::Value;

/// `scripts/stack up` as the tutorial has it, once the workers
/// have written page `demo` (step 1 reads it).
#[track_caller]
fn tutorial_stack() -> Stack {
    let stack = Stack::up("stack-tutorial-");
    stack.wait_for(
        "curl -s -o /dev/null -w '%{http_code}' localhost:8080/pages/demo",
        "200",
        Duration::from_secs(60),
    );
    stack
}

#[test]
fn tutorial_transcripts_print_what_the_tutorial_says() {
    let tutorial =
        std::fs::read_to_string(repo().join(transcript::TUTORIAL)).expect("read the tutorial");
    let steps = transcript::checked_steps(&tutorial);

    let stack = tutorial_stack();

    let mut failures = Vec::new();
    let mut vars = transcript::Vars::default();
    for (step, run) in &steps {
        let result = transcript::run_step(step, run, &mut vars, |command, vars| {
            stack.sh_with(command, vars)
        });
        if let Err(failure) = result {
            failures.push(failure);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Steps 7 and 8 by hand, then `scripts/demo` (the README's five-minute
/// path), which runs both again and prints the two outcomes.
#[test]
fn straggler_is_refused_by_the_fence_and_loses_an_update_without_it() {
    let stack = tutorial_stack();

    // Step 7: through the fenced gateway the late PUT is refused, nothing
    // written, and every acknowledged edit is still in the page.
    let straggle = stack.straggle("straggler");
    let (get, put) = (&straggle.get, &straggle.put);
    // Refused by the issuer check (its lease is gone: the lock service names
    // another holder, or none) or, had the check raced with the lease's end,
    // by the fence.
    assert!(
        put["outcome"] == "token_not_current" || put["outcome"] == "stale_token",
        "the straggler's PUT: {put}"
    );
    assert_eq!(put["token"], get["token"]);
    assert!(put["fence_token"].as_i64() > put["token"].as_i64(), "{put}");
    assert!(
        straggle.between.iter().any(accepted),
        "other workers edited while it was frozen"
    );
    assert_eq!(
        stack.lost_edits("demo"),
        Vec::<Value>::new(),
        "lost updates with fencing on"
    );

    // Step 8: through the unfenced gateway it lands (marked `stale`), and an
    // acknowledged edit is gone: the others' lines written while it was
    // frozen (its stale body replaced them), or its own line, when a worker
    // that had read before its PUT wrote after it.
    let put = stack.straggle("straggler-unfenced").put;
    assert_eq!(
        put["outcome"], "stale",
        "the unfenced straggler's PUT: {put}"
    );
    // No wait needed: from its PUT on, one of the two losses has happened.
    let lost = stack.lost_edits("demo");
    assert!(
        !lost.is_empty(),
        "no acknowledged edit was lost without fencing"
    );

    // The README's five-minute path runs the same two stragglers on the
    // same stack: it prints what the README says, or fails.
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("read README.md");
    let step = transcript::demo_step(&readme);
    let printed = stack.sh(&format!("cd '{}' && {}", repo().display(), step.command));
    if let Err(difference) = transcript::check_output("README.md", &step, &printed) {
        panic!("{difference}");
    }

    // Nor can a straggler reach around the gateway: the database login a
    // worker is given may not touch the pages, PostgreSQL itself refuses.
    let env = stack.run(&["env", "worker-1"]);
    let url = env
        .lines()
        .find_map(|l| l.strip_prefix("DATABASE_URL="))
        .expect("worker-1 has a DATABASE_URL");
    for (attack, table) in [
        (
            "update pages set fence_token = 9223372036854775807 where id = 'demo'",
            "pages",
        ),
        // The lease table too: only its functions, which mint the tokens.
        (
            "update fencelock_leases set token = 9223372036854775807",
            "fencelock_leases",
        ),
    ] {
        let out = stack.script(&["exec", "postgres", "psql", url, "-c", attack]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && stderr.contains(&format!("permission denied for table {table}")),
            "worker-1's login was let through: {attack}: {stderr}"
        );
    }
    // And a client without the lock clients' ZooKeeper user cannot plant a
    // holder: ZooKeeper itself refuses (zkCli says NoAuth this way).
    let zk = env
        .lines()
        .find_map(|l| l.strip_prefix("ZOOKEEPER_CONNECT="))
        .and_then(|c| c.split(',').next())
        .expect("worker-1 has a ZOOKEEPER_CONNECT");
    let planted = stack.sh(&format!(
        "/usr/share/zookeeper/bin/zkCli.sh -server {zk} create /fencing/locks/planted 2>&1 || true"
    ));
    assert!(
        planted.contains("Insufficient permission : /fencing/locks/planted"),
        "an anonymous client created a lock node: {planted}"
    );
    // Redis: the workers' user may touch the lock's keys only.
    let redis = env
        .lines()
        .find_map(|l| l.strip_prefix("REDIS_URL="))
        .expect("worker-1 has a REDIS_URL");
    let refused = stack.sh(&format!(
        "redis-cli --no-auth-warning -u '{redis}' set pages:demo planted 2>&1"
    ));
    assert!(
        refused.contains("NOPERM"),
        "the workers' Redis user wrote outside the lock's keys: {refused}"
    );
}

/// The highest token among accepted PUTs of page `demo` (ZooKeeper's tokens
/// only grow, whatever happens to PostgreSQL).
fn highest_accepted_token(history: &[Value]) -> i64 {
    history
        .iter()
        .filter(|e| accepted(e))
        .filter_map(|e| e["token"].as_i64())
        .max()
        .unwrap_or(0)
}

/// Wait (bounded) until each of `workers` has a PUT accepted with a token
/// above `above`: it edited after whatever happened at that token.
#[track_caller]
fn wait_workers_edit_after(stack: &Stack, workers: &[&str], above: i64, timeout: Duration) {
    stack.poll(timeout, Duration::from_millis(200), || {
        let history = stack.try_history("demo").unwrap_or_default();
        let missing: Vec<&&str> = workers
            .iter()
            .filter(|w| {
                !history.iter().any(|e| {
                    e["client_id"] == **w
                        && accepted(e)
                        && e["token"].as_i64().is_some_and(|t| t > above)
                })
            })
            .collect();
        match missing.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "{missing:?} got no edit acknowledged after token {above}"
            )),
        }
    });
}

/// Tutorial steps 11 and 12 with the workers in view: `gateway-2`
/// (which worker-2's key is balanced to) is SIGKILLed and every worker, worker-2
/// included, gets edits acknowledged through the other gateway, none lost;
/// then the PostgreSQL primary is killed and the standby promoted, and every
/// worker gets edits acknowledged on the new primary. The standby is
/// asynchronous, so what the failover lost is printed, not asserted.
#[test]
fn workers_go_on_through_the_balancer_when_a_gateway_dies_and_after_a_failover() {
    let stack = tutorial_stack();
    let workers = ["worker-1", "worker-2", "worker-3"];
    wait_workers_edit_after(&stack, &workers, 0, Duration::from_secs(60));

    let before_kill = highest_accepted_token(&stack.history("demo"));
    stack.run(&["kill", "gateway-2"]);
    assert_eq!(stack.state("gateway-2"), "exited");
    wait_workers_edit_after(&stack, &workers, before_kill, Duration::from_secs(60));
    assert_eq!(
        stack.lost_edits("demo"),
        Vec::<Value>::new(),
        "a killed gateway cost an acknowledged edit"
    );

    let before_failover = highest_accepted_token(&stack.history("demo"));
    stack.run(&["kill", "postgres"]);
    // No primary: refused, never served from the standby.
    let status = stack.sh("curl -s -o /dev/null -w '%{http_code}' localhost:8080/pages/demo");
    assert_eq!(status, "503");
    let promoted = stack.run(&[
        "exec",
        "-T",
        "postgres-standby",
        "psql",
        "-U",
        "postgres",
        "-tAc",
        "select pg_promote()",
    ]);
    assert_eq!(promoted.trim(), "t");
    wait_workers_edit_after(&stack, &workers, before_failover, Duration::from_secs(90));
    let lost = stack.lost_edits("demo");
    eprintln!(
        "asynchronous standby, as measured: {} acknowledged edit(s) lost in the failover: {lost:?}",
        lost.len()
    );
    // The old primary must not come back beside the promoted standby.
    let out = stack.script(&["restart", "postgres"]);
    assert!(
        !out.status.success(),
        "restarting the old primary was allowed"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("split brain"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
