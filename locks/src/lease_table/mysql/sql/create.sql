insert ignore into {table} (name, holder, client_id, login, token, expires_at, released, granted_at)
values (p_name, p_holder, p_client, {login}, 1, now(6) + interval p_ttl microsecond, false, now(6))
