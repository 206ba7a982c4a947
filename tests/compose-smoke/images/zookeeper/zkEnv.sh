# zkEnv.sh of the stand-in zookeeper image (see Dockerfile), sourced by
# Debian's zkServer.sh: the configuration in $ZOOCFGDIR, the log on the console.
ZOOMAIN=org.apache.zookeeper.server.quorum.QuorumPeerMain
ZOOCFGDIR="${ZOOCFGDIR:-/conf}"
ZOOCFG="${ZOOCFG:-$ZOOCFGDIR/zoo.cfg}"
ZOO_LOG_DIR="${ZOO_LOG_DIR:-/logs}"
JAVA=/usr/bin/java
CLASSPATH="$ZOOCFGDIR:/usr/share/java/zookeeper.jar"
SERVER_JVMFLAGS="$SERVER_JVMFLAGS -Dzookeeper.root.logger=INFO,CONSOLE"
CLIENT_JVMFLAGS="$CLIENT_JVMFLAGS -Dzookeeper.root.logger=WARN,CONSOLE"
