-- A write or a fenced read with fencing off (GATEWAY_FENCING=off), of a
-- page that exists, under the page's row lock. Same parameters as
-- fenced_access.sql; $7 is not used: with fencing off no page has an issuer
-- to choose.
--
-- Fencing off never touches the fence: this statement sets neither
-- fence_issuer nor fence_token, and no decision depends on them. It reads
-- them for what it shows only: a write whose token is older than the
-- page's fence (of the same issuer) is recorded `stale` (the damage fencing
-- would have stopped), and the history and the answer show the fence as it
-- is. The unfenced gateway's database role (fence_unfenced) may update
-- body, version, last_outcome and updated_at only, so the database itself
-- would refuse a statement that moved the fence.
--
-- If-Match still refuses (version_mismatch): the history row is then the
-- only write. No row when the page has no row (in this statement's
-- snapshot): then the gateway runs unfenced_access_insert.sql.
--
-- Why it is atomic: `select ... for update` locks the page's row and reads
-- its newest committed version, as in fenced_access_locked.sql; the write
-- and the history row follow in the same statement, under that lock.
with cur as (
    select p.id, p.body, p.version, p.fence_issuer, p.fence_token,
        case
            when $2::text = 'PUT' and $6::bigint is not null and (p.body is null or p.version <> $6) then 'version_mismatch'
            when p.fence_issuer = $5::text and p.fence_token > $4::bigint then 'stale'
            else 'accepted'
        end as outcome
    from pages p
    where p.id = $1::text
    for update
),
after as (
    select id, outcome, ok, fence_issuer, fence_token,
        case when ok and $2 = 'PUT' then $3::text else body end as body,
        version + case when ok and $2 = 'PUT' then 1 else 0 end as version
    from (select cur.*, outcome <> 'version_mismatch' as ok from cur) decided
),
changed as (
    update pages p
    set body = a.body, version = a.version, last_outcome = a.outcome, updated_at = now()
    from after a
    where p.id = a.id and a.ok
),
logged as (
    insert into page_history (page_id, method, outcome, token, issuer, client_id, version, fence_token)
    select id, $2, outcome, $4, case when $4 is not null then $5 end, $8::text, version, fence_token
    from after
)
select id, body, version, fence_issuer, fence_token, outcome from after
