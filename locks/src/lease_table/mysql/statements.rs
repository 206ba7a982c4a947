//! The MySQL/MariaDB statements of a lease table, from the files in `sql/`.

use crate::lease_table::sql::{fill, statement};

/// The text of `sql/<name>.sql`.
macro_rules! sql {
    ($name:literal) => {
        include_str!(concat!("sql/", $name, ".sql"))
    };
}

/// The constructor's: whether the lease table has `queued_until` (bind:
/// the table's name).
pub(super) const HAS_QUEUED_UNTIL: &str = sql!("has_queued_until");
/// The constructor's: whether a trigger exists (bind: its name).
pub(super) const HAS_TRIGGER: &str = sql!("has_trigger");

/// Every MySQL/MariaDB statement of the lease table, for one table name.
/// The light fair grant and the release are also what the benchmarks run
/// through mariadb-slap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statements {
    /// Non-fair grant of an existing row. Binds: holder (twice), client id,
    /// TTL in µs, name, lock-delay in µs. Granted when one row is affected.
    /// The token comes back through `last_insert_id(expr)`, which the server
    /// returns in the statement's OK packet, so the grant and the token read
    /// are the same statement. The granted row's `GET_LOCK` of its bell runs
    /// in the same statement, on the connection that keeps it.
    ///
    /// Atomic because an InnoDB `update` takes the row's exclusive lock and
    /// evaluates its `where` on the latest committed version (a locking read,
    /// not the snapshot): of two concurrent acquirers, the second waits for
    /// the first's lock, then sees the new `expires_at` and matches nothing.
    /// The `set` list reads only the row's old values (MySQL assigns left to
    /// right, so no assignment here refers to a column assigned before it).
    pub acquire: String,
    /// Fair grant: binds as [`Statements::acquire`], then the name and the
    /// holder (as waiter id) twice. The same update, which also requires that
    /// nobody waits or the caller is the first live waiter (the subquery
    /// reads the queue; the row's condition, under its lock, keeps the grant
    /// atomic as above). A place is live while it has not lapsed AND its
    /// waiter's bell is held: a waiter whose connection closed (its process
    /// died) is skipped at once, and so is the place of a holder that
    /// released (its release let its bell go).
    pub acquire_fair: String,
    /// Fair grant, first try: binds as [`Statements::acquire`]; given only
    /// when nobody waits (no live place).
    pub acquire_fair_first: String,
    /// Fair grant, light: binds as [`Statements::acquire`]; given only when
    /// the row's `queued_until` has passed, which the queue's trigger
    /// ([`Statements::queued_trigger`]) raises to every place's `expires_at`
    /// in the transaction that takes or renews the place: a live place
    /// implies a `queued_until` ahead, so the grant skips nobody, and it
    /// reads no other table (a subquery on the queue costs InnoDB's `update`
    /// about 20 %). Refused, it is followed at once by
    /// [`Statements::acquire_fair_first`], which looks at the queue itself
    /// (`queued_until` only ever overestimates).
    pub acquire_fair_light: String,
    /// First grant of a name: the primary key lets exactly one concurrent
    /// insert win; the others are ignored (0 rows) and retry the update above
    /// on their next attempt. Binds: name, holder, client id, TTL in µs.
    pub create: String,
    /// Take the bell of a name (bind: name) after its first grant, on the
    /// connection that keeps it.
    pub ring: String,
    /// Give back every user lock of the connection (the name's bell, the
    /// waiter's own), when a release found the row no longer ours or a
    /// waiter gave up.
    pub unring: String,
    /// Fair waiter: take or renew a place in the queue and, in the same
    /// statement, the waiter's own bell (a user lock named by its id, held on
    /// the waiter's connection until its release or until it gives up).
    /// Binds: name, waiter id (twice), how long the place lasts in µs. The
    /// bell is taken before the row is committed, so a place that others can
    /// see belongs to a waiter that holds its bell, until that waiter goes
    /// away.
    pub join: String,
    /// Waiter: wait for the bell of the one before it. Binds: lock-delay in
    /// µs, the longest wait in seconds, lock-delay in µs, waiter id, name. A
    /// fair waiter (it has a place) blocks on the bell of the live place just
    /// before its own (`pred`), or, first in line, on the name's bell, which
    /// the holder takes with its grant; a non-fair waiter (no place) on the
    /// name's bell. Answers, read before it blocks, the holder's `token`,
    /// whether the lease is `held`, `pred` and whether that bell was free;
    /// then whether the bell was got (`rang`). A waiter's bell is let go at
    /// once (it only said that waiter went away); the name's bell is kept by
    /// the first in line, so that its grant needs no wait for it, and let go
    /// by the next wait if that grant was refused. It blocks at most until
    /// the lease ends (name's bell) or the place before lapses (a waiter's
    /// bell). (MariaDB evaluates a select list left to right.) Both bells are
    /// compared as utf8mb4: the column's and the connection's character sets
    /// may differ, and `if` refuses to mix them.
    pub wait: String,
    /// Delete a waiter's place (binds: name, waiter id), when it was granted
    /// or gave up, and the lapsed places of the name.
    pub leave: String,
    /// Renew: TTL in µs, name, holder, token; only while not lapsed.
    pub renew: String,
    /// Release: name, holder, token. Keeps the row; rings the bells it holds
    /// (`RELEASE_ALL_LOCKS`: the name's, and the holder's own if it waited,
    /// on which its successor in the queue blocks).
    pub release: String,
    /// Holder lookup: name.
    pub holder: String,
}

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

