-- A fenced access (a write, or a fenced read) with fencing enforced, of a
-- page that exists and already has its issuer, in the common case that it
-- is accepted: the fence check, the write and the history row in ONE
-- statement, so ONE round trip. It is a plain fenced UPDATE: when the
-- access is refused, or the page has no row or no issuer yet, it changes
-- nothing, records nothing and returns no row; then the gateway runs
-- fenced_access_locked.sql (which decides under the row lock, gives a page
-- its issuer, and records a refusal without rewriting the row), and for a
-- page with no row fenced_access_insert.sql. The first of them that returns
-- a row made the one decision of the request; a statement that returns no
-- row wrote nothing.
--
-- $1 page id, $2 method ('GET' | 'PUT'), $3 new body (PUT), $4 fencing
-- token, $5 the token's issuer, $6 If-Match version (null: none), $7 the
-- page's issuer by the operator's rule (null: none; not needed here: a page
-- whose row carries no issuer is decided by fenced_access_locked.sql),
-- $8 client id.
--
-- Why it is atomic (PostgreSQL, read committed):
-- * An UPDATE locks the row it changes. If another statement holds that lock,
--   this one waits for it to commit, then re-evaluates its WHERE clause on
--   the newest committed version of the row (EvalPlanQual), not on the
--   statement's snapshot, and computes the SET from that version. The fence
--   check (the WHERE clause) and the write are one row update: no other
--   access of the page comes between them, and concurrent accesses of a page
--   queue on its row lock, each deciding on what the previous one committed.
-- * If the check fails on that newest version, the row is neither written
--   nor kept locked, no history row is inserted and no row is returned.
-- * The history row is inserted by the same statement from the UPDATE's
--   output, so after the row lock is taken, and the lock is held until
--   commit: within a page, history ids follow commit order.
-- The WHERE clause accepts exactly what fenced_access_locked.sql accepts on
-- a page with an issuer (not issuer_mismatch, stale_token nor
-- version_mismatch): keep them in step.
-- No state lives in the gateway: any number of gateways can share the database.
with changed as (
    update pages p set
        body = case when $2::text = 'PUT' then $3::text else p.body end,
        version = p.version + case when $2 = 'PUT' then 1 else 0 end,
        -- Only up: the WHERE clause refuses a lower token.
        fence_token = $4::bigint,
        last_outcome = 'accepted',
        updated_at = now()
    where p.id = $1::text
      -- Not issuer_mismatch: the page's issuer is the token's.
      and p.fence_issuer = $5::text
      -- Not stale_token.
      and p.fence_token <= $4
      -- Not version_mismatch.
      and not coalesce($2 = 'PUT' and $6::bigint is not null
                       and (p.body is null or p.version <> $6), false)
    returning p.id, p.body, p.version, p.fence_issuer, p.fence_token, p.last_outcome
),
logged as (
    insert into page_history (page_id, method, outcome, token, issuer, client_id, version, fence_token)
    select id, $2, last_outcome, $4, $5, $8::text, version, fence_token
    from changed
)
select id, body, version, fence_issuer, fence_token, last_outcome from changed
