//! Redis servers as the lock tests run them (with ACL users: the locks log
//! in as the lock client's user), and plain connections to look at (or
//! tamper with) what a lock wrote there.

use harness::redis_acl;
use harness::{Persistence, Redis};
use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue};

/// The lock client's ACL user (the worker's).
pub const WORKER: &str = redis_acl::WORKER.name;
/// The operator's ACL user: what the tests read and tamper with as.
pub const ADMIN: &str = redis_acl::ADMIN.name;

/// A Redis server of the test's own, with ACL users and no persistence.
pub async fn secured() -> Redis {
    Redis::start_with_acl(Persistence::None).await
}

/// A plain connection to the server at `url`.
pub async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// `cmd`'s answer on `conn`; panics when the server refuses it.
pub async fn query<T: FromRedisValue>(conn: &mut MultiplexedConnection, cmd: &Cmd) -> T {
    cmd.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("the redis command failed: {e}"))
}

/// How many connections the server has received so far (`INFO stats`).
pub async fn connections_received(conn: &mut MultiplexedConnection) -> i64 {
    let info: String = query(conn, redis::cmd("INFO").arg("stats")).await;
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .expect("INFO stats names total_connections_received")
        .trim()
        .parse()
        .unwrap()
}
