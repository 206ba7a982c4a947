#!/bin/bash
# The stand-in zookeeper image's entrypoint (see Dockerfile): zoo.cfg and myid
# from the ZOO_* variables on first start, then the command as zookeeper.
set -e

if [[ "$1" = zkServer.sh && "$(id -u)" = 0 ]]; then
    chown -R zookeeper "$ZOO_DATA_DIR" "$ZOO_DATA_LOG_DIR" "$ZOO_LOG_DIR" "$ZOO_CONF_DIR"
    exec gosu zookeeper "$0" "$@"
fi

config="$ZOO_CONF_DIR/zoo.cfg"
if [[ ! -f "$config" ]]; then
    printf '%s\n' \
        "dataDir=$ZOO_DATA_DIR" \
        "dataLogDir=$ZOO_DATA_LOG_DIR" \
        "tickTime=$ZOO_TICK_TIME" \
        "initLimit=$ZOO_INIT_LIMIT" \
        "syncLimit=$ZOO_SYNC_LIMIT" \
        "autopurge.snapRetainCount=$ZOO_AUTOPURGE_SNAPRETAINCOUNT" \
        "autopurge.purgeInterval=$ZOO_AUTOPURGE_PURGEINTERVAL" \
        "maxClientCnxns=$ZOO_MAX_CLIENT_CNXNS" \
        "standaloneEnabled=$ZOO_STANDALONE_ENABLED" \
        "admin.enableServer=$ZOO_ADMINSERVER_ENABLED" >"$config"
    for server in ${ZOO_SERVERS:-server.1=localhost:2888:3888;2181}; do
        echo "$server" >>"$config"
    done
    if [[ -n "$ZOO_4LW_COMMANDS_WHITELIST" ]]; then
        echo "4lw.commands.whitelist=$ZOO_4LW_COMMANDS_WHITELIST" >>"$config"
    fi
    for entry in $ZOO_CFG_EXTRA; do
        echo "$entry" >>"$config"
    done
fi
if [[ ! -f "$ZOO_DATA_DIR/myid" ]]; then
    echo "${ZOO_MY_ID:-1}" >"$ZOO_DATA_DIR/myid"
fi
exec "$@"
