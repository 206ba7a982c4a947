-- One fenced access (a write, or a fenced read) of one page: the fence check,
-- the write and the history row in ONE statement, so ONE round trip.
--
-- $1 page id, $2 method ('GET' | 'PUT'), $3 new body (PUT), $4 fencing token
-- (null: unfenced), $5 issuer, $6 If-Match version (null: none),
-- $7 fencing enforced, $8 client id.
--
-- Why it is atomic (PostgreSQL, read committed):
-- * `insert ... on conflict (id) do update` either inserts the row, or takes
--   the existing row's lock and evaluates the SET against the newest
--   committed version of that row (not the statement's snapshot). Concurrent
--   statements on the same page therefore queue on the row lock, and each
--   one decides on the state the previous one committed. There is no window
--   between the check and the write: they are the same row update.
-- * Two concurrent first accesses of a page cannot both insert: the loser of
--   the unique-index race waits for the winner and then takes the update path.
-- * The verdict (`last_outcome`) is computed inside that locked update, and
--   every column keeps its old value unless the verdict is accepted/stale; a
--   rejected attempt rewrites the row with identical body, version and fence.
-- * The history row is inserted by the same statement after the row lock is
--   taken (it reads `attempt`'s output), and the lock is held until commit, so
--   within a page history ids follow commit order.
-- No state lives in the gateway: any number of gateways can share the database.
with attempt as (
    insert into pages as p (id, body, version, fence_issuer, fence_token, last_outcome)
    values (
        $1::text,
        case when $2::text = 'PUT' and $6::bigint is null then $3::text end,
        case when $2 = 'PUT' and $6 is null then 1 else 0 end,
        case when $4::bigint is not null and not ($2 = 'PUT' and $6 is not null) then $5::text end,
        case when $4 is not null and not ($2 = 'PUT' and $6 is not null) then $4 end,
        case when $2 = 'PUT' and $6 is not null then 'version_mismatch' else 'accepted' end
    )
    on conflict (id) do update set
        (body, version, fence_issuer, fence_token, last_outcome, updated_at) = (
            select
                case when v.ok and $2 = 'PUT' then $3 else p.body end,
                case when v.ok and $2 = 'PUT' then p.version + 1 else p.version end,
                case when v.ok and v.same_issuer then coalesce(p.fence_issuer, $5) else p.fence_issuer end,
                case when v.ok and v.same_issuer then greatest(p.fence_token, $4) else p.fence_token end,
                v.outcome,
                case when v.ok then now() else p.updated_at end
            from (
                select o.outcome, o.outcome in ('accepted', 'stale') as ok, o.same_issuer
                from (
                    select
                        case
                            when $4 is not null and $7::boolean and not s.same_issuer then 'issuer_mismatch'
                            when $4 is not null and $7 and p.fence_token > $4 then 'stale_token'
                            when $2 = 'PUT' and $6 is not null and (p.body is null or p.version <> $6) then 'version_mismatch'
                            when $4 is not null and s.same_issuer and p.fence_token > $4 then 'stale'
                            else 'accepted'
                        end as outcome,
                        s.same_issuer
                    from (select $4 is not null and coalesce(p.fence_issuer = $5, true) as same_issuer) s
                ) o
            ) v
        )
    returning p.id, p.body, p.version, p.fence_issuer, p.fence_token, p.last_outcome
),
logged as (
    insert into page_history (page_id, method, outcome, token, issuer, client_id, version, fence_token)
    select a.id, $2, a.last_outcome, $4, case when $4 is not null then $5 end, $8::text, a.version, a.fence_token
    from attempt a
)
select id, body, version, fence_issuer, fence_token, last_outcome from attempt
