-- One row per lock name, kept forever once created: releasing or
-- expiring a lease only moves expires_at, so token never restarts.
create table if not exists {table} (
    name       text        primary key,
    -- Random id of the current (or last) grant: what renew and release match.
    holder     text        not null,
    -- Who holds it (the client id), for a storage asking who holds the lock.
    client_id  text        not null,
    -- The login (session_user) the grant was made to: only it may renew or
    -- release the lease through the functions (null: a row of a version
    -- before them).
    login      text,
    -- The fencing counter: every grant adds one, in the same statement.
    token      bigint      not null,
    -- Judged against the database's own clock (now()), never a client's.
    expires_at timestamptz not null,
    -- True when the last holder released; false while held or after its
    -- lease lapsed without a release (then a lock-delay applies, as in Chubby).
    released   boolean     not null default false,
    granted_at timestamptz not null,
    -- No place in the queue is live after this (an upper bound, raised by
    -- the statement that takes or renews a place): a fair grant that finds
    -- it past skips nobody without reading the queue.
    queued_until timestamptz
)
