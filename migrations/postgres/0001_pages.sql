-- Pages and the fence that guards each one.
--
-- A row may exist without a body: a fenced read of a page nobody has written
-- yet records the fence (so a late, older writer is still refused), but the
-- page answers 404 until its first accepted write. `version` is 0 exactly when
-- `body` is null, and counts accepted writes otherwise.
create table pages (
    id text primary key,
    body text,
    version bigint not null default 0,
    -- The lock service whose tokens guard this page, and the highest token
    -- seen from it. Both null until the first fenced access.
    fence_issuer text,
    fence_token bigint,
    -- Outcome of the latest attempt on this row (accepted, stale, stale_token,
    -- issuer_mismatch, version_mismatch). Written by the same statement that
    -- decides it, so the gateway learns the verdict without a second query.
    last_outcome text not null default 'accepted',
    updated_at timestamptz not null default now(),
    check ((body is null) = (version = 0)),
    check ((fence_issuer is null) = (fence_token is null))
);

-- Every fenced access and every write attempt, accepted or not. Within one
-- page, ids are in commit order: the row is inserted by the statement that
-- holds the page's row lock until commit (see gateway/src/store.rs).
create table page_history (
    id bigserial primary key,
    page_id text not null,
    at timestamptz not null default now(),
    method text not null,
    outcome text not null,
    token bigint,
    issuer text,
    client_id text,
    -- The page's version and fence after the attempt.
    version bigint not null,
    fence_token bigint
);

create index page_history_by_page on page_history (page_id, id desc);
