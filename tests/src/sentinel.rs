//! A Redis Sentinel group from Debian's `redis-server` / `redis-sentinel`: a
//! master, one replica, three sentinels (quorum 2), each on a free port with
//! its own writable config file in one temp dir, and the controls a failover
//! test needs: freeze (SIGSTOP) and thaw a node, kill and restart it, wait
//! for the replica to catch up, wait for the sentinels to name a new master.
//!
//! Timing: `down-after-milliseconds` 1000 and `failover-timeout` 4000, so a
//! frozen master is replaced in about 2 s.
//!
//! With ACL users ([`SentinelGroup::start_with_acl`]): the data nodes have
//! [`redis_acl::DATA_NODE_USERS`], the replica authenticates to its master
//! as `replication`, the sentinels to the data nodes and to each other as
//! `sentinel`, and the sentinels have [`redis_acl::SENTINEL_USERS`]; the
//! `default` user is off everywhere. The group's own checks authenticate as
//! `admin`.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tempfile::TempDir;

use crate::process::{find_binary, free_port, temp_dir, wait_until, Recipe, ServiceProcess};
use crate::redis_acl::{self, DATA_NODE_USERS};
use crate::service::{logs, ready_or_panic, Member};

/// The master name the sentinels monitor (the worker's default too).
pub const MASTER_NAME: &str = "mymaster";
/// How long a master may not answer before a sentinel thinks it down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// Two data nodes (index 0 starts as master, 1 as its replica) and three
/// sentinels. Everything is killed on drop.
pub struct SentinelGroup {
    nodes: Vec<Member>,
    sentinels: Vec<Member>,
    /// `Some("admin")` with ACL users: what the group's checks log in as.
    admin: Option<&'static str>,
    _dir: TempDir,
}

impl SentinelGroup {
    /// Start the master, the replica and the sentinels, and wait until the
    /// replica is in sync and every sentinel knows the replica and the two
    /// other sentinels (a failover needs their votes). Open to anybody.
    pub async fn start() -> Self {
        Self::start_with(false).await
    }

    /// [`SentinelGroup::start`] with ACL users everywhere (see the module
    /// docs).
    pub async fn start_with_acl() -> Self {
        Self::start_with(true).await
    }

