#!/bin/sh
# The stand-in redis image's entrypoint (see Dockerfile): options or a .conf
# file alone mean redis-server; redis-server runs as the redis user.
set -e
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
    set -- redis-server "$@"
fi
if [ "$1" = redis-server ] && [ "$(id -u)" = 0 ]; then
    find . \! -user redis -exec chown redis '{}' +
    exec gosu redis "$0" "$@"
fi
umask 0077
exec "$@"
