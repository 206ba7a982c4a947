update {table} set expires_at = now(6) + interval p_ttl microsecond
 where name = p_name and holder = p_holder and token = p_token
   and not released and expires_at > now(6) and login = {login}
