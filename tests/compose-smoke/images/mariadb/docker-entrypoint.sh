#!/bin/bash
# The stand-in mariadb image's entrypoint (see Dockerfile): on an empty data
# directory, create the system tables, root@'%' with MARIADB_ROOT_PASSWORD,
# MARIADB_DATABASE, the init scripts and a healthcheck account (its options in
# /var/lib/mysql/.my-healthcheck.cnf, as healthcheck.sh reads them), then run
# the server as mysql.
set -eo pipefail

if [ "${1:0:1}" = '-' ]; then
    set -- mariadbd "$@"
fi
if [ "$1" != mariadbd ]; then
    exec "$@"
fi
datadir=/var/lib/mysql
if [ "$(id -u)" = 0 ]; then
    chown -R mysql:mysql "$datadir" /run/mysqld
    exec gosu mysql "$BASH_SOURCE" "$@"
fi

if [ ! -d "$datadir/mysql" ]; then
    if [ -z "${MARIADB_ROOT_PASSWORD:-}" ]; then
        echo "Error: database is uninitialized and MARIADB_ROOT_PASSWORD is not set" >&2
        exit 1
    fi
    mariadb-install-db --datadir="$datadir" --auth-root-authentication-method=normal \
        --skip-test-db --skip-name-resolve --rpm
    socket=/run/mysqld/mysqld.sock
    "$@" --skip-networking --socket="$socket" &
    pid=$!
    for _ in $(seq 60); do
        if mariadb --protocol=socket --socket="$socket" -uroot -e 'select 1' >/dev/null 2>&1; then
            break
        fi
        sleep 0.5
    done
    health_password="$(head -c 18 /dev/urandom | base64)"
    mariadb --protocol=socket --socket="$socket" -uroot <<SQL
set @@session.sql_log_bin = 0;
alter user 'root'@'localhost' identified by '${MARIADB_ROOT_PASSWORD}';
create user 'root'@'%' identified by '${MARIADB_ROOT_PASSWORD}';
grant all on *.* to 'root'@'%' with grant option;
create user 'healthcheck'@'127.0.0.1' identified by '${health_password}';
create user 'healthcheck'@'::1' identified by '${health_password}';
create user 'healthcheck'@'localhost' identified by '${health_password}';
grant usage on *.* to 'healthcheck'@'127.0.0.1', 'healthcheck'@'::1', 'healthcheck'@'localhost';
${MARIADB_DATABASE:+create database if not exists \`${MARIADB_DATABASE}\`;}
SQL
    # As the official image: the init scripts, in the database created above.
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
        *.sql)
            echo "$0: running $f"
            mariadb --protocol=socket --socket="$socket" -uroot -p"${MARIADB_ROOT_PASSWORD}" \
                ${MARIADB_DATABASE:+"$MARIADB_DATABASE"} <"$f"
            ;;
        *) if [ -e "$f" ]; then echo "$0: ignoring $f"; fi ;;
        esac
    done
    printf '[mariadb-client]\nport=3306\nsocket=%s\nuser=healthcheck\npassword=%s\n' \
        "$socket" "$health_password" >"$datadir/.my-healthcheck.cnf"
    kill "$pid"
    wait "$pid" || true
    echo "MariaDB init process done. Ready for start up."
fi
exec "$@"
