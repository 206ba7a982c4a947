//! From `--backend` and its connection settings to a running [`LockService`].

use std::sync::Arc;

use crate::config::{Backend, Config, ConfigError};
use fencelock::lease_table::LeaseTable;
use fencelock::redis::RedisLock;
use fencelock::redis_sentinel::RedisSentinelLock;
use fencelock::redlock::Redlock;
use fencelock::zookeeper::ZooKeeperLock;
use fencelock::{LockError, LockService};

/// Why no lock service could be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The configuration is wrong; retrying cannot help.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The lock service refused or could not be reached.
    #[error(transparent)]
    Lock(#[from] LockError),
}

impl BackendError {
    pub fn is_transient(&self) -> bool {
        matches!(self, BackendError::Lock(e) if e.is_transient())
    }

    /// The exit code of a command that failed with this: 2 for what the
    /// user must fix in the configuration, 1 for a lock service that refused
    /// or could not be reached.
    pub fn exit_code(&self) -> i32 {
        match self {
            BackendError::Config(_) | BackendError::Lock(LockError::InvalidConfig(_)) => 2,
            BackendError::Lock(_) => 1,
        }
    }
}

/// Connect to the configured lock service, fair or not as `--fair` says
/// (Redlock has no fair variant). ZooKeeper's session timeout is `--ttl`:
/// the holder trusts its session no longer than that.
pub async fn connect(config: &Config) -> Result<Arc<dyn LockService>, BackendError> {
    config.validate()?;
    let missing = |setting| ConfigError::Missing {
        backend: config.backend.name(),
        setting,
    };
    let client_id = config.client_id();
    let service: Arc<dyn LockService> = match config.backend {
        Backend::Redis => {
            let url = config.redis_url.as_deref().ok_or(missing("--redis-url"))?;
            let locks = RedisLock::connect(url).await?.with_client_id(client_id)?;
            Arc::new(if config.fair { locks } else { locks.non_fair() })
        }
        Backend::RedisSentinel => {
            let mut locks =
                RedisSentinelLock::connect(&config.redis_sentinels, &config.redis_sentinel_master)
                    .await?
                    .with_client_id(client_id)?;
            if config.redis_wait_replicas > 0 {
                locks = locks.with_wait(config.redis_wait_replicas, config.redis_wait_timeout);
            }
            if !config.fair {
                locks = locks.non_fair();
            }
            Arc::new(locks)
        }
        Backend::Redlock => {
            let urls: Vec<String> = config
                .redlock_urls
                .iter()
                .map(|u| u.trim().to_string())
                .filter(|u| !u.is_empty())
                .collect();
            Arc::new(Redlock::connect(&urls).await?.with_client_id(client_id)?)
        }
        Backend::Zookeeper => {
            let connect = config
                .zookeeper_connect
                .as_deref()
                .ok_or(missing("--zookeeper-connect"))?;
            let access = config.zookeeper_access()?;
            let locks = ZooKeeperLock::connect_with(connect, config.ttl, &access)
                .await?
                .with_client_id(client_id)?;
            Arc::new(if config.fair { locks } else { locks.non_fair() })
        }
        Backend::LeasePostgres => {
            let url = config
                .database_url
                .as_deref()
                .ok_or(missing("--database-url"))?;
            let locks = LeaseTable::postgres(url).await?.with_client_id(client_id)?;
            Arc::new(if config.fair { locks } else { locks.non_fair() })
        }
        Backend::LeaseMysql => {
            let url = config.mysql_url.as_deref().ok_or(missing("--mysql-url"))?;
            let locks = LeaseTable::mysql(url).await?.with_client_id(client_id)?;
            Arc::new(if config.fair { locks } else { locks.non_fair() })
        }
    };
    Ok(service)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;
    use fencelock::HolderLookup;
    use harness::zookeeper::secured::credentials;
    use harness::zookeeper::SecuredZooKeeper;

    use super::*;

    /// A worker given ZooKeeper credentials locks as its own user on roots
    /// an operator prepared, and the gateway's user reads who holds the
    /// lock; the same worker without them is refused by ZooKeeper.
    #[tokio::test]
    async fn a_worker_with_zookeeper_credentials_locks_as_its_own_user() {
        let zk = SecuredZooKeeper::start().await;
        let cs = zk.connect_string();
        let config = Config::try_parse_from([
            "worker",
            "--backend=zookeeper",
            &format!("--zookeeper-connect={cs}"),
            "--gateway=http://g",
            "--client-id=worker-1",
            "--zookeeper-auth=worker-1:worker-1-secret",
            "--zookeeper-lock-clients-auth=lock-clients:lock-clients-secret",
            &format!("--zookeeper-admin-id={}", credentials("admin").id()),
            &format!("--zookeeper-reader-ids={}", credentials("gateway").id()),
        ])
        .unwrap();
        let lock = config.lock_name();
        let locks = connect(&config).await.unwrap();
        let lease = locks
            .acquire(&lock, config.ttl, Duration::ZERO)
            .await
            .unwrap();
        let gateway = ZooKeeperLock::connect_with(&cs, config.ttl, &zk.reader_access("gateway"))
            .await
            .unwrap();
        let holder = gateway.current_holder(&lock).await.unwrap().unwrap();
        assert_eq!(
            (holder.client_id.as_str(), Some(holder.token)),
            ("worker-1", lease.token())
        );
        lease.release().await.unwrap();

        let anonymous = Config {
            zookeeper_auth: None,
            zookeeper_lock_clients_auth: None,
            zookeeper_admin_id: None,
            zookeeper_reader_ids: vec![],
            ..config
        };
        let refused = connect(&anonymous)
            .await
            .unwrap()
            .acquire(&lock, anonymous.ttl, Duration::ZERO)
            .await;
        assert!(
            matches!(&refused, Err(LockError::InvalidConfig(e)) if e.contains("NoAuth")),
            "{refused:?}"
        );
    }
}