    async fn start_with(acl: bool) -> Self {
        let dir = temp_dir("sentinel");
        let redis_server = find_binary("redis-server", &["/usr/bin", "/usr/local/bin"]);
        let master_port = free_port();
        let mut nodes = vec![];
        for (i, port) in [master_port, free_port()].into_iter().enumerate() {
            let node_dir = dir.path().join(format!("node{i}"));
            std::fs::create_dir_all(&node_dir).expect("node dir");
            let mut conf = format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsave \"\"\nappendonly no\ndaemonize no\n",
                node_dir.display()
            );
            if i == 1 {
                conf.push_str(&format!("replicaof 127.0.0.1 {master_port}\n"));
            }
            if acl {
                // Either node may be the replica after a failover.
                conf.push_str(&redis_acl::replica_lines(redis_acl::password));
                conf.push_str(&redis_acl::user_lines(&DATA_NODE_USERS));
            }
            let cfg = node_dir.join("redis.conf");
            std::fs::write(&cfg, conf).expect("write redis.conf");
            let recipe = Recipe::new(
                redis_server.clone(),
                vec![cfg.display().to_string()],
                node_dir.join("redis.log"),
            );
            let process = ServiceProcess::spawn(format!("redis-node{i}"), recipe)
                .expect("spawn redis-server");
            nodes.push(Member { process, port });
        }
        let mut sentinels = vec![];
        for i in 0..3 {
            let port = free_port();
            let s_dir = dir.path().join(format!("sentinel{i}"));
            std::fs::create_dir_all(&s_dir).expect("sentinel dir");
            // Sentinel rewrites its config file (what it learned, its votes):
            // each one gets its own writable copy.
            let cfg = s_dir.join("sentinel.conf");
            let mut conf = format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {}\n\
                 sentinel resolve-hostnames no\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {}\n\
                 sentinel failover-timeout {MASTER_NAME} 4000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                s_dir.display(),
                DOWN_AFTER.as_millis()
            );
            if acl {
                conf.push_str(&redis_acl::sentinel_lines(MASTER_NAME, redis_acl::password));
            }
            std::fs::write(&cfg, conf).expect("write sentinel.conf");
            sentinels.push(Member {
                process: ServiceProcess::spawn(format!("redis-sentinel{i}"), sentinel_recipe(&cfg))
                    .expect("spawn redis-sentinel"),
                port,
            });
        }
        let me = Self {
            nodes,
            sentinels,
            admin: acl.then_some(redis_acl::ADMIN.name),
            _dir: dir,
        };
        me.wait_ready(Duration::from_secs(40)).await;
        me
    }

    /// `127.0.0.1:P` of each sentinel: what `REDIS_SENTINELS` takes.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }

    /// [`SentinelGroup::sentinel_addrs`] as ACL user `name`:
    /// `name:password@127.0.0.1:P` each.
    pub fn sentinel_addrs_as(&self, name: &str) -> Vec<String> {
        let userinfo = redis_acl::userinfo(name);
        self.sentinel_addrs()
            .into_iter()
            .map(|a| format!("{userinfo}{a}"))
            .collect()
    }

    /// The port of sentinel `i`.
    pub fn sentinel_port(&self, i: usize) -> u16 {
        self.sentinels[i].port
    }

    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// The port of data node `i` (0: the first master, 1: its replica).
    pub fn node_port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    pub fn node_url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}/", self.nodes[i].port)
    }

    /// [`SentinelGroup::node_url`] as ACL user `name`.
    pub fn node_url_as(&self, i: usize, name: &str) -> String {
        redis_acl::url_as(name, self.nodes[i].port)
    }

    pub fn node(&mut self, i: usize) -> &mut ServiceProcess {
        &mut self.nodes[i].process
    }

    /// SIGSTOP data node `i`: it keeps its sockets and answers nothing, as a
    /// long GC-like stall or a cut cable would look from outside.
    pub fn freeze(&mut self, i: usize) {
        self.nodes[i].process.pause();
    }

    /// Stop replica `replica` from receiving anything more from master
    /// `master`: freeze it, then have the master close its replication link
    /// (`CLIENT KILL TYPE replica`). Freezing alone is not enough: the
    /// kernel keeps receiving the stream into the frozen replica's socket
    /// buffer, and it applies all of it when thawed. Writes the master
    /// acknowledges from now on exist on the master only, until the replica
    /// reconnects (thaw it to let it try).
    pub async fn detach_replica(&mut self, replica: usize, master: usize) -> Result<(), String> {
        self.freeze(replica);
        let killed: i64 = query(
            self.admin,
            self.nodes[master].port,
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"),
        )
        .await?;
        if killed < 1 {
            return Err(format!("master {master} had no replica link to close"));
        }
        Ok(())
    }

    pub fn thaw(&mut self, i: usize) {
        self.nodes[i].process.resume();
    }

    /// SIGKILL data node `i` (no persistence: it restarts empty).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].process.kill();
    }

    /// Start data node `i` again from its config file (which the sentinels
    /// may have rewritten, e.g. into a replica of the new master).
    pub async fn start_again(&mut self, i: usize) {
        self.nodes[i].process.start().expect("restart redis node");
        let port = self.nodes[i].port;
        let what = format!("redis node {i} (port {port}), started again");
        ready_or_panic(
            &what,
            Duration::from_secs(15),
            || role_as(port, self.admin),
            || self.logs(20),
        )
        .await;
    }

    /// Which data node the sentinels name as master: the answer of a majority
    /// of them, or `None` while they disagree or do not answer.
    pub async fn named_master(&self) -> Option<usize> {
        let mut votes: HashMap<u16, usize> = HashMap::new();
        for s in &self.sentinels {
            if let Ok(port) = named_master_port(self.admin, s.port).await {
                *votes.entry(port).or_default() += 1;
            }
        }
        let (port, n) = votes.into_iter().max_by_key(|(_, n)| *n)?;
        if n < 2 {
            return None;
        }
        self.nodes.iter().position(|node| node.port == port)
    }

    /// Wait until a majority of the sentinels name node `i` as master and
    /// node `i` itself answers `ROLE` with `master`: the failover is done.
    pub async fn wait_master(&self, i: usize, timeout: Duration) -> Result<(), String> {
        let port = self.nodes[i].port;
        wait_until(timeout, || async move {
            if self.named_master().await != Some(i) {
                return Err(format!(
                    "the sentinels do not name node {i} (port {port}) yet"
                ));
            }
            match role_as(port, self.admin).await {
                Ok(r) if r == "master" => Ok(()),
                Ok(r) => Err(format!("node {i} is a {r}")),
                Err(e) => Err(e),
            }
        })
        .await
        .map_err(|e| format!("{e}\n{}", self.logs(15)))
    }

    /// Wait until replica `replica` has acknowledged everything master
    /// `master` wrote (its offset equals the master's).
    pub async fn wait_in_sync(
        &self,
        master: usize,
        replica: usize,
        timeout: Duration,
    ) -> Result<(), String> {
        let (m, r) = (self.nodes[master].port, self.nodes[replica].port);
        let admin = self.admin;
        wait_until(timeout, || async move {
            let info = info_replication(admin, m).await?;
            let master_offset = field(&info, "master_repl_offset").unwrap_or_default();
            let acked = info
                .lines()
                .filter(|l| l.starts_with("slave"))
                .find(|l| l.contains(&format!("port={r},")))
                .and_then(|l| {
                    l.split(',')
                        .find_map(|kv| kv.strip_prefix("offset="))
                        .map(str::to_string)
                });
            match acked {
                Some(o) if o == master_offset && replica_online(&info, r) => Ok(()),
                other => Err(format!(
                    "replica on {r} at offset {other:?}, master at {master_offset}"
                )),
            }
        })
        .await
    }

    /// Wait until the group is as [`SentinelGroup::start`] leaves it.
    async fn wait_ready(&self, timeout: Duration) {
        let master = self.nodes[0].port;
        let sentinels: Vec<u16> = self.sentinels.iter().map(|s| s.port).collect();
        let admin = self.admin;
        let ready = wait_until(timeout, || {
            let sentinels = sentinels.clone();
            async move {
                if role_as(master, admin).await? != "master" {
                    return Err("node 0 is not master".to_string());
                }
                for s in sentinels {
                    let m = sentinel_master(admin, s).await?;
                    let n = |k: &str| m.get(k).cloned().unwrap_or_default();
                    if n("num-slaves") != "1" || n("num-other-sentinels") != "2" {
                        return Err(format!(
                            "sentinel {s}: {} replica(s), {} other sentinel(s)",
                            n("num-slaves"),
                            n("num-other-sentinels")
                        ));
                    }
                    // Counted is not promotable: a sentinel promotes only a
                    // replica it has itself asked INFO of lately and found
                    // linked to the master; until then a failover asked of
                    // it answers NOGOODSLAVE.
                    let replicas = sentinel_replicas(admin, s).await?;
                    let promotable = replicas.iter().any(|r| {
                        let v = |k: &str| r.get(k).map(String::as_str).unwrap_or_default();
                        v("flags") == "slave"
                            && v("master-link-status") == "ok"
                            && v("info-refresh")
                                .parse::<u64>()
                                .is_ok_and(|ms| ms < INFO_FRESH_MS)
                    });
                    if !promotable {
                        return Err(format!(
                            "sentinel {s}: no replica it could promote yet: {replicas:?}"
                        ));
                    }
                }
                Ok(())
            }
        })
        .await;
        if let Err(e) = ready.and(self.wait_in_sync(0, 1, timeout).await) {
            panic!(
                "sentinel group: not ready after {timeout:?}: {e}\n{}",
                self.logs(30)
            );
        }
    }

    /// The last `n` lines of every log, for panic messages.
    pub fn logs(&self, n: usize) -> String {
        logs(
            self.nodes.iter().chain(&self.sentinels).map(|m| &m.process),
            n,
        )
    }
}

