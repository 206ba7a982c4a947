//! The tutorial's checked transcripts ([`TUTORIAL`]): one checker for every
//! place that runs them (`tests/tests/it/tutorial.rs` against
//! `scripts/stack`, `tests/tests/it/compose_smoke.rs` against the containers
//! of compose.yaml).
//!
//! # The convention (also stated in the tutorial)
//! Every fenced block marked ```` ```console ```` in docs/TUTORIAL.md is a
//! checked transcript. A line starting with `$ ` is a command; the lines after it, up to
//! the next `$ ` or the end of the block, are what it prints. In the expected
//! output, `...` inside a line matches any text (timestamps, sizes), and a line
//! that is exactly `...` matches any number of lines, none included. Carriage
//! returns (curl `-i` headers) are ignored. Console blocks run `curl`, `echo`,
//! and the `docker compose` commands that scripts/stack has too (`exec -T`,
//! `restart`, `kill`, `pause`, `unpause`, `start`); the rest is in
//! ```` ```sh ```` blocks, some of which the compose smoke run executes as
//! written ([`sh_block_with`]).

/// The tutorial whose transcripts are checked, from the repository's root.
pub const TUTORIAL: &str = "docs/TUTORIAL.md";

/// A fenced code block of a markdown file: its info string (`console`, `sh`,
/// ...), the line of its first content line, and its lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub info: String,
    pub line: usize,
    pub lines: Vec<String>,
}

/// Every fenced (```` ``` ````) block of `markdown`, in order. As in
/// CommonMark, a fence is a line of three or more backticks, and an opening
/// one's info string has no backtick: a line of prose that starts with
/// inline code (```` ```` ```sh ```` ```` ````) opens nothing.
pub fn blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, Block)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim();
        let ticks = trimmed.len() - trimmed.trim_start_matches('`').len();
        let info = &trimmed[ticks..];
        match open.take() {
            Some((fence, block)) if ticks >= fence && info.is_empty() => blocks.push(block),
            Some((fence, mut block)) => {
                block.lines.push(line.to_owned());
                open = Some((fence, block));
            }
            None if ticks >= 3 && !info.contains('`') => {
                open = Some((
                    ticks,
                    Block {
                        info: info.trim().to_owned(),
                        line: i + 2,
                        lines: Vec::new(),
                    },
                ))
            }
            None => {}
        }
    }
    blocks
}

/// A command line of a ```` ```sh ```` block without its `# comment`.
fn command_part(line: &str) -> &str {
    line.split(" #").next().unwrap_or("").trim()
}

/// The one ```` ```sh ```` block of `markdown` with a command line that is
/// exactly `command` (comments aside). Panics when none or several have it,
/// so a tutorial edit that changes the commands a test runs is noticed.
#[track_caller]
pub fn sh_block_with(markdown: &str, command: &str) -> Block {
    let found = blocks(markdown)
        .into_iter()
        .filter(|b| b.info == "sh" && b.lines.iter().any(|l| command_part(l) == command))
        .collect();
    exactly_one(
        found,
        format_args!("{TUTORIAL}: expected one ```sh block with the command `{command}`"),
    )
}

/// The one item of `found`; otherwise a panic with `what` and their count.
#[track_caller]
fn exactly_one<T>(found: Vec<T>, what: std::fmt::Arguments) -> T {
    let count = found.len();
    match <[T; 1]>::try_from(found) {
        Ok([one]) => one,
        Err(_) => panic!("{what}, found {count}"),
    }
}

/// Whether some ```` ```sh ```` block of `markdown` has the command line
/// `command` (comments aside).
pub fn has_sh_command(markdown: &str, command: &str) -> bool {
    blocks(markdown)
        .iter()
        .any(|b| b.info == "sh" && b.lines.iter().any(|l| command_part(l) == command))
}

/// One `$ command` of a console block and what it prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub line: usize,
    pub command: String,
    pub expected: Vec<String>,
}

/// Every command of every ```console block of `markdown`, in order.
pub fn console_steps(markdown: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    for block in blocks(markdown).into_iter().filter(|b| b.info == "console") {
        let mut in_block: Option<usize> = None;
        for (offset, line) in block.lines.iter().enumerate() {
            let line_no = block.line + offset;
            if let Some(command) = line.strip_prefix("$ ") {
                steps.push(Step {
                    line: line_no,
                    command: command.to_owned(),
                    expected: Vec::new(),
                });
                in_block = Some(steps.len() - 1);
            } else if let Some(at) = in_block {
                steps[at].expected.push(line.clone());
            } else {
                panic!("{TUTORIAL}:{line_no}: console block output before any `$ ` command");
            }
        }
    }
    steps
}

