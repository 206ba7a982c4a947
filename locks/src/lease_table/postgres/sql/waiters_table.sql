-- The fair queue: one row per waiting client, first come (lowest
-- ticket) first served; a place lapses at expires_at unless its waiter
-- renews it, and lapsed places are skipped.
create table if not exists {table}_waiters (
    name       text        not null,
    ticket     bigint      generated always as identity,
    waiter     text        not null,
    expires_at timestamptz not null,
    -- The waiter's client id and TTL: a release hands the lock to the first
    -- live place with its grant (null: a waiter of a version before the
    -- hand-off, which is woken to try instead).
    client_id  text,
    ttl_secs   float8,
    -- The waiter's login, which a hand-over grants the lease to.
    login      text,
    primary key (name, ticket),
    unique (name, waiter)
)
