//! The PostgreSQL statements of a lease table, from the files in `sql/`:
//! the functions that hold them (one per statement, see [`Statements::ddl`])
//! and the calls the library sends.

use crate::lease_table::sql::{digest, fill, statement, Function};
#[cfg(test)]
use crate::lease_table::LONGEST_SUFFIX;

/// The text of `sql/<name>.sql`.
macro_rules! sql {
    ($name:literal) => {
        include_str!(concat!("sql/", $name, ".sql"))
    };
}

/// PostgreSQL: a listener's own channel is this and its key; the release
/// statements name it the same way (see [`Statements::release`]).
pub(super) const OWN_CHANNEL: &str = "fencelock_";

/// Every PostgreSQL statement the library sends for one lease table: a call
/// of one of the table's functions each, `<table>_<verb>` (see
/// [`Statements::ddl`]), whose body is the statement the field describes.
/// A login with EXECUTE on them (and no privilege on the tables) can take,
/// renew, wait for and release leases, and nothing else: renew, release and
/// give back require the login that the lease was granted to (a grant
/// records `session_user`; a hand-over, the waiter's login kept in its
/// place), and otherwise fail with SQLSTATE 42501. The light grant and
/// release are also what the benchmarks run through pgbench.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statements {
    /// Non-fair grant (`<table>_grant`). `$1` name, `$2` holder, `$3` TTL
    /// in seconds, `$4` lock-delay in seconds, `$5` client id. Returns one
    /// row: `token` (the new token, or null when the lock is taken) and
    /// `wait_secs` (how long the current lease still runs, by the database's
    /// clock; the waiter's bound).
    ///
    /// Atomic because `insert ... on conflict do update` either inserts the
    /// row (the primary key lets exactly one concurrent insert win) or locks
    /// the existing row and evaluates the `where` against its latest committed
    /// version: of two concurrent acquirers, the second waits for the first's
    /// row lock, then sees the new `expires_at` and updates nothing.
    pub acquire: String,
    /// Non-fair grant, light (`<table>_grant_light`): the grant of
    /// [`Statements::acquire`] alone (`$1`..`$5` the same), returning the new
    /// token, or null when refused. The first try of an acquire whose lock
    /// this service has not seen contended lately (see "The uncontended path"
    /// in [`crate::lease_table`]); a refusal is followed at once by
    /// [`Statements::acquire`], which says how long to wait.
    pub acquire_light: String,
    /// Fair grant, light (`<table>_fair_light`): [`Statements::acquire_light`]
    /// given only when the row's `queued_until` has passed (`$1`..`$5` the
    /// same). The statements that take or renew a place raise `queued_until`
    /// to the place's end in the same statement, so a live place implies it
    /// lies ahead and this grant skips nobody; it reads no other table (the
    /// queue probe it replaced cost 3–5 %). It neither queues nor says how
    /// long to wait: a refusal is followed at once by
    /// [`Statements::acquire_fair_first`], which reads the queue itself
    /// (`queued_until` only ever overestimates).
    pub acquire_fair_light: String,
    /// Fair grant (`<table>_fair`): `$1`..`$5` as [`Statements::acquire`],
    /// `$6` how long a place in the queue lasts, in seconds (0: do not
    /// queue). Same answer.
    ///
    /// One statement: `first` reads the first live waiter (lowest ticket,
    /// place not lapsed); `granted` is the grant of `acquire`, given only
    /// when nobody waits or the caller is `first`; then, granted, the
    /// caller's place is deleted, or, refused, the caller's is taken or
    /// renewed; either way the lapsed places of others are deleted. The
    /// grant's atomicity is `acquire`'s: the row's condition is evaluated
    /// under its lock. The queue is read from the statement's snapshot, which
    /// orders grants but is not needed for their safety. A fourth column,
    /// `handed`, says the lock was already the caller's (its holder id and
    /// its login), handed over by a release ([`Statements::release`]) whose
    /// notification it has not seen (lost with a listening connection, or
    /// crossed with this try): the token is that grant's, and nothing is
    /// queued.
    pub acquire_fair: String,
    /// Fair grant, first try (`<table>_fair_first`): [`Statements::acquire`]
    /// given only when nobody waits (no live place in the queue); `$6` as
    /// [`Statements::acquire_fair`]. Refused, the same statement takes the
    /// caller's place in the queue (so a waiter's first refusal costs no
    /// second statement), and its next tries run [`Statements::acquire_fair`].
    ///
    /// A refused fair try that takes or renews its place raises the lease
    /// row's `queued_until` to the place's end, in the same statement (after
    /// the grant's look at the row, before the place: the lease row is
    /// locked first, as every other statement does).
    pub acquire_fair_first: String,
    /// Renew (`<table>_renew`): `$1` name, `$2` holder, `$3` token, `$4` TTL
    /// in seconds. True when the lease was ours (and live).
    pub renew: String,
    /// Release of a fair holder that waited (`<table>_release`): `$1` name,
    /// `$2` holder, `$3` token. True when released, false when the row was
    /// no longer ours. It hands the lock over: the first live place in the
    /// queue is granted in the same statement (its waiter's holder id,
    /// client id, login and TTL, kept in the place; the token plus one) and
    /// deleted, and the notification (delivered at commit) says so:
    /// `<waiter>=<token> <name>`. That waiter's acquire returns on the
    /// notification, with no statement of its own: a hand-over costs one
    /// statement, where a release and then the waiter's grant cost two round
    /// trips one after the other (ZooKeeper's lock recipe hands over the
    /// same way: the next node holds the lock as soon as the one before it
    /// is deleted). Nobody live in the queue (or a place from a version
    /// without the hand-off), it releases, keeping the row, and notifies `*`
    /// (or that waiter's id). The lease row is locked first, then the place,
    /// as every other statement does; a waiter that leaves the queue
    /// meanwhile either deletes its place first (then nothing is handed
    /// over) or finds it gone and gives back what it was handed
    /// ([`Statements::give_back`]). The releaser's own place, left over if it
    /// was handed the lock while its try was queueing it again, is deleted
    /// too.
    ///
    /// A notification that names a waiter goes to that waiter's process's
    /// own channel, `fencelock_<key>`, when the waiter's id is
    /// `<key>.<random>` (the key is its [`LeaseTable`]'s listener's), else
    /// (no waiter, or an id from a version before the channels) to the
    /// table's, which every listener hears. A key is 16 hex digits, and only
    /// such a key makes a channel: an id of another shape must not name a
    /// channel too long for PostgreSQL (63 bytes), which would fail the
    /// release.
    ///
    /// [`LeaseTable`]: crate::lease_table::LeaseTable
    pub release: String,
    /// Give back a lease handed to a waiter that gave up
    /// (`<table>_give_back`; `$1` name, `$2` the waiter's id, which is its
    /// holder id): released as [`Statements::release`] does without a
    /// hand-over, naming the first live waiter.
    pub give_back: String,
    /// Release, light (`<table>_release_light`): [`Statements::release`]
    /// without looking at the queue; the payload is `* <name>`, which wakes
    /// every waiter of the lock (the first in line is granted, the others
    /// wait again). The release of a non-fair lock (whose waiters wake on
    /// any release anyway), and of a fair one not seen contended lately.
    pub release_light: String,
    /// A fair waiter that gives up deletes its place (`<table>_leave`; `$1`
    /// name, `$2` waiter) and, if it was first, wakes the waiter after it (by
    /// name: that one knows it was behind), or, nobody after it, every
    /// waiter. True when it found its place: when not, a release may have
    /// handed it the lock, and [`Statements::give_back`] follows.
    pub leave: String,
    /// Holder lookup (`<table>_holder`): `$1` name. No row when the lock
    /// was never granted; else its client id, its token (the highest minted)
    /// and whether a lease holds it (neither released nor lapsed, by the
    /// database's clock).
    pub holder: String,
    /// [`Statements::holder`]'s own statement, for a login that may only
    /// read the lease table (`select` on it, no function).
    pub read_holder: String,
}

