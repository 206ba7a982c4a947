//! docs/OPERATIONS.md's settings tables against `gateway --help` and
//! `worker --help`, the one source of the settings: every setting the binary
//! names is in its table with its variable, its flag and its default, and
//! every row of the table is a setting the binary still has. So the manual
//! cannot drift from the code.

use std::collections::BTreeMap;
use std::process::Command;

use harness::stack::{bin_dir, repo};

/// One setting as `--help` shows it.
#[derive(Debug, Clone, PartialEq)]
struct Setting {
    flag: String,
    env: Option<String>,
    default: Option<String>,
    required: bool,
}

/// The settings of `binary --help`, by flag (`--help` and `--version` left
/// out). A block starts with a line whose first word is a flag; `[env: X=]`
/// (or `[env: X]` for a hidden value) and `[default: Y]` follow it.
fn help_settings(command: &[&str]) -> BTreeMap<String, Setting> {
    let (binary, args) = command.split_first().expect("a binary");
    let out = Command::new(bin_dir().join(binary))
        .args(args)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("run {binary} --help: {e}"));
    assert!(out.status.success(), "{binary} --help failed");
    let help = String::from_utf8(out.stdout).expect("UTF-8 help");
    let usage = help
        .lines()
        .find(|l| l.starts_with("Usage:"))
        .expect("a Usage line");
    let mut settings = BTreeMap::new();
    let mut current: Option<Setting> = None;
    for line in help.lines() {
        let trimmed = line.trim();
        // Flags are indented 2 or 6 spaces; a value's `- name: ...` more.
        let indent = line.len() - line.trim_start().len();
        if trimmed.starts_with('-') && (2..=6).contains(&indent) {
            if let Some(done) = current.take() {
                settings.insert(done.flag.clone(), done);
            }
            let flag = trimmed
                .split_whitespace()
                .map(|w| w.trim_end_matches(','))
                .find(|w| w.starts_with("--"))
                .expect("a long flag")
                .to_owned();
            let required = usage.contains(&format!("{flag} <"));
            current = Some(Setting {
                flag,
                env: None,
                default: None,
                required,
            });
        } else if let Some(setting) = current.as_mut() {
            // On lines of their own (long help) or after the text (short).
            let bracket = |tag: &str| {
                let at = trimmed.find(tag)? + tag.len();
                let rest = &trimmed[at..];
                Some(rest[..rest.find(']')?].to_owned())
            };
            if let Some(name) = bracket("[env: ") {
                setting.env = Some(name.split('=').next().unwrap_or(&name).to_owned());
            }
            if let Some(default) = bracket("[default: ") {
                setting.default = Some(default);
            }
        }
    }
    if let Some(done) = current.take() {
        settings.insert(done.flag.clone(), done);
    }
    settings.remove("--help");
    settings.remove("--version");
    assert!(
        settings.len() > 5,
        "{binary} --help: too few settings parsed"
    );
    settings
}

/// One row of a settings table: variable, flag, default (as written).
#[derive(Debug)]
struct Row {
    env: String,
    flag: String,
    default: String,
}

/// The rows of the table under `heading` in docs/OPERATIONS.md.
fn table(doc: &str, heading: &str) -> Vec<Row> {
    let start = doc
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/OPERATIONS.md has no section {heading:?}"));
    let section = &doc[start + heading.len() + 2..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let rows: Vec<Row> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").map(|c| c.trim_matches('|').trim()).collect();
            let code = |c: &str| c.trim_matches('`').to_owned();
            Row {
                env: code(cells[0]),
                flag: code(cells[1]),
                default: cells[2].to_owned(),
            }
        })
        .collect();
    assert!(!rows.is_empty(), "{heading}: no table rows");
    rows
}

/// Each setting of `binary --help` has its row, and each row its setting.
fn check(command: &[&str], heading: &str) {
    let doc = std::fs::read_to_string(repo().join("docs/OPERATIONS.md"))
        .expect("read docs/OPERATIONS.md");
    let settings = help_settings(command);
    let binary = command.join(" ");
    let rows = table(&doc, heading);
    let mut problems = Vec::new();
    for setting in settings.values() {
        let Some(row) = rows.iter().find(|r| r.flag == setting.flag) else {
            problems.push(format!("{} (`{binary} --help`) has no row", setting.flag));
            continue;
        };
        if Some(&row.env) != setting.env.as_ref() {
            problems.push(format!(
                "{}: the table says `{}`, --help says {:?}",
                setting.flag, row.env, setting.env
            ));
        }
        let documented = match (&setting.default, setting.required) {
            (Some(default), _) => row.default == format!("`{default}`"),
            (None, true) => row.default == "(required)",
            // No default: nothing, off (a switch), or one computed at run
            // time, written as `<what>`.
            (None, false) => {
                ["none", "off"].contains(&row.default.as_str()) || row.default.starts_with("`<")
            }
        };
        if !documented {
            problems.push(format!(
                "{}: default {:?} in the table, --help says {:?}{}",
                setting.flag,
                row.default,
                setting.default,
                if setting.required { " (required)" } else { "" }
            ));
        }
    }
    for row in &rows {
        if !settings.contains_key(&row.flag) {
            problems.push(format!(
                "{} ({}) is in the table but gone from `{binary} --help`",
                row.flag, row.env
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/OPERATIONS.md, {heading:?}, against `{binary} --help`:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_gateway_setting_is_in_the_operators_manual_and_nothing_more() {
    check(&["gateway"], "## Settings: the gateway");
}

#[test]
fn every_setup_setting_is_in_the_operators_manual_and_nothing_more() {
    check(&["gateway", "setup"], "## Settings: gateway setup");
}

#[test]
fn every_worker_setting_is_in_the_operators_manual_and_nothing_more() {
    check(&["worker"], "## Settings: the worker");
}
