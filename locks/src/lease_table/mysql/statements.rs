//! The MySQL/MariaDB statements of a lease table, from the files in `sql/`:
//! the stored functions that hold them (see [`Statements::ddl`]) and the
//! calls the library sends.

use crate::lease_table::sql::{digest, fill, statement, Function};

/// The text of `sql/<name>.sql`.
macro_rules! sql {
    ($name:literal) => {
        include_str!(concat!("sql/", $name, ".sql"))
    };
}

/// Every MySQL/MariaDB statement the library sends for one lease table:
/// calls of the table's stored functions, `<table>_<verb>` (see
/// [`Statements::ddl`]), whose bodies are the statements the fields
/// describe, and the bells' own statements (user locks, which need no
/// privilege). A user with EXECUTE on the functions (and no privilege on
/// the tables) can take, renew, wait for and release leases, and nothing
/// else: renew and release require the user the lease was granted to (a
/// grant records it), and otherwise fail with SQLSTATE 42000. The light
/// fair grant and the release are also what the benchmarks run through
/// mariadb-slap.
///
/// The functions run as their definer (`SQL SECURITY DEFINER`); the user
/// locks they take and let go (`GET_LOCK`, `RELEASE_ALL_LOCKS`) are the
/// calling connection's, as from a plain statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statements {
    /// Non-fair grant of an existing row (`<table>_grant`). Binds: holder,
    /// client id, TTL in µs, name, lock-delay in µs. Answers the new token,
    /// or null when refused. The token comes from `last_insert_id(expr)`
    /// in the same `update`, so the grant and the token read are one
    /// statement. The granted row's `GET_LOCK` of its bell runs in the same
    /// statement, on the connection that keeps it.
    ///
    /// Atomic because an InnoDB `update` takes the row's exclusive lock and
    /// evaluates its `where` on the latest committed version (a locking read,
    /// not the snapshot): of two concurrent acquirers, the second waits for
    /// the first's lock, then sees the new `expires_at` and matches nothing.
    /// The `set` list reads only the row's old values (MySQL assigns left to
    /// right, so no assignment here refers to a column assigned before it).
    pub acquire: String,
    /// Fair grant (`<table>_fair`): binds as [`Statements::acquire`]. The
    /// same update, which also requires that nobody waits or the caller is
    /// the first live waiter (the subquery reads the queue; the row's
    /// condition, under its lock, keeps the grant atomic as above). A place
    /// is live while it has not lapsed AND its waiter's bell is held: a
    /// waiter whose connection closed (its process died) is skipped at once,
    /// and so is the place of a holder that released (its release let its
    /// bell go).
    pub acquire_fair: String,
    /// Fair grant, first try (`<table>_fair_first`): binds as
    /// [`Statements::acquire`]; given only when nobody waits (no live place).
    pub acquire_fair_first: String,
    /// Fair grant, light (`<table>_fair_light`): binds as
    /// [`Statements::acquire`]; given only when the row's `queued_until`
    /// has passed, which the queue's trigger ([`Statements::queued_trigger`])
    /// raises to every place's `expires_at` in the transaction that takes or
    /// renews the place: a live place implies a `queued_until` ahead, so the
    /// grant skips nobody, and it reads no other table (a subquery on the
    /// queue costs InnoDB's `update` about 20 %). Refused, it is followed at
    /// once by [`Statements::acquire_fair_first`], which looks at the queue
    /// itself (`queued_until` only ever overestimates).
    pub acquire_fair_light: String,
    /// First grant of a name (`<table>_create`): the primary key lets
    /// exactly one concurrent insert win; the others are ignored (0) and
    /// retry the update above on their next attempt. Binds: name, holder,
    /// client id, TTL in µs. Answers 1 when it granted.
    pub create: String,
    /// Take the bell of a name (bind: name) after its first grant, on the
    /// connection that keeps it.
    pub ring: String,
    /// Give back every user lock of the connection (the name's bell, the
    /// waiter's own), when a release found the row no longer ours or a
    /// waiter gave up.
    pub unring: String,
    /// Fair waiter (`<table>_join`): take or renew a place in the queue and,
    /// in the same statement, the waiter's own bell (a user lock named by
    /// its id, held on the waiter's connection until its release or until it
    /// gives up). Binds: name, waiter id, how long the place lasts in µs.
    /// The bell is taken before the row is committed, so a place that others
    /// can see belongs to a waiter that holds its bell, until that waiter
    /// goes away.
    pub join: String,
    /// Waiter (`<table>_wait`): wait for the bell of the one before it.
    /// Binds: lock-delay in µs, the longest wait in seconds, waiter id,
    /// name. A fair waiter (it has a place) blocks on the bell of the live
    /// place just before its own (`pred`), or, first in line, on the name's
    /// bell, which the holder takes with its grant; a non-fair waiter (no
    /// place) on the name's bell. Answers, read before it blocks, the
    /// holder's `token`, whether the lease is `held`, whether that bell was
    /// free; then whether the bell was got (`rang`), whether we are first
    /// in line, and `pred` (or `-`): one text, `token held bell_free rang
    /// first_now pred`, null when the lock has no row. A waiter's bell is
    /// let go at once (it only said that waiter went away); the name's bell
    /// is kept by the first in line, so that its grant needs no wait for it,
    /// and let go by the next wait if that grant was refused. It blocks at
    /// most until the lease ends (name's bell) or the place before lapses (a
    /// waiter's bell). (MariaDB evaluates a select list left to right.) Both
    /// bells are compared as utf8mb4: the column's and the connection's
    /// character sets may differ, and `if` refuses to mix them.
    pub wait: String,
    /// Delete a waiter's place (`<table>_leave`; binds: name, waiter id),
    /// when it was granted or gave up, and the lapsed places of the name.
    pub leave: String,
    /// Renew (`<table>_renew`): TTL in µs, name, holder, token; only while
    /// not lapsed. Answers 1 when renewed.
    pub renew: String,
    /// Release (`<table>_release`): name, holder, token. Keeps the row;
    /// rings the bells it holds (`RELEASE_ALL_LOCKS`: the name's, and the
    /// holder's own if it waited, on which its successor in the queue
    /// blocks). Answers 1 when released.
    pub release: String,
    /// Holder lookup (`<table>_holder`): name. Null when the lock was never
    /// granted; else one text, `held token client_id` (`held` 1 while a
    /// lease holds it, by the database's clock; `token` the highest minted).
    pub holder: String,
    /// [`Statements::holder`]'s own statement, for a user that may only
    /// read the lease table (`select` on it, no function).
    pub read_holder: String,
}