/// The README's five-minute path: the one command of its console block,
/// run by `tests/tests/it/tutorial.rs` on `scripts/stack` and by the compose
/// smoke run on the containers, each output compared with the README's.
pub const DEMO: &str = "scripts/demo";

/// The README's [`DEMO`] step and what it prints, which must be there once.
#[track_caller]
pub fn demo_step(readme: &str) -> Step {
    let found = console_steps(readme)
        .into_iter()
        .filter(|s| s.command == DEMO)
        .collect();
    exactly_one(
        found,
        format_args!("README.md: expected one ```console step `$ {DEMO}`"),
    )
}

/// Whether `output` is what `step` says it prints (the same matching as
/// the transcripts); the difference as a failure report otherwise.
pub fn check_output(file: &str, step: &Step, output: &str) -> Result<(), String> {
    let got = output.replace('\r', "");
    let got_lines: Vec<&str> = got.trim_end_matches('\n').lines().collect();
    if output_matches(&step.expected, &got_lines) {
        Ok(())
    } else {
        Err(format!(
            "{file}:{}: $ {}\n--- expected ---\n{}\n--- got ---\n{}",
            step.line,
            step.command,
            step.expected.join("\n"),
            got_lines.join("\n")
        ))
    }
}

/// What a console line runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// `NAME` of `NAME=$(...)`: the output goes into `$NAME` instead.
    pub capture: Option<String>,
    pub command: String,
}

/// Check a console command against the convention and split off a capture.
pub fn classify(command: &str) -> Result<Run, String> {
    let (capture, inner) = match command.split_once("=$(") {
        Some((name, rest))
            if !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') =>
        {
            let inner = rest
                .strip_suffix(')')
                .ok_or_else(|| format!("{command}: a capture ends with `)`"))?;
            (Some(name.to_owned()), inner)
        }
        _ => (None, command),
    };
    let allowed = inner.starts_with("curl ")
        || inner.starts_with("echo ")
        || inner.starts_with("docker compose exec -T ")
        || inner.starts_with("docker compose restart ")
        // The failover steps: kill a server, freeze one, start it again
        // (scripts/stack has each), and ask each ZooKeeper server its mode.
        || inner.starts_with("docker compose kill ")
        || inner.starts_with("docker compose pause ")
        || inner.starts_with("docker compose unpause ")
        || inner.starts_with("docker compose start ")
        || is_exec_loop(inner);
    if !allowed {
        return Err(format!(
            "{command}: console blocks run curl, echo, `docker compose exec -T` (alone or in \
             a `for ...; do ...; done` loop), `docker compose restart|kill|pause|unpause|start` \
             and `NAME=$(...)` of those only (use ```sh for the rest)"
        ));
    }
    Ok(Run {
        capture,
        command: inner.to_owned(),
    })
}

/// `for NAME in WORDS; do docker compose exec -T ...; done`: the same
/// `exec` over several services (which ZooKeeper server leads), also as
/// `do if docker compose exec -T ...; then ...; fi; done`, so that the loop
/// succeeds whichever service answers (a loop's status is its last turn's).
fn is_exec_loop(command: &str) -> bool {
    command.starts_with("for ")
        && (command.contains("; do docker compose exec -T ")
            || command.contains("; do if docker compose exec -T "))
        && command.ends_with("; done")
        && command.matches("; do ").count() == 1
        && !command.contains('`')
        && !command.contains("$(")
}

