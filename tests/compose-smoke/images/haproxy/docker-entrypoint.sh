#!/bin/sh
# The stand-in haproxy image's entrypoint (see Dockerfile): options alone mean
# haproxy; haproxy runs as master-worker in the foreground, logging to stderr.
set -e
if [ "${1#-}" != "$1" ]; then
    set -- haproxy "$@"
fi
if [ "$1" = haproxy ]; then
    shift
    set -- haproxy -W -db "$@"
fi
exec "$@"
