-- The first access of a page with fencing off: create its row and record
-- the attempt. Run when unfenced_access.sql found no row. Same parameters.
-- The row is created without a fence (its columns are not even named: the
-- unfenced gateway's role may not insert them); If-Match can only be
-- `version_mismatch`, which creates the row empty, as a row exists for
-- every page with a history.
--
-- Why it is atomic: as fenced_access_insert.sql, `on conflict (id) do
-- nothing` lets exactly one first access create the row; the others return
-- no row and run unfenced_access.sql again.
with created as (
    insert into pages as p (id, body, version, last_outcome)
    values (
        $1::text,
        case when $2::text = 'PUT' and $6::bigint is null then $3::text end,
        case when $2 = 'PUT' and $6 is null then 1 else 0 end,
        case when $2 = 'PUT' and $6 is not null then 'version_mismatch' else 'accepted' end
    )
    on conflict (id) do nothing
    returning p.id, p.body, p.version, p.last_outcome
),
logged as (
    insert into page_history (page_id, method, outcome, token, issuer, client_id, version)
    select id, $2, last_outcome, $4::bigint, case when $4 is not null then $5::text end, $8::text, version
    from created
)
select id, body, version, null::text, null::bigint, last_outcome from created
