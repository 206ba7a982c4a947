//! Least privilege on the lease tables, on both databases: an owner installs
//! the tables and their functions ([`install_postgres`], [`install_mysql`]);
//! lock clients take, wait for, renew and release locks with EXECUTE on the
//! functions alone; a reader looks holders up with SELECT on the lease table
//! alone. Every refusal asserted here comes from the database (PostgreSQL
//! SQLSTATE 42501; MariaDB error 1142 on a table, 1370 on a function) or
//! from the functions' own owner check (PostgreSQL 42501, MariaDB SQLSTATE
//! 42000, "granted to another login"), each beside a positive control: the
//! same login does what it must.

use std::time::Duration;

use fencelock::lease_table::{install_mysql, install_postgres, Install, LeaseTable};
use fencelock::{AcquireOptions, HolderLookup, LockError, Token};
use sqlx::mysql::MySqlDatabaseError;
use sqlx::{Connection, MySqlConnection, PgConnection};

use super::{names_are_compared_byte_for_byte, Db};
use crate::support::fair::Queue;
use crate::support::{granted, held, held_with, holder_of, spawn_acquire, take_and_release};

const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(50);

/// The logins of one test's database, by URL.
struct Logins {
    /// The superuser's (root's): to look at the tables.
    admin: String,
    /// The owner of the tables and functions, which installs them.
    owner: String,
    /// Two lock clients.
    a: String,
    b: String,
    /// A reader.
    reader: String,
    /// Who `install` names as lock clients (PostgreSQL: their group role).
    clients: Vec<String>,
}

impl Logins {
    /// What the owner installs: the lock clients, the reader.
    fn install(&self) -> Install {
        let install = Install::new().reader(user(&self.reader));
        self.clients.iter().fold(install, |i, c| i.lock_client(c))
    }
}

/// The user of `url`.
fn user(url: &str) -> &str {
    let rest = url.split_once("://").unwrap().1;
    rest.split([':', '@']).next().unwrap()
}

/// The database of `url`.
fn database(url: &str) -> &str {
    url.rsplit('/').next().unwrap()
}

/// How one database says no (on MariaDB: the error's number and its
/// SQLSTATE).
struct Codes {
    /// To a statement on a table that the login has no privilege on.
    table_denied: &'static str,
    /// To a call of a function that the login may not execute.
    function_denied: &'static str,
    /// The functions, to another login's renew or release of a lease.
    other_login: &'static str,
}

/// One database's side of the tests: its logins, how it says no, and what
/// the tests send it.
#[derive(Debug, Clone, Copy)]
enum Side {
    Pg,
    My,
}

impl Side {
    /// How the database and the functions say no.
    fn codes(self) -> Codes {
        match self {
            Side::Pg => Codes {
                table_denied: "42501",
                function_denied: "42501",
                other_login: "42501",
            },
            Side::My => Codes {
                table_denied: "1142 (42000)",
                function_denied: "1370 (42000)",
                other_login: "1644 (42000)",
            },
        }
    }

    /// A lock client's own statements on the tables, each to be refused.
    fn direct(self) -> [String; 8] {
        let (max, now, day) = match self {
            Side::Pg => (i64::MAX.to_string(), "now()", "interval '1 day'"),
            Side::My => (u64::MAX.to_string(), "now(6)", "interval 1 day"),
        };
        [
            "select * from fencelock_leases".into(),
            format!("update fencelock_leases set token = {max}"),
            format!(
                "insert into fencelock_leases \
                 (name, holder, client_id, token, expires_at, granted_at) \
                 values ('page', 'h', 'c', {max}, {now} + {day}, {now})"
            ),
            "delete from fencelock_leases".into(),
            "select * from fencelock_leases_waiters".into(),
            format!("update fencelock_leases_waiters set expires_at = {now}"),
            format!(
                "insert into fencelock_leases_waiters (name, waiter, expires_at) \
                 values ('page', 'w', {now})"
            ),
            "delete from fencelock_leases_waiters".into(),
        ]
    }

