//! Where the project's binaries are, pinned for the whole run.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::{bail, Context};

/// The pinned copies live in directories named so.
const SNAPSHOT_PREFIX: &str = "pinned-bin-";

/// `$CHAOS_BIN_DIR`, else the cargo target dir this executable runs from
/// (`target/debug`, also for a test binary in `target/debug/deps`).
fn bin_dir() -> anyhow::Result<PathBuf> {
    Ok(match std::env::var_os("CHAOS_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let exe = std::env::current_exe().context("current exe")?;
            let mut dir = exe.parent().context("exe dir")?.to_path_buf();
            if dir.ends_with("deps") {
                dir.pop();
            }
            dir
        }
    })
}

/// The pinned copies of earlier runs (a static's temp dir is never dropped):
/// remove those older than an hour, which no live run still uses.
fn remove_stale_snapshots(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(3600));
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // `chaos-bin-`: the same copies, as the chaos runner named them.
        if old && (name.starts_with(SNAPSHOT_PREFIX) || name.starts_with("chaos-bin-")) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The project's binary `name`, pinned for the whole run: the first call
/// hard-links (or copies) it into a private temp dir, so that a rebuild of the
/// shared target dir in the middle of a run cannot mix two versions.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    static SNAPSHOT: OnceLock<Mutex<(Option<tempfile::TempDir>, Vec<String>)>> = OnceLock::new();
    let snapshot = SNAPSHOT.get_or_init(|| Mutex::new((None, vec![])));
    let mut snap = snapshot.lock().expect("binary snapshot");
    if snap.0.is_none() {
        let dir = bin_dir()?;
        remove_stale_snapshots(&dir);
        snap.0 = Some(
            tempfile::Builder::new()
                .prefix(SNAPSHOT_PREFIX)
                .tempdir_in(&dir)?,
        );
    }
    let pinned = snap.0.as_ref().expect("snapshot dir").path().join(name);
    if !snap.1.iter().any(|n| n == name) {
        let source = built_binary(name)?;
        if std::fs::hard_link(&source, &pinned).is_err() {
            std::fs::copy(&source, &pinned)
                .with_context(|| format!("copy {} to {}", source.display(), pinned.display()))?;
        }
        snap.1.push(name.to_string());
    }
    Ok(pinned)
}

/// Where cargo built the binary `name` (see [`bin_dir`]).
fn built_binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = bin_dir()?.join(name);
    if !path.is_file() {
        bail!(
            "binary `{}` not found; build it first with `cargo build --workspace --bins` \
             (scripts/test does) or `cargo build -p {name}` (or set CHAOS_BIN_DIR)",
            path.display()
        );
    }
    Ok(path)
}
