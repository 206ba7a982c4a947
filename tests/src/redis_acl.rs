//! ACL users for the harness's Redis servers, one per role, as Redis 7.0
//! enforces them: a single server ([`crate::Redis`]), the data nodes and
//! sentinels of a [`crate::SentinelGroup`], Redlock's masters. The `default`
//! user is off: a client that does not authenticate can do nothing
//! ([`DEFAULT_USER_LINE`]).
//!
//! Each rule string is what an operator pastes after
//! `user NAME on >PASSWORD` in a server's config. The lock client's list is what the
//! recipes send, found by running the lock suites under it; anything else
//! Redis refuses with `NOPERM`. A script runs with its caller's rights, so a
//! user allowed to run the lock's scripts may also write the lock's keys
//! directly: Redis cannot make the scripts the only way in.

/// One ACL user and its rules (after `user NAME on >PASSWORD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclUser {
    pub name: &'static str,
    pub rules: &'static str,
}

/// The operator: everything.
pub const ADMIN: AclUser = AclUser {
    name: "admin",
    rules: "~* &* +@all",
};

/// A lock client (a worker): the lock's keys (`lock:`, `fence:`, `queue:`,
/// `deadlines:`; Redlock's `redlock:`), its wake-up channel (`released:`),
/// and the commands of the recipes: the scripts by `EVALSHA` (`SCRIPT
/// LOAD` after a `NOSCRIPT`), the commands inside them, the waiters'
/// `SUBSCRIBE`, the Sentinel lock's `ROLE` check and `WAIT`, Redlock's
/// `SET NX PX` and `GET`, and `PING` at connect.
pub const WORKER: AclUser = AclUser {
    name: "worker",
    rules: "resetkeys ~lock:* ~fence:* ~queue:* ~deadlines:* ~redlock:* \
            resetchannels &released:* -@all +ping +evalsha +script|load \
            +del +exists +get +hget +hincrby +hmget +hset +incr +lindex +lpop +lrem +pexpire \
            +pttl +publish +rpush +time +zadd +zrangebyscore +zrem +zscore \
            +subscribe +unsubscribe +role +wait +set",
};

/// The gateway's issuer check: reads the holder hash and the counter, and
/// `ROLE` (the Sentinel lookup checks it asks the master); nothing else.
pub const GATEWAY: AclUser = AclUser {
    name: "gateway",
    rules: "resetkeys %R~lock:* %R~fence:* resetchannels -@all +ping +hmget +get +role",
};

/// What a replica authenticates as to its master (`masteruser`): the
/// minimal ACL of Redis's documentation.
pub const REPLICATION: AclUser = AclUser {
    name: "replication",
    rules: "resetkeys resetchannels -@all +psync +replconf +ping",
};

/// What a sentinel authenticates as to the data nodes (`sentinel
/// auth-user`): the ACL of Redis's Sentinel documentation.
pub const SENTINEL: AclUser = AclUser {
    name: "sentinel",
    rules: "resetkeys allchannels -@all +multi +slaveof +ping +exec +subscribe \
            +config|rewrite +role +publish +info +client|setname +client|kill +script|kill",
};

/// The users of a data node: a single server, a Sentinel group's master
/// and replica, a Redlock master.
pub const DATA_NODE_USERS: [AclUser; 5] = [ADMIN, WORKER, GATEWAY, REPLICATION, SENTINEL];

/// On the sentinels: what sentinels authenticate as to each other
/// (`sentinel sentinel-user`): their pings, hello messages and votes, and
/// the name each gives its connections (found from `ACL LOG` while the
/// group fails over).
pub const SENTINEL_PEER: AclUser = AclUser {
    name: "sentinel",
    rules: "resetchannels &__sentinel__:hello -@all +ping +publish +client|setname \
            +sentinel|is-master-down-by-addr",
};

/// On the sentinels: a client that looks for the master (a worker, the
/// gateway), and can change nothing (no `SENTINEL FAILOVER`, `SET`,
/// `REMOVE`, `MONITOR`, `CONFIG`).
pub const SENTINEL_CLIENT_RULES: &str =
    "resetchannels -@all +ping +sentinel|get-master-addr-by-name +sentinel|master";

/// The users of a sentinel: the workers and the gateway may only ask
/// where the master is.
pub const SENTINEL_USERS: [AclUser; 4] = [
    ADMIN,
    SENTINEL_PEER,
    AclUser {
        name: WORKER.name,
        rules: SENTINEL_CLIENT_RULES,
    },
    AclUser {
        name: GATEWAY.name,
        rules: SENTINEL_CLIENT_RULES,
    },
];

/// The test password of user `name`: never secret, the same on every server.
pub fn password(name: &str) -> String {
    format!("{name}-test-password")
}

/// The `default` user: off, so that a client that does not authenticate
/// can do nothing (Redis answers `NOAUTH`), and nobody can log in as it.
/// Its rules are all: Redis 7.0 replays an AOF as `default`, and checks the
/// commands of each `MULTI`/`EXEC` (how a script's writes are logged)
/// against its rules: with `-@all` the counters written by the lock's
/// scripts were dropped at the next start (`NOPERM ... EXEC` in the log).
pub const DEFAULT_USER_LINE: &str = "user default off resetkeys ~* &* +@all";

/// Config lines: [`DEFAULT_USER_LINE`], then each of `users` on with its
/// [`password`].
pub fn user_lines(users: &[AclUser]) -> String {
    let mut lines = format!("{DEFAULT_USER_LINE}\n");
    for u in users {
        lines.push_str(&format!(
            "user {} on >{} {}\n",
            u.name,
            password(u.name),
            u.rules
        ));
    }
    lines
}

/// `user:password@` of user `name`, for URLs and sentinel lists.
pub fn userinfo(name: &str) -> String {
    format!("{name}:{}@", password(name))
}

/// `redis://name:password@127.0.0.1:PORT/`.
pub fn url_as(name: &str, port: u16) -> String {
    format!("redis://{}127.0.0.1:{port}/", userinfo(name))
}
