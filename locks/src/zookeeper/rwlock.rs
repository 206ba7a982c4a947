//! The read-write lock (Curator's `InterProcessReadWriteLock`, the ZooKeeper
//! "shared locks" recipe) on the same queue as the fair mutex.

use std::time::Duration;

use futures::future::BoxFuture;

use super::path::NodeKind;
use super::ZooKeeperLock;
use crate::settings::Configurable;
use crate::{
    AcquireOptions, Holder, HolderLookup, Lease, LockError, LockService, LockState, Token,
};

/// A read-write lock service on ZooKeeper: many readers at once, or one
/// writer. [`read`](Self::read) and [`write`](Self::write) hand out the two
/// halves, each a [`LockService`], so a lock name is taken for reading with
/// `rw.read().acquire(name, ..)` and for writing with
/// `rw.write().acquire(name, ..)`.
///
/// # The recipe
/// Readers and writers queue EPHEMERAL_SEQUENTIAL nodes under the lock's
/// parent, `_c_<guid>-read-<seq>` and `_c_<guid>-write-<seq>` (the ZooKeeper
/// recipe's `read-`/`write-`; Curator names them `__READ__`/`__WRIT__`, so the
/// two do not queue together). A writer holds the lock once no node at all is
/// before it, and watches its predecessor. A reader holds it once no *writer*
/// is before it, and watches the nearest writer before it. So:
/// - readers that queue one after another hold the lock together;
/// - a writer waits for every reader and writer before it;
/// - a reader that arrives after a queued writer waits for that writer, even
///   while other readers hold the lock: a stream of readers cannot starve a
///   writer, and grants go in queue order.
///
/// The fair mutex ([`ZooKeeperLock`]) queues its `_c_<guid>-lock-<seq>` nodes
/// under the same parent, and both recipes treat them as writers: a mutex
/// and a read-write lock on the same name exclude each other as a writer
/// would. The non-fair mutex is refused on a name the queue uses (and the
/// other way round) with [`LockError::InvalidConfig`].
///
/// Liveness, connection loss, protected creation, cancellation and cleanup
/// are the mutex's: see the [module](super).
///
/// # Tokens
/// Every grant's token is its node's creation zxid, as for the mutex, so
/// tokens increase in queue order, which is grant order: a reader's token is
/// higher than that of every writer granted before it and lower than that of
/// every writer granted after it.
///
/// **What a writer's token means** to a fenced storage is what a mutex
/// holder's means: nobody else holds the lock, and every earlier holder's
/// token is lower. [`HolderLookup`] names the writer, so a storage that
/// asks the issuer (the gateway) accepts its writes.
///
/// **A reader's token does not exclude anybody**: other readers hold the lock
/// at the same time, each with its own token. Do not write with it. A
/// storage that *reads* with it and raises its fence to it gets one useful
/// guarantee: no writer granted before this reader (a paused, deposed one)
/// can write after this read. But [`HolderLookup`] answers "nobody holds it
/// exclusively" (`None`) while readers hold the lock, so a storage that also
/// checks tokens with the issuer, like this project's gateway, refuses a
/// reader's token: read through it without one.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencelock::LockError> {
/// use std::time::Duration;
/// use fencelock::zookeeper::ZooKeeperReadWriteLock;
/// use fencelock::LockService;
///
/// let rw = ZooKeeperReadWriteLock::connect("zk1:2181,zk2:2181,zk3:2181", Duration::from_secs(4))
///     .await?
///     .with_client_id("report-3")?;
/// let ttl = Duration::from_secs(4);
/// // Readers share the lock...
/// let read = rw.read().acquire("catalog", ttl, Duration::from_secs(10)).await?;
/// // ... read the catalog (without the token, through a gateway that checks issuers) ...
/// read.release().await?;
/// // ... a writer holds it alone; its token fences its writes like a mutex holder's.
/// let write = rw.write().acquire("catalog", ttl, Duration::from_secs(10)).await?;
/// println!("write with token {}", write.token().expect("zookeeper mints tokens"));
/// write.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZooKeeperReadWriteLock {
    lock: ZooKeeperLock,
}

/// The read half of a [`ZooKeeperReadWriteLock`].
#[derive(Clone)]
pub struct ZooKeeperReadLock {
    lock: ZooKeeperLock,
}

/// The write half of a [`ZooKeeperReadWriteLock`].
#[derive(Clone)]
pub struct ZooKeeperWriteLock {
    lock: ZooKeeperLock,
}

impl ZooKeeperReadWriteLock {
    /// Open a session, as [`ZooKeeperLock::connect`]. With credentials:
    /// [`ZooKeeperLock::connect_with`], then [`ZooKeeperLock::read_write`].
    pub async fn connect(
        connect_string: &str,
        session_timeout: Duration,
    ) -> Result<Self, LockError> {
        Ok(ZooKeeperLock::connect(connect_string, session_timeout)
            .await?
            .read_write())
    }

    /// Record `id` as this client's id in the data of every node.
    pub fn with_client_id(self, id: impl Into<String>) -> Result<Self, LockError> {
        Ok(Self {
            lock: self.lock.with_client_id(id)?,
        })
    }

    /// The read half: grants that share the lock with other readers.
    pub fn read(&self) -> ZooKeeperReadLock {
        ZooKeeperReadLock {
            lock: self.with_recipe(NodeKind::Read),
        }
    }

    /// The write half: grants that hold the lock alone.
    pub fn write(&self) -> ZooKeeperWriteLock {
        ZooKeeperWriteLock {
            lock: self.with_recipe(NodeKind::Write),
        }
    }

    /// How many acquires (of either half) are parked on a watch right now.
    pub fn parked(&self) -> u64 {
        self.lock.parked()
    }

    /// How many times a waiter (of either half) was woken by a watch.
    pub fn wakeups(&self) -> u64 {
        self.lock.wakeups()
    }

    fn with_recipe(&self, kind: NodeKind) -> ZooKeeperLock {
        let mut lock = self.lock.clone();
        lock.kind = kind;
        lock
    }
}

impl ZooKeeperLock {
    /// A read-write lock service on this session (and its counters): the
    /// queue, whether or not this service is fair.
    pub fn read_write(&self) -> ZooKeeperReadWriteLock {
        let mut lock = self.clone().set_fair(true);
        lock.kind = NodeKind::Lock;
        ZooKeeperReadWriteLock { lock }
    }
}

/// The same lookup as the mutex's: the writer (or mutex holder) at the head of
/// the queue, `None` while readers hold it.
impl HolderLookup for ZooKeeperReadWriteLock {
    fn issuer(&self) -> &str {
        HolderLookup::issuer(&self.lock)
    }

    fn current_holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Holder>, LockError>> {
        self.lock.current_holder(name)
    }

    fn state<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LockState, LockError>> {
        self.lock.state(name)
    }

    fn minted<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Token>, LockError>> {
        self.lock.minted(name)
    }
}

macro_rules! half {
    ($half:ty) => {
        /// The mutex's service, queueing as this half.
        impl LockService for $half {
            fn issuer(&self) -> &str {
                LockService::issuer(&self.lock)
            }

            fn acquire_with<'a>(
                &'a self,
                name: &'a str,
                opts: AcquireOptions,
            ) -> BoxFuture<'a, Result<Lease, LockError>> {
                self.lock.acquire_with(name, opts)
            }

            fn client_id(&self) -> &str {
                self.lock.client_id()
            }
        }
    };
}

half!(ZooKeeperReadLock);
half!(ZooKeeperWriteLock);
