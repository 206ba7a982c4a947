//! Python tools in venvs under `target/`, created on first use: the
//! benchmark's Python peers (bench) and schemathesis (the OpenAPI fuzz).
//!
//! A venv is reused when its check passes (e.g. the pinned version is the
//! one installed), else (re)created with `python3 -m venv` and filled with
//! `pip install`, from PyPI.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use tokio::process::Command;

/// The workspace's `target/` (or `CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    dir.canonicalize().unwrap_or(dir)
}

/// `target/NAME`: where the venv `NAME` lives.
pub fn venv_dir(name: &str) -> PathBuf {
    target_dir().join(name)
}

/// Whether `python` runs `code` (e.g. `import redis`) successfully.
pub async fn python_can(python: &Path, code: &str) -> bool {
    Command::new(python)
        .args(["-c", code])
        .output()
        .await
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The venv `target/NAME`, ready when `check` (Python code) runs in it;
/// otherwise created and filled with `pip install <pip_args>` (e.g. pinned
/// packages, or `-r requirements.txt`). Returns its `bin/python`.
pub async fn venv(name: &str, check: &str, pip_args: &[&str]) -> anyhow::Result<PathBuf> {
    let venv = venv_dir(name);
    let python = venv.join("bin/python");
    if python_can(&python, check).await {
        return Ok(python);
    }
    eprintln!(
        "creating {} with pip install {} ...",
        venv.display(),
        pip_args.join(" ")
    );
    run(Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv))
    .await?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "-q", "--disable-pip-version-check"])
        .args(pip_args))
    .await?;
    if !python_can(&python, check).await {
        bail!(
            "{} was filled with pip install {} but still fails {check:?}",
            venv.display(),
            pip_args.join(" ")
        );
    }
    Ok(python)
}

async fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{:?}", cmd.as_std());
    let out = cmd.output().await.with_context(|| format!("run {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