    /// A grant of lock `page`, which a reader may not make.
    fn grant(self) -> &'static str {
        match self {
            Side::Pg => "select fencelock_leases_grant_light('page', 'h', 60, 0, 'c')",
            Side::My => "select fencelock_leases_grant('h', 'c', 60000000, 'page', 0)",
        }
    }

    /// The owner's replacement of `<table>_version()` by another version's.
    fn old_version(self) -> &'static str {
        match self {
            Side::Pg => {
                "create or replace function fencelock_leases_version() returns text \
                 language plpgsql as $$ begin return 'old'; end $$"
            }
            Side::My => {
                "create or replace function fencelock_leases_version() \
                 returns varchar(64) sql security definer return 'old'"
            }
        }
    }

    /// Another login's calls of release and renew, with the holder id and
    /// token of `a`'s lease.
    fn impostor(self, holder: &str, token: i64) -> [String; 2] {
        let ttl = match self {
            Side::Pg => "60",
            Side::My => "60000000",
        };
        let renew = match self {
            Side::Pg => format!("'page', '{holder}', {token}, {ttl}"),
            Side::My => format!("{ttl}, 'page', '{holder}', {token}"),
        };
        [
            format!("select fencelock_leases_release('page', '{holder}', {token})"),
            format!("select fencelock_leases_renew({renew})"),
        ]
    }

    /// A fresh database with its owner, two lock clients and a reader;
    /// installed when `install`.
    async fn logins(self, install: bool) -> Logins {
        let logins = match self {
            Side::Pg => pg_logins().await,
            Side::My => my_logins().await,
        };
        if install {
            self.install(&logins.owner, &logins.install())
                .await
                .unwrap();
        }
        logins
    }

    /// `sql` as `url`'s login.
    async fn execute(self, url: &str, sql: &str) -> Result<(), sqlx::Error> {
        match self {
            Side::Pg => execute::<PgConnection>(url, sql).await,
            Side::My => execute::<MySqlConnection>(url, sql).await,
        }
    }

    /// `sql` as `url`'s login: the refusal (code, message) it must get. On
    /// MariaDB the code is the error's number and its SQLSTATE.
    async fn refused(self, url: &str, sql: &str) -> (String, String) {
        let refused = self.execute(url, sql).await;
        let Err(sqlx::Error::Database(d)) = refused else {
            panic!("{sql}: expected a refusal, got {refused:?}");
        };
        let code = match d.try_downcast_ref::<MySqlDatabaseError>() {
            Some(my) => format!("{} ({})", my.number(), my.code().unwrap_or("-")),
            None => d.code().unwrap().into_owned(),
        };
        (code, d.message().into())
    }

    /// A lock client's service on `url` (creation on, as by default).
    async fn service(self, url: &str) -> Result<LeaseTable, LockError> {
        match self {
            Side::Pg => LeaseTable::postgres(url).await,
            Side::My => LeaseTable::mysql(url).await,
        }
    }

    /// A reader's holder lookup on `url`.
    async fn reader(self, url: &str) -> LeaseTable {
        let reader = match self {
            Side::Pg => LeaseTable::postgres_reader(url).await,
            Side::My => LeaseTable::mysql_reader(url).await,
        };
        reader.expect("a reader's lookup")
    }

    /// Install as `url`'s login.
    async fn install(self, url: &str, install: &Install) -> Result<(), LockError> {
        match self {
            Side::Pg => install_postgres(url, install).await,
            Side::My => install_mysql(url, install).await,
        }
    }

    /// A look at the tables, as the superuser, for the queue claims; new
    /// services on it log in as `url`'s login.
    async fn db(self, logins: &Logins, url: &str) -> Db {
        match self {
            Side::Pg => Db::Postgres(
                sqlx::PgPool::connect(&logins.admin).await.unwrap(),
                url.into(),
            ),
            Side::My => Db::MySql(
                sqlx::MySqlPool::connect(&logins.admin).await.unwrap(),
                url.into(),
            ),
        }
    }

    /// The holder id and token of lock `page`'s row.
    async fn holder_row(self, admin: &str) -> (String, i64) {
        let sql = "select holder, cast(token as char) from fencelock_leases where name = 'page'";
        let (holder, token): (String, String) = match self {
            Side::Pg => {
                let sql = sql.replace("char", "text");
                let mut conn = PgConnection::connect(admin).await.unwrap();
                sqlx::query_as(&sql).fetch_one(&mut conn).await.unwrap()
            }
            Side::My => {
                let mut conn = MySqlConnection::connect(admin).await.unwrap();
                sqlx::query_as(sql).fetch_one(&mut conn).await.unwrap()
            }
        };
        (holder, token.parse().unwrap())
    }
}

