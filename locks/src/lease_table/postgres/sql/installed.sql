select p.prosrc, has_function_privilege(p.oid, 'execute')
  from pg_catalog.pg_proc p
 where p.oid = pg_catalog.to_regprocedure($1)