/// The functions' parameters, in the order the library binds them: a
/// grant's; the first grant's; a place's; a wait's; a lease's; a renewal's;
/// a waiter's; a name's.
const GRANT: &str = "p_holder varchar(64), p_client varchar(128) character set utf8mb4, \
                     p_ttl bigint unsigned, p_name varbinary(255), p_delay bigint unsigned";
const CREATE: &str = "p_name varbinary(255), p_holder varchar(64), \
                      p_client varchar(128) character set utf8mb4, p_ttl bigint unsigned";
const JOIN: &str = "p_name varbinary(255), p_waiter varchar(64), p_place bigint unsigned";
const WAIT: &str =
    "p_delay bigint unsigned, p_max double, p_waiter varchar(64), p_name varbinary(255)";
const LEASE: &str = "p_name varbinary(255), p_holder varchar(64), p_token bigint unsigned";
const RENEW: &str = "p_ttl bigint unsigned, p_name varbinary(255), p_holder varchar(64), \
                     p_token bigint unsigned";
const WAITER: &str = "p_name varbinary(255), p_waiter varchar(64)";
const NAME: &str = "p_name varbinary(255)";
/// What they answer: a token (null: refused), a count, a text.
const TOKEN: &str = "bigint unsigned";
const COUNT: &str = "int";
const TEXT: &str = "varchar(200) character set utf8mb4";

/// The name's bell for the lock in column or placeholder `lock_name`: at
/// most 64 characters whatever the lock's name (`fencelock:` and 32 hex
/// digits), and distinct per database and table.
fn bell(lock_name: &str) -> String {
    fill(sql!("bell"), &[("lock_name", lock_name)])
}

