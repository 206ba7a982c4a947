//! The PostgreSQL statements of a lease table, from the files in `sql/`.

use crate::lease_table::sql::{fill, statement};

/// The text of `sql/<name>.sql`.
macro_rules! sql {
    ($name:literal) => {
        include_str!(concat!("sql/", $name, ".sql"))
    };
}

/// The constructor's: serialise the creators of one table.
pub(super) const SERIALISE_CREATION: &str = sql!("serialise_creation");
/// The constructor's: the columns of the table and its queue.
pub(super) const COLUMNS: &str = sql!("columns");

/// PostgreSQL: a listener's own channel is this and its key; the release
/// statements name it the same way (see [`Statements::release`]).
pub(super) const OWN_CHANNEL: &str = "fencelock_";

/// Every PostgreSQL statement of the lease table, for one table name. The
/// light grant and release are also what the benchmarks run through pgbench.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statements {
    /// Non-fair grant. `$1` name, `$2` holder, `$3` TTL in seconds, `$4`
    /// lock-delay in seconds, `$5` client id. Returns one row: `token` (the
    /// new token, or null when the lock is taken) and `wait_secs` (how long
    /// the current lease still runs, by the database's clock; the waiter's
    /// bound).
    ///
    /// Atomic because `insert ... on conflict do update` either inserts the
    /// row (the primary key lets exactly one concurrent insert win) or locks
    /// the existing row and evaluates the `where` against its latest committed
    /// version: of two concurrent acquirers, the second waits for the first's
    /// row lock, then sees the new `expires_at` and updates nothing.
    pub acquire: String,
    /// Non-fair grant, light: the grant of [`Statements::acquire`] alone
    /// (`$1`..`$5` the same), returning the new token, or no row when
    /// refused. The first try of an acquire whose lock this service has not
    /// seen contended lately (see "The uncontended path" in
    /// [`crate::lease_table`]); a refusal is followed at once by
    /// [`Statements::acquire`], which says how long to wait.
    pub acquire_light: String,
    /// Fair grant, light: [`Statements::acquire_light`] given only when the
    /// row's `queued_until` has passed (`$1`..`$5` the same). The statements
    /// that take or renew a place raise `queued_until` to the place's end in
    /// the same statement, so a live place implies it lies ahead and this
    /// grant skips nobody; it reads no other table (the queue probe it
    /// replaced cost 3–5 %). It neither queues nor says how long to wait: a
    /// refusal is followed at once by [`Statements::acquire_fair_first`],
    /// which reads the queue itself (`queued_until` only ever overestimates).
    pub acquire_fair_light: String,
    /// Fair grant: `$1`..`$5` as [`Statements::acquire`], `$6` how long a
    /// place in the queue lasts, in seconds (0: do not queue). Same answer.
    ///
    /// One statement: `first` reads the first live waiter (lowest ticket,
    /// place not lapsed); `granted` is the grant of `acquire`, given only
    /// when nobody waits or the caller is `first`; then, granted, the
    /// caller's place is deleted, or, refused, the caller's is taken or
    /// renewed; either way the lapsed places of others are deleted. The
    /// grant's atomicity is `acquire`'s: the row's condition is evaluated
    /// under its lock. The queue is read from the statement's snapshot, which
    /// orders grants but is not needed for their safety. A fourth column,
    /// `handed`, says the lock was already the caller's, handed over by a
    /// release ([`Statements::release`]) whose notification it has not seen
    /// (lost with a listening connection, or crossed with this try): the
    /// token is that grant's, and nothing is queued.
    pub acquire_fair: String,
    /// Fair grant, first try: [`Statements::acquire`] given only when nobody
    /// waits (no live place in the queue); `$6` as
    /// [`Statements::acquire_fair`]. The uncontended path of the fair lock:
    /// one index probe more than the non-fair grant. Refused, the same
    /// statement takes the caller's place in the queue (so a waiter's first
    /// refusal costs no second statement), and its next tries run
    /// [`Statements::acquire_fair`].
    ///
    /// A refused fair try that takes or renews its place raises the lease
    /// row's `queued_until` to the place's end, in the same statement (after
    /// the grant's look at the row, before the place: the lease row is
    /// locked first, as every other statement does).
    pub acquire_fair_first: String,
    /// Renew: `$1` name, `$2` holder, `$3` token, `$4` TTL in seconds.
    pub renew: String,
    /// Release of a fair holder that waited: `$1` name, `$2` holder, `$3`
    /// token. Answers a row when released, none when the row was no longer
    /// ours. It hands the lock over: the first live place in the queue is
    /// granted in the same statement (its waiter's holder id, client id and
    /// TTL, kept in the place; the token plus one) and deleted, and the
    /// notification (delivered at commit) says so: `<waiter>=<token> <name>`.
    /// That waiter's acquire returns on the notification, with no statement
    /// of its own: a hand-over costs one statement, where a release and then
    /// the waiter's grant cost two round trips one after the other
    /// (ZooKeeper's lock recipe hands over the same way: the next node holds
    /// the lock as soon as the one before it is deleted). Nobody live in the
    /// queue (or a place from a version without the hand-off), it releases,
    /// keeping the row, and notifies `*` (or that waiter's id). The lease row
    /// is locked first, then the place, as every other statement does; a
    /// waiter that leaves the queue meanwhile either deletes its place first
    /// (then nothing is handed over) or finds it gone and gives back what it
    /// was handed ([`Statements::give_back`]). The releaser's own place, left
    /// over if it was handed the lock while its try was queueing it again, is
    /// deleted too.
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
    /// Give back a lease handed to a waiter that gave up (`$1` name, `$2` the
    /// waiter's id, which is its holder id): released as
    /// [`Statements::release`] does without a hand-over, naming the first
    /// live waiter.
    pub give_back: String,
    /// Release, light: [`Statements::release`] without looking at the queue;
    /// the payload is `* <name>`, which wakes every waiter of the lock (the
    /// first in line is granted, the others wait again). The release of a
    /// non-fair lock (whose waiters wake on any release anyway), and of a
    /// fair one not seen contended lately.
    pub release_light: String,
    /// A fair waiter that gives up deletes its place (`$1` name, `$2` waiter)
    /// and, if it was first, wakes the waiter after it (by name: that one
    /// knows it was behind), or, nobody after it, every waiter. Answers how
    /// many it notified and whether it found its place (`left_queue`): when
    /// not, a release may have handed it the lock, and
    /// [`Statements::give_back`] follows.
    pub leave: String,
    /// Holder lookup: `$1` name. The client id and token of a lease that is
    /// neither released nor lapsed, by the database's clock.
    pub holder: String,
}

