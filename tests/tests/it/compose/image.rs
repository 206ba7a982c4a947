//! The image: the Dockerfile builds and copies exactly the bin targets that
//! `cargo metadata` lists for the gateway and worker packages, with the
//! workspace's default features, stripped, without a TLS stack, from images
//! pinned to a patch release; compose runs only those binaries.

use std::collections::BTreeSet;
use std::process::Command;

use harness::process::run_ok;
use harness::stack::repo;

use super::{compose, defaults, our_binary, services};

fn dockerfile() -> String {
    std::fs::read_to_string(repo().join("Dockerfile")).expect("read Dockerfile")
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
    let out = run_ok(
        Command::new(env!("CARGO"))
            .current_dir(repo())
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .arg("--offline"),
    );
    let metadata: Metadata = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let dockerfile = dockerfile();

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

#[test]
fn the_image_ships_stripped_binaries_and_no_tls_it_cannot_use() {
    let dockerfile = dockerfile();
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
        if let Some(url) = defaults(&service).get("WORKER_GATEWAY") {
            assert!(url.starts_with("http://"), "{name}: {url}");
        }
    }
}

/// Whether `image` names a full patch release: `NAME:X.Y.Z` with an optional
/// `-variant` (`-bookworm`), or `X.Y` for PostgreSQL, whose releases have two
/// numbers since version 10. Not `latest`, `15`, `7.0` or `3.8`.
pub(super) fn pinned_to_a_patch_release(image: &str) -> bool {
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
    let dockerfile = dockerfile();
    let builder = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("FROM rust:"))
        .expect("the Dockerfile builds FROM rust:<version>");
    let image = format!("rust:{}", builder.split_whitespace().next().unwrap());
    assert!(pinned_to_a_patch_release(&image), "{image}");
}
