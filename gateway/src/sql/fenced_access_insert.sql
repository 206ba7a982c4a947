-- The first access of a page with fencing enforced: create its row and
-- record the attempt. Run when fenced_access_locked.sql found no row. Same
-- parameters as fenced_access.sql.
--
-- A new page has no fence and no version. Its issuer is $7, the operator's
-- rule: none is `no_issuer_for_page`, another than the token's
-- `issuer_mismatch`; then If-Match can only be `version_mismatch`. A refused
-- first access creates the row empty (no body, version 0, no fence), as a
-- row exists for every page with a history. An accepted one fences the page
-- with the rule's issuer and the token; a PUT writes version 1.
--
-- Why it is atomic (PostgreSQL, read committed):
-- * The primary key lets exactly one of several concurrent first accesses
--   insert the row. `on conflict (id) do nothing` makes every other one wait
--   until the winner commits, then insert nothing, record nothing and return
--   no row. The gateway then runs fenced_access_locked.sql again, whose new
--   snapshot sees the winner's row, and decides under its lock as usual.
-- * The inserted row stays locked by this transaction until commit, and the
--   history row is inserted by the same statement: it is the page's first.
with decided as (
    select case
        when $7::text is null then 'no_issuer_for_page'
        when $7 <> $5::text then 'issuer_mismatch'
        when $2::text = 'PUT' and $6::bigint is not null then 'version_mismatch'
        else 'accepted'
    end as outcome
),
created as (
    insert into pages as p (id, body, version, fence_issuer, fence_token, last_outcome)
    select
        $1::text,
        case when outcome = 'accepted' and $2 = 'PUT' then $3::text end,
        case when outcome = 'accepted' and $2 = 'PUT' then 1 else 0 end,
        case when outcome = 'accepted' then $7 end,
        case when outcome = 'accepted' then $4::bigint end,
        outcome
    from decided
    on conflict (id) do nothing
    returning p.id, p.body, p.version, p.fence_issuer, p.fence_token, p.last_outcome
),
logged as (
    insert into page_history (page_id, method, outcome, token, issuer, client_id, version, fence_token)
    select id, $2, last_outcome, $4, $5, $8::text, version, fence_token
    from created
)
select id, body, version, fence_issuer, fence_token, last_outcome from created
