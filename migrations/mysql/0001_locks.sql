-- The lease table behind the `lease-mysql` lock backend (MySQL / MariaDB).
--
-- One row per lock name, kept forever once created: releasing or expiring a
-- lease only moves `expires_at`, so `token` never restarts.
create table locks (
    name       varchar(255)    not null primary key,
    -- Random id of the current (or last) holder's grant.
    holder     varchar(64)     not null,
    -- The fencing counter: every grant adds one, in the same statement.
    token      bigint unsigned not null,
    -- Judged against the database's own clock (now(6)), never a worker's.
    expires_at datetime(6)     not null,
    -- True when the last holder released; false while held or after its lease
    -- lapsed without a release (then a lock-delay applies, as in Chubby).
    released   boolean         not null default false,
    granted_at datetime(6)     not null
) engine = InnoDB;
