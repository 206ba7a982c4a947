select table_name::text, column_name::text from information_schema.columns
 where table_schema = current_schema()
   and table_name in (lower($1), lower($1) || '_waiters')
