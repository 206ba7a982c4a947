-- SECURITY DEFINER: it runs with its owner's rights, so that a login with
-- EXECUTE alone can take and end leases, and only this way. The fixed
-- search_path (temporary tables last) keeps a caller's own tables from
-- standing in for the lease table.
create or replace function {table}_{verb}({params}) returns {returns}
language plpgsql security definer
set search_path = pg_catalog, {schema}, pg_temp
as $function$
{body}
$function$
