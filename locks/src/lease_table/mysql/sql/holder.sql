select client_id, token from {table}
 where name = ? and not released and expires_at > now(6)
