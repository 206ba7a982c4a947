//! Take a Redis lock on `page:<id>` and write the page through the gateway
//! with the grant's fencing token: the whole contract from a user's side.
//!
//! ```sh
//! cargo run -p fencelock --features redis --example write_through_gateway -- \
//!     redis://127.0.0.1:16379/ http://127.0.0.1:8080 demo "hello from the example"
//! ```
//!
//! With `GATEWAY_API_KEY` set, the key is sent as `Authorization: Bearer`, and
//! the lock is taken as `CLIENT_ID` (default `example`), the client that key
//! belongs to: a gateway that checks tokens with their issuer accepts the
//! write only from the client the lock service says holds the lock.

use std::time::Duration;

use fencelock::redis::RedisLock;
use fencelock::LockService;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let redis_url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let gateway = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let page = args.next().unwrap_or_else(|| "demo".into());
    let body = args
        .next()
        .unwrap_or_else(|| "written by the example".into());
    let client_id = std::env::var("CLIENT_ID").unwrap_or_else(|_| "example".into());

    let locks = RedisLock::connect(&redis_url)
        .await?
        .with_client_id(client_id.clone())?;
    let lease = locks
        .acquire(
            &format!("page:{page}"),
            Duration::from_secs(5),
            Duration::from_secs(10),
        )
        .await?;
    let token = lease.token().expect("redis mints tokens");
    println!("granted page:{page} with token {token}");

    let mut put = reqwest::Client::new()
        .put(format!("{gateway}/pages/{page}"))
        .header("Fencing-Token", token.to_string())
        .header("Fencing-Issuer", lease.issuer())
        .header("Client-Id", client_id)
        .json(&serde_json::json!({ "body": body }));
    if let Ok(key) = std::env::var("GATEWAY_API_KEY") {
        put = put.bearer_auth(key);
    }
    // Stop trusting the lease before the write if it is already lost: the
    // gateway would refuse it anyway, but there is no point in sending it.
    anyhow::ensure!(!lease.is_lost(), "lease lost before the write");
    let response = put.send().await?;
    let status = response.status();
    println!("{status} {}", response.text().await?);
    lease.release().await?;
    anyhow::ensure!(status.is_success(), "the gateway refused the write");
    Ok(())
}
