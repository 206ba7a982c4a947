queued as (
  insert into {table}_waiters (name, waiter, expires_at, client_id, ttl_secs, login)
  select $1, $2, now() + make_interval(secs => $6), $5, $3, session_user
   where $6 > 0 and exists (select 1 from bumped)
  on conflict (name, waiter) do update set expires_at = excluded.expires_at
)
