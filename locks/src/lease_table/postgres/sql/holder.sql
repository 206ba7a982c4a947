select client_id, token from {table}
 where name = $1 and not released and expires_at > now()
