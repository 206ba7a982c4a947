update {table} set expires_at = now(6) + interval ? microsecond
 where name = ? and holder = ? and token = ?
   and not released and expires_at > now(6)
