-- A fenced access of a page that exists, decided under the page's row lock:
-- run when fenced_access.sql wrote nothing (a refusal, most of the time).
-- Same parameters as fenced_access.sql. Returns the page as it is after the
-- access and the verdict; no row when the page has no row (in this
-- statement's snapshot): then the gateway runs fenced_access_insert.sql.
--
-- Why it is atomic (PostgreSQL, read committed):
-- * `select ... for update` locks the page's row, waiting for a concurrent
--   access to commit if there is one, and then reads the NEWEST committed
--   version of the row (EvalPlanQual), not the statement's snapshot. The
--   verdict is computed from that version, under the lock, which is held
--   until commit: nothing can change the row between the verdict and the
--   end of this statement.
-- * A refusal (issuer_mismatch, stale_token, version_mismatch) takes the row
--   lock but does not rewrite the row: the history row is its only write.
-- * If the verdict is accepted (the row changed since fenced_access.sql saw
--   it, e.g. an admin lowered the fence), the update below writes it; its
--   scan may find the snapshot's older version, in which case it follows the
--   update chain to the newest one, which is the one locked here.
-- * The history row is inserted by the same statement after the lock is
--   taken: within a page, history ids follow commit order.
with cur as (
    select p.id, p.body, p.version, p.fence_issuer, p.fence_token,
        case
            when $4::bigint is not null and $7::boolean and p.fence_issuer <> $5::text then 'issuer_mismatch'
            when $4 is not null and $7 and p.fence_token > $4 then 'stale_token'
            when $2::text = 'PUT' and $6::bigint is not null and (p.body is null or p.version <> $6) then 'version_mismatch'
            when p.fence_issuer = $5 and p.fence_token > $4 then 'stale'
            else 'accepted'
        end as outcome,
        -- A token of the page's issuer (or of an unfenced page): the fence may move.
        $4 is not null and coalesce(p.fence_issuer = $5, true) as same_issuer
    from pages p
    where p.id = $1::text
    for update
),
after as (
    select id, outcome, ok,
        case when ok and $2 = 'PUT' then $3::text else body end as body,
        version + case when ok and $2 = 'PUT' then 1 else 0 end as version,
        case when ok and same_issuer then $5 else fence_issuer end as fence_issuer,
        case when ok and same_issuer then greatest(fence_token, $4) else fence_token end as fence_token
    from (select cur.*, outcome in ('accepted', 'stale') as ok from cur) decided
),
changed as (
    update pages p
    set body = a.body, version = a.version, fence_issuer = a.fence_issuer,
        fence_token = a.fence_token, last_outcome = a.outcome, updated_at = now()
    from after a
    where p.id = a.id and a.ok
),
logged as (
    insert into page_history (page_id, method, outcome, token, issuer, client_id, version, fence_token)
    select id, $2, outcome, $4, case when $4 is not null then $5 end, $8::text, version, fence_token
    from after
)
select id, body, version, fence_issuer, fence_token, outcome from after
