insert ignore into {table} (name, holder, client_id, token, expires_at, released, granted_at)
values (?, ?, ?, 1, now(6) + interval ? microsecond, false, now(6))