/// `sql` on a connection of its own to `url`.
async fn execute<C>(url: &str, sql: &str) -> Result<(), sqlx::Error>
where
    C: Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    let mut conn = C::connect(url).await.unwrap();
    sqlx::raw_sql(sql).execute(&mut conn).await.map(drop)
}

/// A fresh PostgreSQL database, owned by its owner role, with two lock
/// clients (members of a group role, which the install names) and a
/// reader.
async fn pg_logins() -> Logins {
    let admin = harness::fresh_database().await;
    let db = database(&admin).to_string();
    let role = |suffix: &str| format!("{db}_{suffix}");
    let create = |name: String, login: bool, groups: Vec<String>| {
        let admin = admin.clone();
        async move {
            let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
            harness::postgres::create_role(&admin, &name, login, &groups).await
        }
    };
    let owner = create(role("owner"), true, vec![]).await;
    let own = format!("alter database {db} owner to {}", role("owner"));
    Side::Pg.execute(&admin, &own).await.unwrap();
    let group = role("locks");
    create(group.clone(), false, vec![]).await;
    Logins {
        a: create(role("a"), true, vec![group.clone()]).await,
        b: create(role("b"), true, vec![group.clone()]).await,
        reader: create(role("reader"), true, vec![]).await,
        owner,
        admin,
        clients: vec![group],
    }
}

/// A fresh MariaDB database, all privileges on it to its owner (with grant
/// option), two lock client users and a reader.
async fn my_logins() -> Logins {
    let admin = harness::fresh_mysql_database().await;
    let db = database(&admin).to_string();
    let create = |suffix: &str| {
        let (admin, name) = (admin.clone(), format!("{db}_{suffix}"));
        async move { harness::mariadb::create_user(&admin, &name).await }
    };
    let owner = create("owner").await;
    let grant = format!(
        "grant all on {db}.* to '{}'@'%' with grant option",
        user(&owner)
    );
    Side::My.execute(&admin, &grant).await.unwrap();
    let (a, b) = (create("a").await, create("b").await);
    Logins {
        clients: vec![user(&a).into(), user(&b).into()],
        a,
        b,
        reader: create("reader").await,
        owner,
        admin,
    }
}

/// Lock clients of two logins queue fairly and hand the lock on: `a` holds
/// (its watchdog renews it past its TTL), `b` and then `a2` (another
/// service of `a`'s login) wait; `a`'s release wakes `b` (on MariaDB its
/// bell), `b`'s hands the lock to `a2` (on PostgreSQL in the release
/// itself, recording `a`'s login from its place), whose own release is
/// accepted. The waiters wait on a 60 s fallback poll: only a wake explains
/// their grants. Names differing in case are two locks.
async fn lock_clients_take_wait_renew_and_release(side: Side) {
    let logins = side.logins(true).await;
    let a = side.service(&logins.a).await.expect("a lock client starts");
    let b = side
        .service(&logins.b)
        .await
        .unwrap()
        .with_poll_fallback(WAIT);
    let a2 = side
        .service(&logins.a)
        .await
        .unwrap()
        .with_poll_fallback(WAIT);
    let db = side.db(&logins, &logins.a).await;
    let ttl = Duration::from_millis(600);
    let lease = held_with(&a, "page", AcquireOptions::new(ttl)).await;
    tokio::time::sleep(ttl * 2).await;
    assert!(!lease.is_lost(), "renewed by the watchdog");

    let waiting_b = spawn_acquire(&b, "page", TTL, WAIT);
    db.wait_queued("page", 1).await;
    db.wait_blocked(1).await;
    let waiting_a2 = spawn_acquire(&a2, "page", TTL, WAIT);
    db.wait_queued("page", 2).await;
    db.wait_blocked(2).await;
    lease.release().await.unwrap();
    let lease_b = granted(waiting_b, "b, woken by a's release").await;
    lease_b.release().await.unwrap();
    let lease_a2 = granted(waiting_a2, "a2, after b").await;
    assert_eq!(lease_a2.token().unwrap().get(), 3);
    let reader = side.reader(&logins.reader).await;
    let holder = reader.current_holder("page").await.unwrap();
    assert_eq!(holder, holder_of(&lease_a2));
    lease_a2.release().await.unwrap();
    for svc in [&b, &a2] {
        assert_eq!(svc.wait_stats().timed_out, 0, "{:?}", svc.wait_stats());
    }
    db.wait_queued("page", 0).await;
    names_are_compared_byte_for_byte(&a).await;
}

