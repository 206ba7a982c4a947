#!/bin/bash
# healthcheck.sh of the stand-in mariadb image (see Dockerfile): the tests
# compose.yaml uses, each exiting non-zero when it fails.
#   --connect              the server answers a client and is on the network
#                          (not the entrypoint's socket-only setup server)
#   --innodb_initialized   InnoDB finished starting (crash recovery included)
set -eo pipefail
cnf=/var/lib/mysql/.my-healthcheck.cnf
sql() { mariadb --defaults-extra-file="$cnf" --protocol=socket -B --skip-column-names -e "$1"; }
[ $# -gt 0 ] || { echo "At least one argument required" >&2; exit 1; }
for arg; do
    case "$arg" in
    --connect) [ "$(sql 'select @@skip_networking')" = 0 ] ;;
    --innodb_initialized)
        [ "$(sql "select 1 from information_schema.ENGINES where engine = 'innodb' and support in ('YES', 'DEFAULT', 'ENABLED')")" = 1 ]
        ;;
    *) echo "healthcheck: unknown option or test '$arg' (this stand-in has --connect and --innodb_initialized)" >&2; exit 1 ;;
    esac
done
