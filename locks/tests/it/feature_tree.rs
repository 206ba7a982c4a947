//! A program that depends on the lock library with one backend feature gets
//! that backend's client and nothing of the others: `locks/dependent`
//! (`default-features = false, features = ["redis"]`) has neither sqlx nor the
//! ZooKeeper client in its dependency tree.

use std::process::Command;

fn tree(package: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn one_backend_feature_pulls_only_its_own_client() {
    let crates = tree("redis-only-user");
    assert!(crates.iter().any(|c| c == "fencelock"), "{crates:?}");
    assert!(crates.iter().any(|c| c == "redis"), "{crates:?}");
    for absent in [
        "sqlx",
        "sqlx-core",
        "zookeeper-client",
        "clap",
        "reqwest",
        "axum",
    ] {
        assert!(
            !crates.iter().any(|c| c == absent),
            "{absent} is in the tree of a redis-only user: {crates:?}"
        );
    }
}

#[test]
fn the_worker_gets_every_backend() {
    // The check above could pass by never finding anything: make sure the
    // same listing does show the other clients where they are used.
    let crates = tree("worker");
    for present in ["sqlx-core", "zookeeper-client", "redis"] {
        assert!(crates.iter().any(|c| c == present), "{present}: {crates:?}");
    }
}