fn replica_online(info: &str, replica_port: u16) -> bool {
    info.lines()
        .any(|l| l.contains(&format!("port={replica_port},")) && l.contains("state=online"))
}

/// `redis-sentinel CONF` when Debian's `redis-sentinel` is installed, else
/// `redis-server CONF --sentinel` (the same binary in sentinel mode).
fn sentinel_recipe(cfg: &Path) -> Recipe {
    let log = cfg.with_file_name("sentinel.log");
    let dedicated = ["/usr/bin/redis-sentinel", "/usr/local/bin/redis-sentinel"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file());
    let cfg = cfg.display().to_string();
    match dedicated {
        Some(bin) => Recipe::new(bin.to_path_buf(), vec![cfg], log),
        None => Recipe::new(
            find_binary("redis-server", &["/usr/bin", "/usr/local/bin"]),
            vec![cfg, "--sentinel".into()],
            log,
        ),
    }
}

const STEP: Duration = Duration::from_millis(500);

/// A connection to the server on `port`, as ACL user `user` if given.
async fn conn(user: Option<&str>, port: u16) -> Result<MultiplexedConnection, String> {
    let url = match user {
        Some(user) => redis_acl::url_as(user, port),
        None => format!("redis://127.0.0.1:{port}/"),
    };
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(STEP)
        .set_response_timeout(STEP);
    tokio::time::timeout(
        STEP,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    .map_err(|_| format!("port {port}: connect timed out"))?
    .map_err(|e| format!("port {port}: {e}"))
}

async fn query<T: redis::FromRedisValue>(
    user: Option<&str>,
    port: u16,
    cmd: &redis::Cmd,
) -> Result<T, String> {
    let mut c = conn(user, port).await?;
    tokio::time::timeout(STEP, cmd.query_async(&mut c))
        .await
        .map_err(|_| format!("port {port}: no answer"))?
        .map_err(|e| format!("port {port}: {e}"))
}

/// The first word of `ROLE`: `master`, `slave` or `sentinel`.
pub async fn role(port: u16) -> Result<String, String> {
    role_as(port, None).await
}

/// [`role`], asked as ACL user `user` if given.
pub async fn role_as(port: u16, user: Option<&str>) -> Result<String, String> {
    let v: Vec<redis::Value> = query(user, port, &redis::cmd("ROLE")).await?;
    v.first()
        .and_then(|v| redis::from_redis_value::<String>(v).ok())
        .ok_or_else(|| format!("port {port}: empty ROLE"))
}

async fn info_replication(user: Option<&str>, port: u16) -> Result<String, String> {
    query(user, port, redis::cmd("INFO").arg("replication")).await
}

fn field(info: &str, key: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
}

/// The port the sentinel on `port` names as master.
async fn named_master_port(user: Option<&str>, port: u16) -> Result<u16, String> {
    let addr: Option<(String, u16)> = query(
        user,
        port,
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME),
    )
    .await?;
    addr.map(|(_, p)| p)
        .ok_or_else(|| format!("sentinel {port} knows no master"))
}