/// The statements each function runs, built from the SQL files.
struct Bodies {
    acquire_light: String,
    acquire: String,
    acquire_fair_light: String,
    acquire_fair_first: String,
    acquire_fair: String,
}

impl Bodies {
    fn for_table(table: &str) -> Bodies {
        let grant = |source: &str, queue_check: &str| {
            fill(
                sql!("grant"),
                &[("source", source), ("queue_check", queue_check)],
            )
        };
        let acquire_light = grant(sql!("grant_values"), "");
        let (held_for, take_place) = (sql!("held_for"), sql!("take_place"));
        let of_queue = |template: &str, source: &str| {
            let grant = grant(source, "");
            let parts = [
                ("grant", grant.as_str()),
                ("take_place", take_place),
                ("held_for", held_for),
            ];
            statement(template, table, &parts)
        };
        Bodies {
            acquire: statement(
                sql!("acquire"),
                table,
                &[("grant", &acquire_light), ("held_for", held_for)],
            ),
            acquire_fair_light: statement(
                &grant(sql!("grant_values"), sql!("queue_passed")),
                table,
                &[],
            ),
            acquire_fair_first: of_queue(sql!("acquire_fair_first"), sql!("grant_if_nobody_waits")),
            acquire_fair: of_queue(sql!("acquire_fair"), sql!("grant_if_first")),
            acquire_light: statement(&acquire_light, table, &[]),
        }
    }
}

