#!/usr/bin/env bash
# The primary's side of streaming replication, for the official
# postgres image (compose.yaml mounts this into /docker-entrypoint-initdb.d/,
# so it runs once, when the data directory is created, before the server
# restarts for real). scripts/stack does the same with Debian's packages.
#
# - The standby (`postgres-standby`) connects for replication with the same
#   user and password as the gateways: pg_hba's `all` does not cover
#   replication connections, so they get their own line.
# - POSTGRES_REPLICATION=sync (default async): every commit waits until the
#   standby has flushed it (synchronous_standby_names = '*', with the default
#   synchronous_commit = on), so a failover loses no acknowledged write; while
#   the standby is down, commits wait for it.
set -euo pipefail

echo "host replication all all scram-sha-256" >>"$PGDATA/pg_hba.conf"

case "${POSTGRES_REPLICATION:-async}" in
sync)
    psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
        -c "alter system set synchronous_standby_names = '*'"
    ;;
async) ;;
*)
    echo "POSTGRES_REPLICATION must be async or sync, not ${POSTGRES_REPLICATION}" >&2
    exit 1
    ;;
esac
