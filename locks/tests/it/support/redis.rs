//! Plain connections to a Redis server, to look at (or tamper with) what a
//! lock wrote there.

use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue};

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