/// Its grant's parameters: name, holder, TTL, lock-delay, client id.
const GRANT: &str = "text, text, float8, float8, text";
/// A fair grant's: those, and how long a place lasts.
const FAIR: &str = "text, text, float8, float8, text, float8";
/// What a try answers.
const TRIED: &str = "table (token bigint, wait_secs float8, behind boolean)";

/// The functions of table `table`, each with its body (the schema left as
/// `{schema}`).
fn functions(table: &str) -> Vec<Function> {
    let b = Bodies::for_table(table);
    let query = |s: &str| fill(sql!("body_query"), &[("statement", s)]);
    let token = |s: &str| fill(sql!("body_token"), &[("statement", s)]);
    let not_ours = |token_match: &str| fill(sql!("not_ours"), &[("token_match", token_match)]);
    let notify = |s: &str, token_match: &str| {
        let parts = [("statement", s), ("not_ours", &not_ours(token_match))];
        fill(sql!("body_notify"), &parts)
    };
    let channel = fill(
        sql!("channel"),
        &[
            (
                "waiter",
                "coalesce(s.waiter, (select n.waiter from next n))",
            ),
            ("own_channel", OWN_CHANNEL),
        ],
    );
    let release = fill(sql!("release"), &[("channel", &channel)]);
    let by_token = " and l.token = $3";
    let renew = fill(
        sql!("body_renew"),
        &[
            ("statement", sql!("renew")),
            ("not_ours", &not_ours(by_token)),
        ],
    );
    let f = Function::new;
    vec![
        f("grant", GRANT, TRIED, query(&b.acquire)),
        f("grant_light", GRANT, "bigint", token(&b.acquire_light)),
        f("fair_light", GRANT, "bigint", token(&b.acquire_fair_light)),
        f("fair_first", FAIR, TRIED, query(&b.acquire_fair_first)),
        f(
            "fair",
            FAIR,
            "table (token bigint, wait_secs float8, behind boolean, handed boolean)",
            query(&b.acquire_fair),
        ),
        f("renew", "text, text, bigint, float8", "boolean", renew),
        f(
            "release",
            "text, text, bigint",
            "boolean",
            notify(&release, by_token),
        ),
        f(
            "release_light",
            "text, text, bigint",
            "boolean",
            notify(sql!("release_light"), by_token),
        ),
        f(
            "give_back",
            "text, text",
            "boolean",
            notify(sql!("give_back"), ""),
        ),
        f(
            "leave",
            "text, text",
            "boolean",
            fill(sql!("body_leave"), &[("statement", sql!("leave"))]),
        ),
        f(
            "holder",
            "text",
            "table (client_id text, token bigint, held boolean)",
            query(sql!("holder")),
        ),
    ]
}

/// `create or replace function` of `f` for table `table` in schema
/// `schema` (a quoted identifier).
fn create(table: &str, schema: &str, f: &Function) -> String {
    f.create(sql!("function"), table, &[("schema", schema)])
}

