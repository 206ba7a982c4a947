-- The lease table behind the `lease-postgres` lock backend.
--
-- One row per lock name, kept forever once created: releasing or expiring a
-- lease only moves `expires_at`, so `token` never restarts.
create table locks (
    name       text primary key,
    -- Random id of the current (or last) holder's grant.
    holder     text        not null,
    -- The fencing counter: every grant adds one, in the same statement.
    token      bigint      not null,
    -- Judged against the database's own clock (now()), never a worker's.
    expires_at timestamptz not null,
    -- True when the last holder released; false while held or after its lease
    -- lapsed without a release (then a lock-delay applies, as in Chubby).
    released   boolean     not null default false,
    granted_at timestamptz not null
);
