insert into {table} as l (name, holder, client_id, login, token, expires_at, released, granted_at)
{source}
on conflict (name) do update
   set holder = excluded.holder,
       client_id = excluded.client_id,
       login = excluded.login,
       token = l.token + 1,
       expires_at = excluded.expires_at,
       released = false,
       granted_at = excluded.granted_at
 where ((l.released and l.expires_at <= now())
     or (not l.released and l.expires_at + make_interval(secs => $4) <= now()))
   {queue_check}
returning token
