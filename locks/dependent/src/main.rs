//! Takes a Redis lock and prints its token: the smallest program on the lock
//! library with one backend feature. `redis-only-user redis://127.0.0.1:6379/ my-lock`

use std::time::Duration;

use fencelock::redis::RedisLock;
use fencelock::LockService;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), fencelock::LockError> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let name = args.next().unwrap_or_else(|| "demo".into());
    let locks = RedisLock::connect(&url)
        .await?
        .with_client_id("redis-only-user")?;
    let lease = locks
        .acquire(&name, Duration::from_secs(2), Duration::from_secs(5))
        .await?;
    println!(
        "{name}: token {} from {}",
        lease.token().expect("redis mints tokens"),
        lease.issuer()
    );
    lease.release().await
}