impl Statements {
    /// The statements for table `table` (not validated here; the
    /// constructors validate it).
    pub fn for_table(table: &str) -> Statements {
        let name_bell = bell("l.name");
        let acquire = fill(sql!("acquire"), &[("name_bell", &name_bell)]);
        let wait_bell = fill(
            sql!("wait_bell"),
            &[
                ("name_bell", &name_bell),
                ("pred_bell", &waiter_bell("p.waiter")),
            ],
        );
        let of_queue = |template: &str| {
            statement(
                template,
                table,
                &[("acquire", &acquire), ("live_place", &live_place("w"))],
            )
        };
        Statements {
            acquire_fair: of_queue(sql!("acquire_fair")),
            acquire_fair_first: of_queue(sql!("acquire_fair_first")),
            acquire_fair_light: statement(
                sql!("acquire_fair_light"),
                table,
                &[("acquire", &acquire)],
            ),
            acquire: statement(&acquire, table, &[]),
            create: statement(sql!("create"), table, &[]),
            ring: statement(sql!("ring"), table, &[("bell", &bell("?"))]),
            unring: statement(sql!("unring"), table, &[]),
            join: statement(sql!("join"), table, &[("waiter_bell", &waiter_bell("?"))]),
            wait: statement(
                sql!("wait"),
                table,
                &[
                    ("bell", &wait_bell),
                    ("name_bell", &name_bell),
                    ("live_w2", &live_place("w2")),
                    ("live_w", &live_place("w")),
                ],
            ),
            leave: statement(sql!("leave"), table, &[]),
            renew: statement(sql!("renew"), table, &[]),
            release: statement(sql!("release"), table, &[]),
            holder: statement(sql!("holder"), table, &[]),
        }
    }

    /// The tables, for your own migrations: the statements of
    /// [`Statements::ddl_statements`], separated by `;`.
    pub fn ddl(table: &str) -> String {
        Self::ddl_statements(table).join(";\n\n")
    }

    /// The tables, one statement each: the leases, their queue, and the
    /// queue's trigger ([`Statements::queued_trigger`]).
    pub fn ddl_statements(table: &str) -> Vec<String> {
        vec![
            statement(sql!("leases_table"), table, &[]),
            statement(sql!("waiters_table"), table, &[]),
            Self::queued_trigger(table),
        ]
    }

    /// The trigger that keeps `queued_until` ahead of every place, in the
    /// transaction that takes or renews it (`before insert` also fires for
    /// the renewal, an `insert ... on duplicate key update`). Before, not
    /// after: the lease row is locked before the place, the order the fair
    /// grant (lease row, then its look at the queue) takes them in, so the
    /// two cannot deadlock. Without it (or without the column) the service
    /// finds out at start and never takes the light fair grant.
    pub fn queued_trigger(table: &str) -> String {
        statement(sql!("queued_trigger"), table, &[])
    }

    /// `alter table` adding `queued_until` to a lease table made by an
    /// earlier version.
    pub(super) fn add_queued_until(table: &str) -> String {
        statement(sql!("add_queued_until"), table, &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bell_name_fits_a_user_lock_whatever_the_lock_name() {
        // 'fencelock:' + 32 hex digits = 42 characters, under MariaDB's 64.
        assert!(Statements::for_table("t")
            .ring
            .contains("md5(concat(database(), '/t/', ?))"));
    }
}
