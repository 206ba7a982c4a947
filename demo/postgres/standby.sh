#!/usr/bin/env bash
# The entrypoint of `postgres-standby` (official postgres image): a
# streaming replica of `postgres`, started from a base backup.
#
# On first start the data directory is empty: pg_basebackup copies the
# primary's (retrying until the primary answers), and `-R` writes
# standby.signal and primary_conninfo, so the server starts as a hot standby
# that follows the primary's WAL. Promote it with
#   docker compose exec -T postgres-standby psql -U postgres -tAc 'select pg_promote()'
# after which it accepts writes, and the gateways (whose DATABASE_URL names
# both servers with target_session_attrs=read-write) move to it by themselves.
#
# Variables: PRIMARY_HOST (postgres), PRIMARY_PORT (5432), PGPASSWORD (the
# primary's postgres password, else the postgres-password secret's;
# pg_basebackup -R keeps it in primary_conninfo).
set -euo pipefail

PGDATA="${PGDATA:-/var/lib/postgresql/data}"
PRIMARY_HOST="${PRIMARY_HOST:-postgres}"
PRIMARY_PORT="${PRIMARY_PORT:-5432}"
PGPASSWORD="${PGPASSWORD:-$(cat /run/secrets/postgres-password)}"
export PGPASSWORD

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA"
    chown postgres:postgres "$PGDATA"
    chmod 700 "$PGDATA"
    until gosu postgres pg_basebackup -h "$PRIMARY_HOST" -p "$PRIMARY_PORT" -U postgres \
        -D "$PGDATA" -R -X stream -c fast; do
        echo "standby: waiting for the primary at $PRIMARY_HOST:$PRIMARY_PORT" >&2
        find "$PGDATA" -mindepth 1 -delete
        sleep 1
    done
    echo "standby: base backup of $PRIMARY_HOST:$PRIMARY_PORT taken; starting as a hot standby" >&2
fi
exec gosu postgres postgres -D "$PGDATA"
