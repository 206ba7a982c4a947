-- A fenced access with fencing enforced, of a page that exists, decided
-- under the page's row lock: run when fenced_access.sql wrote nothing (a
-- refusal, most of the time, or a page without an issuer yet). Same
-- parameters as fenced_access.sql. Returns the page as it is after the
-- access and the verdict; no row when the page has no row (in this
-- statement's snapshot): then the gateway runs fenced_access_insert.sql.
--
-- The page's issuer is the one its row carries (set by an admin, or by an
-- access accepted earlier), else $7, the operator's rule: a page the rule
-- names no issuer for is refused `no_issuer_for_page`, a token of another
-- issuer `issuer_mismatch`. An accepted access of a page without an issuer
-- gives it the rule's.
--
-- Why it is atomic (PostgreSQL, read committed):
-- * `select ... for update` locks the page's row, waiting for a concurrent
--   access to commit if there is one, and then reads the NEWEST committed
--   version of the row (EvalPlanQual), not the statement's snapshot. The
--   verdict is computed from that version, under the lock, which is held
--   until commit: nothing can change the row between the verdict and the
--   end of this statement.
-- * A refusal (no_issuer_for_page, issuer_mismatch, stale_token,
--   version_mismatch) takes the row lock but does not rewrite the row: the
--   history row is its only write.
-- * If the verdict is accepted (the row changed since fenced_access.sql saw
--   it, e.g. an admin lowered the fence, or the page had no issuer yet),
--   the update below writes it; its scan may find the snapshot's older
--   version, in which case it follows the update chain to the newest one,
--   which is the one locked here.
-- * The history row is inserted by the same statement after the lock is
--   taken: within a page, history ids follow commit order.
with cur as (
    select p.id, p.body, p.version, p.fence_issuer, p.fence_token,
        coalesce(p.fence_issuer, $7::text) as page_issuer
    from pages p
    where p.id = $1::text
    for update
),
decided as (
    select cur.*,
        case
            when page_issuer is null then 'no_issuer_for_page'
            when page_issuer <> $5::text then 'issuer_mismatch'
            when fence_token > $4::bigint then 'stale_token'
            when $2::text = 'PUT' and $6::bigint is not null and (body is null or version <> $6) then 'version_mismatch'
            else 'accepted'
        end as outcome
    from cur
),
after as (
    select id, outcome, ok,
        case when ok and $2 = 'PUT' then $3::text else body end as body,
        version + case when ok and $2 = 'PUT' then 1 else 0 end as version,
        case when ok then page_issuer else fence_issuer end as fence_issuer,
        -- greatest() skips a null: a page's first fence is the token.
        case when ok then greatest(fence_token, $4) else fence_token end as fence_token
    from (select decided.*, outcome = 'accepted' as ok from decided) d
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
    select id, $2, outcome, $4, $5, $8::text, version, fence_token
    from after
)
select id, body, version, fence_issuer, fence_token, outcome from after