/// A fair waiter's own bell, for the waiter id in column or placeholder
/// `waiter` (32 hex digits, random per acquire: 44 characters). It cannot be
/// mistaken for a name's bell (`w:` is not hex).
fn waiter_bell(waiter: &str) -> String {
    fill(sql!("waiter_bell"), &[("waiter", waiter)])
}

/// Whether the place `alias` is live: not lapsed, and its waiter's bell held
/// (by the database's clock and its user-lock table).
fn live_place(alias: &str) -> String {
    let place_bell = waiter_bell(&format!("{alias}.waiter"));
    fill(
        sql!("live_place"),
        &[("place_bell", &place_bell), ("place", alias)],
    )
}

/// The functions of table `table`, each with its body.
fn functions() -> Vec<Function> {
    let login = sql!("login");
    let name_bell = bell("l.name");
    let acquire = fill(
        sql!("acquire"),
        &[("name_bell", &name_bell), ("login", login)],
    );
    let live = live_place("w");
    let of_queue = |template: &str| fill(template, &[("acquire", &acquire), ("live_place", &live)]);
    let body = |template: &str, statement: &str| {
        let with_login = |s: &str| s.replace("{login}", login);
        with_login(&fill(template, &[("statement", &with_login(statement))]))
    };
    let grant = |statement: &str| body(sql!("body_grant"), statement);
    let wait_bell = fill(
        sql!("wait_bell"),
        &[
            ("name_bell", &name_bell),
            ("pred_bell", &waiter_bell("p.waiter")),
        ],
    );
    let wait = fill(
        sql!("wait"),
        &[
            ("bell", &wait_bell),
            ("name_bell", &name_bell),
            ("live_w2", &live_place("w2")),
            ("live_w", &live_place("w")),
        ],
    );
    let join = fill(sql!("join"), &[("waiter_bell", &waiter_bell("p_waiter"))]);
    let holder = fill(sql!("holder"), &[("name", "p_name")]);
    let f = Function::new;
    let count = |statement: &str| body(sql!("body_count"), statement);
    let matched = |statement: &str| body(sql!("body_matched"), statement);
    let fair_light = fill(sql!("acquire_fair_light"), &[("acquire", &acquire)]);
    vec![
        f("grant", GRANT, TOKEN, grant(&acquire)),
        f("fair_light", GRANT, TOKEN, grant(&fair_light)),
        f(
            "fair_first",
            GRANT,
            TOKEN,
            grant(&of_queue(sql!("acquire_fair_first"))),
        ),
        f("fair", GRANT, TOKEN, grant(&of_queue(sql!("acquire_fair")))),
        f("create", CREATE, COUNT, count(sql!("create"))),
        f("join", JOIN, COUNT, count(&join)),
        f("wait", WAIT, TEXT, body(sql!("body_wait"), &wait)),
        f("leave", WAITER, COUNT, count(sql!("leave"))),
        f("renew", RENEW, COUNT, matched(sql!("renew"))),
        f("release", LEASE, COUNT, matched(sql!("release"))),
        f("holder", NAME, TEXT, body(sql!("body_holder"), &holder)),
    ]
}

impl Statements {
    /// The statements for table `table` (not validated here; the
    /// constructors validate it).
    pub fn for_table(table: &str) -> Statements {
        let call = |verb: &str, args: &str| format!("select {table}_{verb}({args})");
        let grant = "?, ?, ?, ?, ?";
        Statements {
            acquire: call("grant", grant),
            acquire_fair: call("fair", grant),
            acquire_fair_first: call("fair_first", grant),
            acquire_fair_light: call("fair_light", grant),
            create: call("create", "?, ?, ?, ?"),
            ring: statement(sql!("ring"), table, &[("bell", &bell("?"))]),
            unring: statement(sql!("unring"), table, &[]),
            join: call("join", "?, ?, ?"),
            wait: call("wait", "?, ?, ?, ?"),
            leave: call("leave", "?, ?"),
            renew: call("renew", "?, ?, ?, ?"),
            release: call("release", "?, ?, ?"),
            holder: call("holder", "?"),
            read_holder: statement(sql!("holder"), table, &[("name", "?")]),
        }
    }

    /// The tables and their functions, for your own migrations: the
    /// statements of [`Statements::ddl_statements`], separated by `;`
    /// (a client such as `mariadb` needs another delimiter around the
    /// functions' bodies).
    pub fn ddl(table: &str) -> String {
        Self::ddl_statements(table).join(";\n\n")
    }

