select client_id, token, not released and expires_at > now() as held
  from {table} where name = $1