impl Statements {
    /// The statements for table `table` (not validated here; the
    /// constructors validate it).
    pub fn for_table(table: &str) -> Statements {
        let grant = |source: &str, queue_check: &str| {
            fill(
                sql!("grant"),
                &[("source", source), ("queue_check", queue_check)],
            )
        };
        let acquire_light = grant(sql!("grant_values"), "");
        let (held_for, take_place) = (sql!("held_for"), sql!("take_place"));
        let waiter = "coalesce(s.waiter, (select n.waiter from next n))";
        let channel = fill(
            sql!("channel"),
            &[("waiter", waiter), ("own_channel", OWN_CHANNEL)],
        );
        let of_queue = |template: &str, source: &str| {
            let grant = grant(source, "");
            let parts = [
                ("grant", grant.as_str()),
                ("take_place", take_place),
                ("held_for", held_for),
            ];
            statement(template, table, &parts)
        };
        let plain = |template: &str| statement(template, table, &[]);
        Statements {
            acquire: statement(
                sql!("acquire"),
                table,
                &[("grant", &acquire_light), ("held_for", held_for)],
            ),
            acquire_fair_light: plain(&grant(sql!("grant_values"), sql!("queue_passed"))),
            acquire_fair_first: of_queue(sql!("acquire_fair_first"), sql!("grant_if_nobody_waits")),
            acquire_fair: of_queue(sql!("acquire_fair"), sql!("grant_if_first")),
            acquire_light: plain(&acquire_light),
            renew: plain(sql!("renew")),
            release: statement(sql!("release"), table, &[("channel", &channel)]),
            give_back: plain(sql!("give_back")),
            release_light: plain(sql!("release_light")),
            leave: plain(sql!("leave")),
            holder: plain(sql!("holder")),
        }
    }

    /// The tables, for your own migrations: the statements of
    /// [`Statements::ddl_statements`], separated by `;`.
    pub fn ddl(table: &str) -> String {
        Self::ddl_statements(table).join(";\n\n")
    }

    /// The tables, one statement each: the leases, then their queue.
    pub fn ddl_statements(table: &str) -> Vec<String> {
        [sql!("leases_table"), sql!("waiters_table")]
            .into_iter()
            .map(|ddl| statement(ddl, table, &[]))
            .collect()
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