/// `...` inside an expected line matches any text.
pub fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.split("...").collect();
    if parts.len() == 1 {
        return expected == actual;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !actual.starts_with(first)
        || actual.len() < first.len() + last.len()
        || !actual.ends_with(last)
    {
        return false;
    }
    let mut rest = &actual[first.len()..actual.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Expected lines against actual lines; an expected line `...` matches any
/// number of actual lines.
pub fn output_matches(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((e, rest)) if e == "..." => {
            (0..=actual.len()).any(|skip| output_matches(rest, &actual[skip..]))
        }
        Some((e, rest)) => match actual.split_first() {
            Some((a, arest)) => line_matches(e, a) && output_matches(rest, arest),
            None => false,
        },
    }
}

/// The tutorial's console steps, each checked against the convention.
#[track_caller]
pub fn checked_steps(tutorial: &str) -> Vec<(Step, Run)> {
    let steps = console_steps(tutorial);
    assert!(
        steps.len() >= 6,
        "{TUTORIAL} has only {} console commands: the tutorial's curl steps should be ```console blocks",
        steps.len()
    );
    steps
        .into_iter()
        .map(|step| {
            let run =
                classify(&step.command).unwrap_or_else(|e| panic!("{TUTORIAL}:{}: {e}", step.line));
            assert!(
                run.capture.is_none() || step.expected.is_empty(),
                "{TUTORIAL}:{}: an assignment prints nothing, so nothing may be written under it",
                step.line
            );
            (step, run)
        })
        .collect()
}

/// The variables `NAME=$(...)` steps captured so far, as a shell keeps them.
#[derive(Debug, Default, Clone)]
pub struct Vars(Vec<(String, String)>);

impl Vars {
    pub fn as_slice(&self) -> &[(String, String)] {
        &self.0
    }
}

/// Run one checked step with `run_command` (which runs a command with the
/// variables captured so far and returns its standard output): a capture is
/// kept in `vars`; otherwise the output is compared with the tutorial's, and
/// the difference returned as a failure report.
pub fn run_step(
    step: &Step,
    run: &Run,
    vars: &mut Vars,
    run_command: impl FnOnce(&str, &[(String, String)]) -> String,
) -> Result<(), String> {
    let got = run_command(&run.command, vars.as_slice()).replace('\r', "");
    if let Some(name) = &run.capture {
        // As `NAME=$(...)` in a shell: the output, its last newlines dropped.
        let value = got.trim_end_matches('\n').to_owned();
        if value.is_empty() {
            return Err(format!(
                "{TUTORIAL}:{}: `{}` printed nothing to capture",
                step.line, step.command
            ));
        }
        vars.0.retain(|(n, _)| n != name);
        vars.0.push((name.clone(), value));
        return Ok(());
    }
    check_output(TUTORIAL, step, &got)
}

/// The acknowledged PUTs (`accepted`, or `stale` through the unfenced
/// gateway) in `history` whose line is not in the page's `body`: each edit
/// appends `<client> #<n> token=<t>`. Read the history first, then the page,
/// so that a PUT acknowledged in between only adds lines.
pub fn lost_edits(history: &[serde_json::Value], body: &str) -> Vec<serde_json::Value> {
    history
        .iter()
        .filter(|e| e["method"] == "PUT" && (e["outcome"] == "accepted" || e["outcome"] == "stale"))
        .filter(|e| {
            let (client, token) = (e["client_id"].as_str().unwrap_or(""), &e["token"]);
            !body.lines().any(|l| {
                l.starts_with(&format!("{client} #")) && l.ends_with(&format!(" token={token}"))
            })
        })
        .cloned()
        .collect()
}

/// docs/LIBRARY.md's Rust blocks, compiled as doctests (`no_run`: they need
/// servers), so that the library guide's examples cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../docs/LIBRARY.md")]
pub struct LibraryGuide;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matcher_follows_the_documented_convention() {
        assert!(line_matches("a...c", "abbbc"));
        assert!(line_matches(
            "date: ...",
            "date: Sat, 21 Nov 2026 19:30:00 GMT"
        ));
        assert!(!line_matches("a...c", "abd"));
        assert!(!line_matches("abc", "abcd"));
        assert!(line_matches(
            r#"{"at":"...","v":1}"#,
            r#"{"at":"2026-11-21T19:30:00Z","v":1}"#
        ));
        let exp = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(output_matches(
            &exp(&["HTTP/1.1 200 OK", "...", "{}"]),
            &["HTTP/1.1 200 OK", "a: b", "c: d", "{}"]
        ));
        assert!(output_matches(&exp(&["x", "...", "y"]), &["x", "y"]));
        assert!(!output_matches(&exp(&["x", "...", "y"]), &["x", "z"]));
        let steps = console_steps(
            "text\n```console\n$ curl a\nout 1\nout 2\n$ curl b\n```\n```sh\n$ no\n```\n",
        );
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].command, "curl a");
        assert_eq!(steps[0].line, 3);
        assert_eq!(steps[0].expected, ["out 1", "out 2"]);
        assert!(steps[1].expected.is_empty());

        let run = classify("TOKEN=$(docker compose exec -T worker-1 worker lock --print token)")
            .expect("a capture");
        assert_eq!(run.capture.as_deref(), Some("TOKEN"));
        assert_eq!(
            run.command,
            "docker compose exec -T worker-1 worker lock --print token"
        );
        assert_eq!(classify("curl -s x").unwrap().capture, None);
        assert!(classify("docker compose up -d").is_err());
        assert!(
            classify("docker compose exec worker-1 sh").is_err(),
            "needs -T"
        );
        assert!(classify("rm -rf /").is_err());
        assert!(classify("docker compose kill zk2").is_ok());
        assert!(classify(
            "LEADER=$(for zk in zk1 zk2 zk3; do docker compose exec -T $zk zkServer.sh status 2>/dev/null | grep -q leader && echo $zk; done)"
        )
        .is_ok());
        assert!(classify(
            "LEADER=$(for zk in zk1 zk2 zk3; do if docker compose exec -T $zk zkServer.sh status | grep -q leader; then echo $zk; fi; done)"
        )
        .is_ok());
        assert!(classify("for x in a; do rm -rf /; done").is_err());
        assert!(classify("for x in a; do if rm -rf /; then echo; fi; done").is_err());
        assert!(classify("for x in a; do docker compose exec -T $x ls; done; rm -rf /").is_err());
        assert!(classify("X=$(rm -rf /)").is_err());
        assert!(
            classify("lower=$(curl x)").is_err(),
            "shell variables are upper case here"
        );
    }

    #[test]
    fn a_step_captures_or_compares_and_reports_the_difference() {
        let step = |command: &str, expected: &[&str]| Step {
            line: 7,
            command: command.into(),
            expected: expected.iter().map(|s| s.to_string()).collect(),
        };
        let mut vars = Vars::default();
        let capture = classify("A=$(echo x)").unwrap();
        run_step(&step("A=$(echo x)", &[]), &capture, &mut vars, |_, _| {
            "1\n".into()
        })
        .unwrap();
        assert_eq!(vars.as_slice(), [("A".to_owned(), "1".to_owned())]);
        let echo = classify("echo $A").unwrap();
        run_step(&step("echo $A", &["a 1"]), &echo, &mut vars, |_, v| {
            format!("a {}\r\n", v[0].1)
        })
        .unwrap();
        let err = run_step(&step("echo $A", &["a 2"]), &echo, &mut vars, |_, _| {
            "a 1\n".into()
        })
        .unwrap_err();
        assert!(err.starts_with("docs/TUTORIAL.md:7: $ echo $A"), "{err}");
        assert!(
            run_step(&step("A=$(echo)", &[]), &capture, &mut vars, |_, _| "\n"
                .into())
            .is_err()
        );
    }

    #[test]
    fn prose_starting_with_inline_code_opens_no_block() {
        let md = "```` ```sh ```` blocks are run\n```console\n$ curl x\nout\n```\n";
        let found = blocks(md);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].info, "console");
        assert_eq!(found[0].lines, ["$ curl x", "out"]);
        assert_eq!(console_steps(md).len(), 1);
    }

    #[test]
    fn sh_blocks_are_found_by_what_they_run() {
        let md = "```sh\ndocker compose up -d straggler   # freezes\n```\n```console\n$ curl x\n```\n```sh\ndocker compose up -d straggler-unfenced\n```\n";
        let block = sh_block_with(md, "docker compose up -d straggler");
        assert_eq!(block.lines, ["docker compose up -d straggler   # freezes"]);
        assert_eq!(block.line, 2);
        assert!(has_sh_command(
            md,
            "docker compose up -d straggler-unfenced"
        ));
        assert!(
            !has_sh_command(md, "curl x"),
            "console blocks are not sh blocks"
        );
        let missing = std::panic::catch_unwind(|| sh_block_with(md, "docker compose up -d"));
        assert!(missing.is_err());
    }

    #[test]
    fn lost_edits_are_acknowledged_lines_missing_from_the_page() {
        let put = |client: &str, token: i64, outcome: &str| serde_json::json!({"method": "PUT", "client_id": client, "token": token, "outcome": outcome});
        let history = [
            put("worker-1", 5, "accepted"),
            put("worker-2", 6, "accepted"),
            put("straggler", 4, "stale"),
            put("straggler", 3, "token_not_current"),
        ];
        let body = "worker-1 #1 token=5\nstraggler #1 token=4\n";
        assert_eq!(lost_edits(&history, body), [history[1].clone()]);
    }
}
