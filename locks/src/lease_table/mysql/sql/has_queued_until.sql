select count(*) from information_schema.columns
 where table_schema = database() and table_name = ?
   and column_name = 'queued_until'
