#!/usr/bin/env bash
# The stand-in postgres image's entrypoint (see Dockerfile): written for the
# compose smoke run, after the documented behaviour of the official image.
set -Eeo pipefail

if [ "${1:0:1}" = '-' ]; then
    set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
    exec "$@"
fi

# As the official image's file_env: the password may come from a file (a secret).
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    POSTGRES_PASSWORD="$(<"$POSTGRES_PASSWORD_FILE")"
    export POSTGRES_PASSWORD
fi
export POSTGRES_USER="${POSTGRES_USER:-postgres}"
export POSTGRES_DB="${POSTGRES_DB:-$POSTGRES_USER}"

if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    exec gosu postgres "$BASH_SOURCE" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "${POSTGRES_HOST_AUTH_METHOD:-}" != trust ]; then
        echo "Error: Database is uninitialized and superuser password is not specified (POSTGRES_PASSWORD)." >&2
        exit 1
    fi
    initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "${POSTGRES_PASSWORD:-}") ${POSTGRES_INITDB_ARGS:-}
    auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
    printf '\nhost all all all %s\n' "$auth" >>"$PGDATA/pg_hba.conf"

    export PGPASSWORD="${PGPASSWORD:-${POSTGRES_PASSWORD:-}}"
    shift
    options="-c listen_addresses='' -p ${PGPORT:-5432}"
    if [ $# -gt 0 ]; then
        options="$(printf '%q ' "$@")$options"
    fi
    pg_ctl -D "$PGDATA" -o "$options" -w start
    psql=(psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc)
    if [ "$POSTGRES_DB" != postgres ]; then
        "${psql[@]}" --dbname postgres --set db="$POSTGRES_DB" <<<'create database :"db";'
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
        *.sh)
            if [ -x "$f" ]; then
                echo "$0: running $f"
                "$f"
            else
                echo "$0: sourcing $f"
                # shellcheck disable=SC1090
                . "$f"
            fi
            ;;
        *.sql) echo "$0: running $f"; "${psql[@]}" --dbname "$POSTGRES_DB" -f "$f" ;;
        *)
            if [ -e "$f" ]; then echo "$0: ignoring $f"; fi
            ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop
    unset PGPASSWORD
    set -- postgres "$@"
    echo "PostgreSQL init process complete; ready for start up."
fi

exec "$@"