    /// The tables and their functions, one statement each: the leases,
    /// their queue, the queue's trigger ([`Statements::queued_trigger`]),
    /// then `create or replace` of each function (defined by the user that
    /// runs it, `SQL SECURITY DEFINER`), `<table>_version()` last. EXECUTE
    /// is then for you to grant to the lock clients (`grant execute on
    /// function <db>.<function> to ...`), or let
    /// [`install_mysql`](crate::lease_table::install_mysql) do it all.
    pub fn ddl_statements(table: &str) -> Vec<String> {
        let mut ddl = Self::table_ddl(table);
        ddl.push(Self::queued_trigger(table));
        ddl.extend(Self::function_ddl(table, true));
        ddl
    }

    /// The tables alone: the leases, then their queue.
    pub(super) fn table_ddl(table: &str) -> Vec<String> {
        vec![
            statement(sql!("leases_table"), table, &[]),
            statement(sql!("waiters_table"), table, &[]),
        ]
    }

    /// The functions, `<table>_version()` last (answering whether the
    /// queue's trigger is there: `light`).
    pub(super) fn function_ddl(table: &str, light: bool) -> Vec<String> {
        let create = |f: &Function| f.create(sql!("function"), table, &[]);
        let mut ddl: Vec<String> = functions().iter().map(create).collect();
        let version = Self::version(table);
        let version = if light {
            format!("{version} light")
        } else {
            version
        };
        let body = fill(sql!("body_version"), &[("version", &version)]);
        let version = Function::new("version", "", "varchar(64) character set utf8mb4", body);
        ddl.push(create(&version));
        ddl
    }

    /// The functions' names, `<table>_<verb>` (`<table>_version` last).
    pub(super) fn function_names(table: &str) -> Vec<String> {
        let mut names: Vec<String> = functions()
            .iter()
            .map(|f| format!("{table}_{}", f.verb))
            .collect();
        names.push(format!("{table}_version"));
        names
    }

    /// This version's digest of the tables, the trigger and the functions
    /// of `table`, with which `<table>_version()` begins.
    pub(super) fn version(table: &str) -> String {
        let mut ddl = Self::table_ddl(table);
        ddl.push(Self::queued_trigger(table));
        let create = |f: &Function| f.create(sql!("function"), table, &[]);
        ddl.extend(functions().iter().map(create));
        digest(&ddl)
    }

    /// The trigger that keeps `queued_until` ahead of every place, in the
    /// transaction that takes or renews it (`before insert` also fires for
    /// the renewal, an `insert ... on duplicate key update`). Before, not
    /// after: the lease row is locked before the place, the order the fair
    /// grant (lease row, then its look at the queue) takes them in, so the
    /// two cannot deadlock. Without it the version function says so, and
    /// the service never takes the light fair grant.
    pub fn queued_trigger(table: &str) -> String {
        statement(sql!("queued_trigger"), table, &[])
    }

    /// The user lock that serialises the installers of table `table`.
    pub(super) fn install_lock(table: &str) -> String {
        statement(sql!("install_lock"), table, &[])
    }

    /// `alter table` of `target` (`{table}` or `{table}_waiters`) of table
    /// `table`: `change` (e.g. `add column ...`).
    pub(super) fn alter(table: &str, target: &str, change: &str) -> String {
        statement(
            sql!("alter"),
            table,
            &[("target", target), ("change", change)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease_table::LONGEST_SUFFIX;

    #[test]
    fn the_bell_name_fits_a_user_lock_whatever_the_lock_name() {
        // 'fencelock:' + 32 hex digits = 42 characters, under MariaDB's 64.
        assert!(Statements::for_table("t")
            .ring
            .contains("md5(concat(database(), '/t/', ?))"));
    }

    #[test]
    fn every_function_is_named_within_the_longest_suffix() {
        for name in Statements::function_names("t") {
            assert!(name.len() - 1 <= LONGEST_SUFFIX.len(), "{name}");
        }
        let ddl = Statements::ddl("t");
        assert!(ddl.contains(&Statements::version("t")), "{ddl}");
        assert!(!ddl.contains('?'), "no placeholder left in a body");
    }
}