/// A lock client's own reads and writes of both tables are refused by the
/// database (permission denied for the table); the same login takes and
/// releases the lock through the functions, and the refused writes left no
/// trace: the next token is 2.
async fn the_database_refuses_a_lock_clients_own_statements(side: Side) {
    let logins = side.logins(true).await;
    let a = side.service(&logins.a).await.unwrap();
    take_and_release(&a, "page", TTL).await;
    for sql in side.direct() {
        let (code, message) = side.refused(&logins.a, &sql).await;
        assert_eq!(code, side.codes().table_denied, "{sql}: {message}");
    }
    let lease = held(&a, "page", TTL).await;
    assert_eq!(lease.token(), Token::new(2));
    lease.release().await.unwrap();
}

/// Another lock client that learnt the holder id and token of `a`'s lease
/// (here from the table; on PostgreSQL also from a hand-over's
/// notification, which any connection can hear) cannot release or renew
/// it: the function refuses, naming the reason. The lease stays `a`'s,
/// whose own release is accepted.
async fn another_login_cannot_end_or_extend_a_lease(side: Side) {
    let logins = side.logins(true).await;
    let a = side.service(&logins.a).await.unwrap();
    let lease = held_with(&a, "page", AcquireOptions::new(TTL).auto_renew(false)).await;
    let (holder, token) = side.holder_row(&logins.admin).await;
    for sql in side.impostor(&holder, token) {
        let (code, message) = side.refused(&logins.b, &sql).await;
        assert_eq!(code, side.codes().other_login, "{sql}: {message}");
        assert!(message.contains("granted to another login"), "{message}");
    }
    let reader = side.reader(&logins.reader).await;
    let holder = reader.current_holder("page").await.unwrap();
    assert_eq!(holder, holder_of(&lease), "still a's");
    lease.release().await.expect("a's own release");
}

/// A reader looks the holder up (and the highest token minted) with its
/// SELECT alone; the database refuses it a grant and a write, and a lock
/// service on its login does not start.
async fn a_reader_looks_and_does_nothing_else(side: Side) {
    let logins = side.logins(true).await;
    let a = side.service(&logins.a).await.unwrap();
    let reader = side.reader(&logins.reader).await;
    assert_eq!(reader.current_holder("page").await.unwrap(), None);
    let lease = held(&a, "page", TTL).await;
    let state = reader.state("page").await.unwrap();
    assert_eq!(state.holder, holder_of(&lease));
    assert_eq!(state.minted, lease.token());
    let (code, message) = side.refused(&logins.reader, side.grant()).await;
    assert_eq!(code, side.codes().function_denied, "{message}");
    let (code, message) = side.refused(&logins.reader, &side.direct()[1]).await;
    assert_eq!(code, side.codes().table_denied, "{message}");
    match side.service(&logins.reader).await {
        Err(LockError::InvalidConfig(msg)) => assert!(msg.contains("no EXECUTE"), "{msg}"),
        other => panic!("a reader's lock service: {other:?}"),
    }
    lease.release().await.unwrap();
}

/// Before anything is installed, a reader (which creates nothing, even on
/// a login that could) finds nothing granted: no holder, no token minted
/// beyond 0. (The superuser's login: on MariaDB a user without a grant on
/// the database cannot connect to it.)
async fn a_reader_before_the_install_finds_nothing_granted(side: Side) {
    let logins = side.logins(false).await;
    let reader = side.reader(&logins.admin).await;
    let state = reader
        .state("page")
        .await
        .expect("no table: nothing granted");
    assert_eq!(state.holder, None);
    assert_eq!(state.minted, Some(Token::MIN));
}

