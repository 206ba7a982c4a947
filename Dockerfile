# syntax=docker/dockerfile:1
# Both binaries in one small image: `gateway` (the default command) and `worker`.
# tests/tests/it/compose/ checks that the binaries built here are the ones the
# workspace defines and the ones compose.yaml runs; scripts/compose-smoke
# builds it for real (with podman) and runs the README against it.

FROM rust:1.95.0-bookworm AS build
WORKDIR /src
COPY . .
# Stripped release binaries (about 42 and 56 MB unstripped): no debug info to
# build or ship (the workspace's release profile keeps line tables for
# backtraces on a developer's machine, not here).
ENV CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_PROFILE_RELEASE_STRIP=symbols
# The cache mounts keep the registry and target dir between builds; the
# binaries are copied out of the cached target dir in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p gateway -p worker \
 && install -D -m 0755 target/release/gateway target/release/worker -t /out/

FROM debian:bookworm-slim
# curl for the healthchecks. No ca-certificates: the binaries speak plain
# HTTP only (the worker refuses an https:// gateway), and their lock services
# and database connections are plain TCP.
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin app
COPY --from=build /out/gateway /out/worker /usr/local/bin/
USER app
EXPOSE 8080
ENV RUST_LOG=info
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=5 \
    CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
CMD ["gateway"]
