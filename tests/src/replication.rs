//! PostgreSQL with a streaming standby, from Debian's packages: `initdb` a
//! primary, `pg_basebackup -R` a standby from it (which writes
//! `standby.signal` and `primary_conninfo`), `pg_ctl promote` it on failover.
//!
//! The standby replicates through a [`ReplicationLink`], a TCP relay owned by
//! the harness, so that a test can cut the network between the two servers
//! (both directions: WAL one way, the standby's acknowledgements the other)
//! while clients keep talking to the primary. That is how a standby falls
//! behind for real: an asynchronous primary keeps acknowledging commits the
//! standby never receives; a synchronous one stops acknowledging.
//!
//! Clients reach whichever server is primary with [`PostgresPair::url`], a
//! libpq multi-host URL with `target_session_attrs=read-write` (the gateway
//! understands it, see `gateway/src/db.rs`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;
use sqlx::postgres::PgRow;
use sqlx::{Connection, FromRow, PgConnection};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};

use crate::postgres::{initdb, postgres_user, run_tool, server_recipe, PostgresService};
use crate::process::{free_port, log_tail, temp_dir, wait_until, ServiceProcess};
use crate::service::{create_database_named, ready_or_panic, sql_ping_at, Database};

/// How the primary waits for the standby before acknowledging a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// The primary acknowledges a commit once it is on its own disk; the
    /// standby follows when it can (`synchronous_standby_names` empty).
    Async,
    /// `synchronous_standby_names = '*'`, `synchronous_commit = on`: a commit
    /// is acknowledged once the standby has it on disk.
    Sync,
    /// `synchronous_commit = remote_apply`: once the standby has replayed it
    /// (a read on the standby then sees it too).
    SyncRemoteApply,
}

impl Replication {
    pub fn name(self) -> &'static str {
        match self {
            Replication::Async => "async",
            Replication::Sync => "sync",
            Replication::SyncRemoteApply => "sync-remote-apply",
        }
    }

    fn synchronous_commit(self) -> Option<&'static str> {
        match self {
            Replication::Async => None,
            Replication::Sync => Some("on"),
            Replication::SyncRemoteApply => Some("remote_apply"),
        }
    }
}

