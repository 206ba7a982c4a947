//! The harness starts each real service, controls it, and cleans up.

use std::time::Duration;

use harness::service::sql_ping;
use harness::{fresh_database, fresh_mysql_database, Redis, ZooKeeper};
use sqlx::{Connection, MySqlConnection, PgConnection};

#[tokio::test]
async fn postgres_hands_out_fresh_databases() {
    let a = fresh_database().await;
    let b = fresh_database().await;
    assert_ne!(a, b);
    sql_ping::<PgConnection>(&a).await.expect("select 1");
}

#[tokio::test]
async fn postgres_survives_kill_and_start_again() {
    let mut pg = harness::Postgres::start().await;
    let url = pg.create_database().await;
    pg.kill();
    assert!(PgConnection::connect(&url).await.is_err());
    pg.start_again().await;
    PgConnection::connect(&url)
        .await
        .expect("database kept across crash");
}

/// Send `command` (RESP inline) to the redis-server on `port`; its answer.
async fn redis_says(port: u16, command: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(command.as_bytes()).await.unwrap();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn redis_restart_without_persistence_forgets_keys() {
    let mut redis = Redis::start().await;
    let port = redis.port();
    assert_eq!(redis_says(port, "SET k v\r\n").await, "+OK\r\n");
    assert_eq!(redis_says(port, "GET k\r\n").await, "$1\r\nv\r\n");
    redis.restart().await;
    assert_eq!(redis_says(port, "GET k\r\n").await, "$-1\r\n");
}

#[tokio::test]
async fn redis_pause_stops_answers_until_resume() {
    let mut redis = Redis::start().await;
    redis.process().pause();
    let attempt = tokio::time::timeout(
        Duration::from_millis(300),
        redis_says(redis.port(), "PING\r\n"),
    );
    assert!(attempt.await.is_err(), "a paused redis must not answer");
    redis.process().resume();
}

#[tokio::test]
async fn mariadb_hands_out_fresh_databases() {
    let url = fresh_mysql_database().await;
    sql_ping::<MySqlConnection>(&url).await.expect("select 1");
}

#[tokio::test]
async fn zookeeper_answers_ruok() {
    let zk = ZooKeeper::start().await;
    let stat = harness::zookeeper::four_letter(zk.port(), "srvr")
        .await
        .unwrap();
    assert!(stat.contains("Mode: standalone"), "{stat}");
}
