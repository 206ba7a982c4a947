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

/// The demo's password of user `name` (demo/secrets/redis-*.conf): as
/// public as the test ones; a real deployment writes its own.
pub fn demo_password(name: &str) -> String {
    format!("demo-redis-{name}-not-secret")
}

/// The `default` user: off, so that a client that does not authenticate
/// can do nothing (Redis answers `NOAUTH`), and nobody can log in as it.
/// Its rules are all: Redis 7.0 replays an AOF as `default`, and checks the
/// commands of each `MULTI`/`EXEC` (how a script's writes are logged)
/// against its rules: with `-@all` the counters written by the lock's
/// scripts were dropped at the next start (`NOPERM ... EXEC` in the log).
pub const DEFAULT_USER_LINE: &str = "user default off resetkeys ~* &* +@all";

/// Config lines: [`DEFAULT_USER_LINE`], then each of `users` on with its
/// test [`password`].
pub fn user_lines(users: &[AclUser]) -> String {
    user_lines_with(users, password)
}

/// [`user_lines`] with each user's password from `password`.
pub fn user_lines_with(users: &[AclUser], password: impl Fn(&str) -> String) -> String {
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

/// A Sentinel group's data node: how it logs in to its master when it is
/// the replica (both nodes say it: they swap roles at a failover).
pub fn replica_lines(password: impl Fn(&str) -> String) -> String {
    format!(
        "masteruser {}\nmasterauth {}\n",
        REPLICATION.name,
        password(REPLICATION.name)
    )
}

/// A sentinel watching `master`: how it logs in to the data nodes and to
/// the other sentinels, then its own users ([`SENTINEL_USERS`]). After the
/// `sentinel monitor` line.
pub fn sentinel_lines(master: &str, password: impl Fn(&str) -> String) -> String {
    let (user, pass) = (SENTINEL.name, password(SENTINEL.name));
    format!(
        "sentinel auth-user {master} {user}\n\
         sentinel auth-pass {master} {pass}\n\
         sentinel sentinel-user {user}\n\
         sentinel sentinel-pass {pass}\n{}",
        user_lines_with(&SENTINEL_USERS, password)
    )
}

/// `user:password@` of user `name`, for URLs and sentinel lists.
pub fn userinfo(name: &str) -> String {
    format!("{name}:{}@", password(name))
}

/// `redis://name:password@127.0.0.1:PORT/`.
pub fn url_as(name: &str, port: u16) -> String {
    format!("redis://{}127.0.0.1:{port}/", userinfo(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of a demo/secrets/ file, comments and blank lines left out.
    fn demo_file(name: &str) -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../demo/secrets/");
        let text = std::fs::read_to_string(format!("{path}{name}"))
            .unwrap_or_else(|e| panic!("read demo/secrets/{name}: {e}"));
        text.lines()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// The demo's ACL files are the users the lock suites run under, with
    /// the demo's passwords: they cannot drift apart.
    #[test]
    fn the_demo_files_hold_the_users_the_suites_run_under() {
        assert_eq!(
            demo_file("redis-users.conf"),
            user_lines_with(&DATA_NODE_USERS, demo_password)
        );
        assert_eq!(
            demo_file("redis-replica.conf"),
            replica_lines(demo_password)
        );
        assert_eq!(
            demo_file("redis-sentinel.conf"),
            sentinel_lines("mymaster", demo_password)
        );
    }
}