/// How fresh a sentinel's INFO of a replica must be for it to promote it
/// (Redis allows three INFO periods, 30 s, while the master is up).
const INFO_FRESH_MS: u64 = 20_000;

/// `SENTINEL REPLICAS`: each replica as the sentinel sees it.
async fn sentinel_replicas(
    user: Option<&str>,
    port: u16,
) -> Result<Vec<HashMap<String, String>>, String> {
    let replicas: Vec<Vec<String>> = query(
        user,
        port,
        redis::cmd("SENTINEL").arg("replicas").arg(MASTER_NAME),
    )
    .await?;
    Ok(replicas.iter().map(|flat| pairs(flat)).collect())
}

/// A sentinel's flat `[key, value, key, value, ...]` answer as a map.
fn pairs(flat: &[String]) -> HashMap<String, String> {
    flat.chunks(2)
        .filter_map(|kv| Some((kv.first()?.clone(), kv.get(1)?.clone())))
        .collect()
}

/// `SENTINEL master NAME` as a map.
async fn sentinel_master(user: Option<&str>, port: u16) -> Result<HashMap<String, String>, String> {
    let flat: Vec<String> = query(
        user,
        port,
        redis::cmd("SENTINEL").arg("master").arg(MASTER_NAME),
    )
    .await?;
    Ok(pairs(&flat))
}