/// Settings of both servers (either can become primary).
fn replication_settings() -> Vec<String> {
    [
        "wal_level=replica",
        "max_wal_senders=10",
        "wal_keep_size=256MB",
        "hot_standby=on",
        // A standby whose primary went away tries again after this long
        // (default 5 s); a restarted primary gets its standby back quickly.
        "wal_retrieve_retry_interval=200ms",
        "wal_receiver_status_interval=1s",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

struct Node {
    port: u16,
    dir: PathBuf,
    process: Option<ServiceProcess>,
}

impl Node {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn url(&self, db: &str) -> String {
        PostgresService::url_at(self.port, db)
    }

    fn spawn(&mut self, name: &str) {
        let recipe = server_recipe(&self.data(), self.port, &self.dir, &replication_settings());
        self.process = Some(ServiceProcess::spawn(name, recipe).expect("spawn postgres"));
    }

    /// The end of its log (which outlives its process: see [`server_recipe`]).
    fn log_tail(&self, n: usize) -> String {
        log_tail(&self.dir.join("postgres.log"), n)
    }

    async fn wait_ready(&self) {
        let what = format!("postgres on port {}", self.port);
        ready_or_panic(
            &what,
            Duration::from_secs(60),
            || sql_ping_at::<PostgresService>(self.port),
            || format!("--- log ---\n{}", self.log_tail(40)),
        )
        .await;
    }
}

/// A primary and a streaming standby on free ports, data in a temp dir.
/// Every process is killed on drop.
pub struct PostgresPair {
    replication: Replication,
    nodes: [Node; 2],
    primary: usize,
    /// The node that streams from the primary; `None` between a promotion and
    /// [`PostgresPair::rebuild_standby`].
    standby: Option<usize>,
    link: Option<ReplicationLink>,
    _dir: TempDir,
}

impl PostgresPair {
    /// initdb and start a primary, take a base backup of it through the
    /// replication link, start the standby, wait until it streams (and, in
    /// the synchronous modes, until the primary counts it as synchronous).
    pub async fn start(replication: Replication) -> Self {
        let (uid, gid) = postgres_user();
        let dir = temp_dir("pg-pair");
        let node = |i: usize| {
            let d = dir.path().join(format!("node{i}"));
            std::fs::create_dir_all(&d).expect("node dir");
            std::os::unix::fs::chown(&d, Some(uid), Some(gid)).expect("chown node dir");
            Node {
                port: free_port(),
                dir: d,
                process: None,
            }
        };
        let mut me = Self {
            replication,
            nodes: [node(0), node(1)],
            primary: 0,
            standby: None,
            link: None,
            _dir: dir,
        };
        initdb(&me.nodes[0].data()).await;
        me.nodes[0].spawn("postgres-node0");
        me.nodes[0].wait_ready().await;
        me.rebuild_standby().await;
        me
    }

    pub fn replication(&self) -> Replication {
        self.replication
    }

    /// `postgres://postgres@127.0.0.1:P0,127.0.0.1:P1/db?target_session_attrs=read-write`:
    /// both servers, in a fixed order; a client takes the one that accepts writes.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
            self.nodes[0].port, self.nodes[1].port
        )
    }

    /// The current primary alone.
    pub fn primary_url(&self, db: &str) -> String {
        self.nodes[self.primary].url(db)
    }

    /// The standby alone, if there is one.
    pub fn standby_url(&self, db: &str) -> Option<String> {
        self.standby.map(|s| self.nodes[s].url(db))
    }

    pub fn primary_port(&self) -> u16 {
        self.nodes[self.primary].port
    }

    pub fn standby_port(&self) -> Option<u16> {
        self.standby.map(|s| self.nodes[s].port)
    }

    pub fn ports(&self) -> [u16; 2] {
        [self.nodes[0].port, self.nodes[1].port]
    }

    pub fn has_standby(&self) -> bool {
        self.standby.is_some()
    }

    /// Create a database on the primary (it replicates like any write) and
    /// return its multi-host [`PostgresPair::url`].
    pub async fn create_database(&self) -> String {
        let name = create_database_named::<PgConnection>(&self.primary_url("postgres")).await;
        self.url(&name)
    }

    /// The primary's current WAL position (bytes since the start of WAL).
    pub async fn primary_lsn(&self) -> Result<u64, sqlx::Error> {
        lsn(
            &self.primary_url("postgres"),
            "select pg_current_wal_lsn()::text",
        )
        .await
    }

    /// How far the standby has received WAL.
    pub async fn standby_received_lsn(&self) -> Result<u64, sqlx::Error> {
        let url = self
            .standby_url("postgres")
            .ok_or(sqlx::Error::PoolClosed)?;
        lsn(
            &url,
            "select coalesce(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::text",
        )
        .await
    }

    /// Wait until the standby has replayed everything the primary had written
    /// when this was called.
    pub async fn wait_caught_up(&self, timeout: Duration) -> Result<(), String> {
        let target = self.primary_lsn().await.map_err(|e| e.to_string())?;
        let url = self.standby_url("postgres").ok_or("no standby")?;
        wait_until(timeout, || async {
            let replayed = lsn(&url, "select pg_last_wal_replay_lsn()::text")
                .await
                .map_err(|e| e.to_string())?;
            if replayed >= target {
                Ok(())
            } else {
                Err(format!("standby replayed {replayed}, primary at {target}"))
            }
        })
        .await
    }

    /// Cut the network between primary and standby, both ways. Bytes already
    /// in flight are held by the link (and lost if the link is dropped).
    pub fn cut_replication(&self) {
        if let Some(link) = &self.link {
            link.cut();
        }
    }

    pub fn heal_replication(&self) {
        if let Some(link) = &self.link {
            link.heal();
        }
    }

    /// SIGKILL every process of the primary: a crash.
    pub fn kill_primary(&mut self) {
        if let Some(p) = self.nodes[self.primary].process.as_mut() {
            p.kill();
        }
    }

    /// Start the (killed) primary again on its data; it recovers from its WAL
    /// and keeps its role. The standby reconnects by itself.
    pub async fn start_primary_again(&mut self) {
        let node = &mut self.nodes[self.primary];
        match node.process.as_mut() {
            Some(p) => p.start().expect("restart postgres"),
            None => node.spawn("postgres-primary"),
        }
        node.wait_ready().await;
    }

    /// Fail over: drop the replication link (whatever it held never reaches
    /// the standby), `pg_ctl promote` the standby, wait until it accepts
    /// writes. The old primary must be dead already (see
    /// [`PostgresPair::kill_primary`]): nothing here fences it off.
    /// The new primary runs without a standby, so without synchronous
    /// replication, until [`PostgresPair::rebuild_standby`].
    pub async fn promote(&mut self) -> Duration {
        let standby = self.standby.expect("a standby to promote");
        self.link = None;
        let started = tokio::time::Instant::now();
        let data = self.nodes[standby].data();
        let mut args = vec!["promote".into(), "-D".into(), data.as_os_str().to_owned()];
        args.extend(["-w", "-t", "60"].map(Into::into));
        run_tool("pg_ctl", &args, &data, || {
            format!("--- log ---\n{}", self.nodes[standby].log_tail(30))
        })
        .await;
        let url = self.nodes[standby].url("postgres");
        let what = format!("promoting the standby on port {}", self.nodes[standby].port);
        ready_or_panic(
            &what,
            Duration::from_secs(60),
            || async {
                match fetch_one(&url, "select pg_is_in_recovery()").await? {
                    (true,) => Err(anyhow!("still in recovery")),
                    (false,) => Ok(()),
                }
            },
            || format!("--- log ---\n{}", self.nodes[standby].log_tail(30)),
        )
        .await;
        self.primary = standby;
        self.standby = None;
        started.elapsed()
    }

    /// Make the node that is not primary a fresh standby of the primary: kill
    /// it if it runs, delete its data, `pg_basebackup -R` through a new link,
    /// start it, wait until it streams; in the synchronous modes, then make
    /// the primary wait for it.
    pub async fn rebuild_standby(&mut self) {
        let s = 1 - self.primary;
        self.link = None;
        if let Some(p) = self.nodes[s].process.as_mut() {
            p.kill();
        }
        self.nodes[s].process = None;
        let data = self.nodes[s].data();
        let _ = std::fs::remove_dir_all(&data);
        let link = ReplicationLink::start(self.primary_port())
            .await
            .expect("start the replication link");
        base_backup(&data, link.port()).await;
        self.link = Some(link);
        self.nodes[s].spawn(&format!("postgres-node{s}"));
        self.nodes[s].wait_ready().await;
        self.standby = Some(s);
        self.wait_streaming().await;
        if let Some(commit) = self.replication.synchronous_commit() {
            self.make_synchronous(commit).await;
        }
    }

    async fn wait_streaming(&self) {
        let url = self.primary_url("postgres");
        let streaming = "select count(*) from pg_stat_replication where state = 'streaming'";
        ready_or_panic(
            "the standby's replication",
            Duration::from_secs(60),
            || async {
                match fetch_one::<(i64,)>(&url, streaming).await? {
                    (0,) => Err(anyhow!("no standby streaming yet")),
                    _ => Ok(()),
                }
            },
            || self.logs(30),
        )
        .await;
    }

    /// `ALTER SYSTEM` on the primary (after the base backup, so a standby's
    /// copy never carries it: a promoted standby must not wait for a standby
    /// it does not have), reload, and wait until the standby counts as `sync`.
    async fn make_synchronous(&self, commit: &str) {
        let url = self.primary_url("postgres");
        let mut conn = PgConnection::connect(&url)
            .await
            .expect("connect to primary");
        for stmt in [
            "alter system set synchronous_standby_names = '*'".to_string(),
            format!("alter system set synchronous_commit = '{commit}'"),
            "select pg_reload_conf()".to_string(),
        ] {
            sqlx::query(&stmt)
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{stmt}: {e}"));
        }
        let _ = conn.close().await;
        let states = "select coalesce(string_agg(sync_state, ','), '') from pg_stat_replication";
        ready_or_panic(
            "the synchronous standby",
            Duration::from_secs(30),
            || async {
                let (states,): (String,) = fetch_one(&url, states).await?;
                if states.split(',').any(|s| s == "sync") {
                    Ok(())
                } else {
                    Err(anyhow!("sync states [{states}]"))
                }
            },
            || self.logs(30),
        )
        .await;
    }

    /// The last `n` lines of both servers' logs.
    pub fn logs(&self, n: usize) -> String {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let role = if i == self.primary {
                    "primary"
                } else {
                    "standby"
                };
                format!(
                    "--- node{i} ({role}, port {}) ---\n{}",
                    node.port,
                    node.log_tail(n)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

async fn base_backup(data: &Path, port: u16) {
    let mut args = vec!["-D".into(), data.as_os_str().to_owned()];
    let port = port.to_string();
    args.extend(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"].map(Into::into));
    // -R: write standby.signal and primary_conninfo (pointing at the link).
    args.extend(["-R", "-X", "stream", "-c", "fast", "--no-sync"].map(Into::into));
    run_tool("pg_basebackup", &args, data, String::new).await;
}

/// Connect to `url`, fetch the one row of `query`, disconnect.
async fn fetch_one<T>(url: &str, query: &str) -> Result<T, sqlx::Error>
where
    T: for<'r> FromRow<'r, PgRow> + Send + Unpin,
{
    let mut conn = PgConnection::connect(url).await?;
    let row = sqlx::query_as(query).fetch_one(&mut conn).await?;
    let _ = conn.close().await;
    Ok(row)
}

async fn lsn(url: &str, query: &str) -> Result<u64, sqlx::Error> {
    let (text,): (Option<String>,) = fetch_one(url, query).await?;
    text.as_deref()
        .and_then(parse_lsn)
        .ok_or_else(|| sqlx::Error::Protocol(format!("no LSN from {query}: {text:?}")))
}

/// `16/B374D848` -> bytes.
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// A TCP relay between a standby and its primary that a test can cut: a
/// network partition of the replication connection alone.
pub struct ReplicationLink {
    port: u16,
    cut: watch::Sender<bool>,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
    accept: JoinHandle<()>,
}

impl ReplicationLink {
    /// Listen on a free 127.0.0.1 port and relay to `upstream_port`.
    pub async fn start(upstream_port: u16) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (cut, _) = watch::channel(false);
        let conns: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn({
            let cut = cut.clone();
            let conns = conns.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let task = tokio::spawn({
                        let (a, b) = (cut.subscribe(), cut.subscribe());
                        async move {
                            tokio::select! {
                                _ = pump(cr, sw, a) => {}
                                _ = pump(sr, cw, b) => {}
                            }
                        }
                    });
                    conns.lock().expect("link conns").push(task.abort_handle());
                }
            }
        });
        Ok(Self {
            port,
            cut,
            conns,
            accept,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stop relaying, both ways; what was read is held.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Relay again, held bytes first.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for ReplicationLink {
    fn drop(&mut self) {
        self.accept.abort();
        for c in self.conns.lock().expect("link conns").drain(..) {
            c.abort();
        }
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Cut while reading: hold these bytes until healed (or dropped).
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn lsns_are_parsed_as_byte_positions() {
        assert_eq!(super::parse_lsn("0/0"), Some(0));
        assert_eq!(
            super::parse_lsn("16/B374D848"),
            Some((0x16 << 32) | 0xB374_D848)
        );
        assert_eq!(super::parse_lsn("x"), None);
    }
}