/// Functions of another version: a lock client does not start, and says
/// what to run; the owner's install (two at once, then a third) brings
/// them to this version, and it starts.
async fn an_install_upgrades_what_lock_clients_refuse(side: Side) {
    let logins = side.logins(true).await;
    side.execute(&logins.owner, side.old_version())
        .await
        .unwrap();
    match side.service(&logins.a).await {
        Err(LockError::InvalidConfig(msg)) => {
            assert!(msg.contains("another version"), "{msg}");
            assert!(msg.contains("Install::lock_client"), "{msg}");
        }
        other => panic!("a lock client on old functions: {other:?}"),
    }
    let install = logins.install();
    let (one, two) = tokio::join!(
        side.install(&logins.owner, &install),
        side.install(&logins.owner, &install)
    );
    one.and(two).expect("concurrent installs");
    side.install(&logins.owner, &install).await.unwrap();
    let a = side.service(&logins.a).await.unwrap();
    take_and_release(&a, "page", TTL).await;
}

macro_rules! rights {
    ($side:expr, $($name:ident => $claim:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                $claim($side).await;
            }
        )*
    };
}

rights!(Side::Pg,
    postgres_lock_clients_take_wait_renew_and_release_through_the_functions =>
        lock_clients_take_wait_renew_and_release,
    postgres_refuses_a_lock_clients_own_statements_on_the_tables =>
        the_database_refuses_a_lock_clients_own_statements,
    postgres_another_login_cannot_release_or_renew_a_lease_with_its_holder_and_token =>
        another_login_cannot_end_or_extend_a_lease,
    postgres_a_reader_looks_up_holders_and_can_neither_take_nor_write =>
        a_reader_looks_and_does_nothing_else,
    postgres_an_install_upgrades_functions_that_lock_clients_refuse =>
        an_install_upgrades_what_lock_clients_refuse,
    postgres_a_reader_before_the_install_finds_nothing_granted =>
        a_reader_before_the_install_finds_nothing_granted,
);

rights!(Side::My,
    mysql_lock_clients_take_wait_renew_and_release_through_the_functions =>
        lock_clients_take_wait_renew_and_release,
    mysql_refuses_a_lock_clients_own_statements_on_the_tables =>
        the_database_refuses_a_lock_clients_own_statements,
    mysql_another_login_cannot_release_or_renew_a_lease_with_its_holder_and_token =>
        another_login_cannot_end_or_extend_a_lease,
    mysql_a_reader_looks_up_holders_and_can_neither_take_nor_write =>
        a_reader_looks_and_does_nothing_else,
    mysql_an_install_upgrades_functions_that_lock_clients_refuse =>
        an_install_upgrades_what_lock_clients_refuse,
    mysql_a_reader_before_the_install_finds_nothing_granted =>
        a_reader_before_the_install_finds_nothing_granted,
);

/// PostgreSQL: a lock client that may not create tables finds nothing
/// installed: it does not start, and says what to run.
#[tokio::test]
async fn postgres_a_lock_client_does_not_start_before_the_install() {
    let logins = Side::Pg.logins(false).await;
    match LeaseTable::postgres(&logins.a).await {
        Err(LockError::InvalidConfig(msg)) => {
            assert!(msg.contains("are missing"), "{msg}");
            assert!(msg.contains("install_postgres"), "{msg}");
        }
        other => panic!("a lock client before the install: {other:?}"),
    }
}

/// PostgreSQL: a lock client's temporary table named as the lease table
/// (PostgreSQL looks in `pg_temp` first unless told otherwise) does not
/// stand in for it inside the functions: they name `pg_temp` last.
#[tokio::test]
async fn postgres_a_lock_clients_temporary_table_does_not_stand_in_for_the_lease_table() {
    let logins = Side::Pg.logins(true).await;
    let mut conn = PgConnection::connect(&logins.a).await.unwrap();
    let shadow = "create temp table fencelock_leases (name text primary key, holder text, \
                  client_id text, login text, token bigint, expires_at timestamptz, \
                  released boolean, granted_at timestamptz, queued_until timestamptz)";
    sqlx::raw_sql(shadow).execute(&mut conn).await.unwrap();
    let token: Option<i64> = sqlx::query_scalar(Side::Pg.grant())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(token, Some(1));
    let shadowed: i64 = sqlx::query_scalar("select count(*) from pg_temp.fencelock_leases")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(shadowed, 0, "the temporary table was not written");
    let (_, real) = Side::Pg.holder_row(&logins.admin).await;
    assert_eq!(real, 1, "the lease table was");
}
