select concat_ws(' ', not released and expires_at > now(6), token, client_id)
  from {table} where name = {name}
