-- The first access of a page: create its row and record the attempt. Run
-- when fenced_access_locked.sql found no row. Same parameters as
-- fenced_access.sql ($7 is not needed: nothing is fenced yet).
--
-- A new page has no fence and no version, so the only refusal is If-Match
-- (version_mismatch): its row is created empty (no body, version 0, no
-- fence), as a row exists for every page with a history. Anything else is
-- accepted: a PUT writes version 1, a fenced read records the fence.
--
-- Why it is atomic (PostgreSQL, read committed):
-- * The primary key lets exactly one of several concurrent first accesses
--   insert the row. `on conflict (id) do nothing` makes every other one wait
--   until the winner commits, then insert nothing, record nothing and return
--   no row. The gateway then runs fenced_access_locked.sql again, whose new
--   snapshot sees the winner's row, and decides under its lock as usual.
-- * The inserted row stays locked by this transaction until commit, and the
--   history row is inserted by the same statement: it is the page's first.
with created as (
    insert into pages as p (id, body, version, fence_issuer, fence_token, last_outcome)
    values (
        $1::text,
        case when $2::text = 'PUT' and $6::bigint is null then $3::text end,
        case when $2 = 'PUT' and $6 is null then 1 else 0 end,
        case when $4::bigint is not null and not ($2 = 'PUT' and $6 is not null) then $5::text end,
        case when $4 is not null and not ($2 = 'PUT' and $6 is not null) then $4 end,
        case when $2 = 'PUT' and $6 is not null then 'version_mismatch' else 'accepted' end
    )
    on conflict (id) do nothing
    returning p.id, p.body, p.version, p.fence_issuer, p.fence_token, p.last_outcome
),
logged as (
    insert into page_history (page_id, method, outcome, token, issuer, client_id, version, fence_token)
    select id, $2, last_outcome, $4, case when $4 is not null then $5 end, $8::text, version, fence_token
    from created
)
select id, body, version, fence_issuer, fence_token, last_outcome from created