impl Statements {
    /// The statements for table `table` (not validated here; the
    /// constructors validate it).
    pub fn for_table(table: &str) -> Statements {
        let call = |verb: &str, args: &str| format!("select {table}_{verb}({args})");
        let rows = |verb: &str, args: &str| format!("select * from {table}_{verb}({args})");
        let (grant, fair) = ("$1, $2, $3, $4, $5", "$1, $2, $3, $4, $5, $6");
        Statements {
            acquire: rows("grant", grant),
            acquire_light: call("grant_light", grant),
            acquire_fair_light: call("fair_light", grant),
            acquire_fair: rows("fair", fair),
            acquire_fair_first: rows("fair_first", fair),
            renew: call("renew", "$1, $2, $3, $4"),
            release: call("release", "$1, $2, $3"),
            give_back: call("give_back", "$1, $2"),
            release_light: call("release_light", "$1, $2, $3"),
            leave: call("leave", "$1, $2"),
            holder: rows("holder", "$1"),
            read_holder: statement(sql!("holder"), table, &[]),
        }
    }

    /// The tables and their functions, for your own migrations: the
    /// statements of [`Statements::ddl_statements`], separated by `;`.
    pub fn ddl(table: &str, schema: &str) -> String {
        Self::ddl_statements(table, schema).join(";\n\n")
    }

    /// The tables and their functions, one statement each: the leases,
    /// their queue, then `create or replace` of each function (owned by the
    /// role that runs it; SECURITY DEFINER), and the revocation of EXECUTE
    /// from PUBLIC. `schema` is the schema they are created in (the
    /// `current_schema()` of the session that runs them), which the
    /// functions' `search_path` names. EXECUTE is then for you to grant to
    /// the lock clients (`grant execute on function ... to ...`), or let
    /// [`install_postgres`](crate::lease_table::install_postgres) do it all.
    pub fn ddl_statements(table: &str, schema: &str) -> Vec<String> {
        let schema = quote_ident(schema);
        let mut ddl = Self::table_ddl(table);
        ddl.extend(functions(table).iter().map(|f| create(table, &schema, f)));
        ddl.push(create(table, &schema, &version_function(table)));
        ddl.push(statement(
            sql!("revoke"),
            table,
            &[("functions", &Self::signatures(table).join(", "))],
        ));
        ddl
    }

    /// The tables alone: the leases, then their queue.
    pub(super) fn table_ddl(table: &str) -> Vec<String> {
        [sql!("leases_table"), sql!("waiters_table")]
            .into_iter()
            .map(|ddl| statement(ddl, table, &[]))
            .collect()
    }

    /// Each function's signature, `<table>_<verb>(<types>)` (the version
    /// function last).
    pub(super) fn signatures(table: &str) -> Vec<String> {
        let mut all: Vec<String> = functions(table)
            .iter()
            .map(|f| format!("{table}_{}({})", f.verb, f.params))
            .collect();
        all.push(format!("{table}_version()"));
        all
    }

    /// The holder lookup's signature, `<table>_holder(text)`.
    pub(super) fn holder_signature(table: &str) -> String {
        format!("{table}_holder(text)")
    }

    /// This version's digest of the tables and functions of `table`, which
    /// `<table>_version()` returns.
    pub(super) fn version(table: &str) -> String {
        let mut ddl = Self::table_ddl(table);
        ddl.extend(functions(table).iter().map(|f| create(table, "s", f)));
        digest(&ddl)
    }

    /// `alter table` adding `column` of type `column_type` to `target`
    /// (`{table}` or `{table}_waiters`) of table `table`.
    pub(super) fn add_column(table: &str, target: &str, column: &str, column_type: &str) -> String {
        statement(
            sql!("add_column"),
            table,
            &[
                ("target", target),
                ("column", column),
                ("column_type", column_type),
            ],
        )
    }
}

/// `<table>_version()`, which returns [`Statements::version`].
fn version_function(table: &str) -> Function {
    let version = Statements::version(table);
    let body = fill(sql!("body_version"), &[("version", &version)]);
    Function::new("version", "", "text", body)
}

/// `name` as a PostgreSQL identifier, quoted.
pub(super) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_is_named_within_the_longest_suffix() {
        for signature in Statements::signatures("t") {
            let name = signature.split('(').next().unwrap();
            assert!(name.len() - 1 <= LONGEST_SUFFIX.len(), "{name}");
        }
        assert!(Statements::signatures("t").contains(&"t_release_light(text, text, bigint)".into()));
        let ddl = Statements::ddl("t", "public");
        assert!(ddl.contains(&Statements::version("t")));
        assert!(ddl.contains("set search_path = pg_catalog, \"public\", pg_temp"));
        assert_ne!(Statements::version("t"), Statements::version("u"));
    }
}
