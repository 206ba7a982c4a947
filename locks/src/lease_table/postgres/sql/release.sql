with lk as (
  select l.token from {table} l
   where l.name = $1 and l.holder = $2 and l.token = $3
     and not l.released and l.expires_at > now() and l.login = session_user
     for update
),
next as (
  select w.waiter, w.ttl_secs from {table}_waiters w
   where w.name = $1 and w.expires_at > now() and w.waiter <> $2
     and exists (select 1 from lk)
   order by w.ticket limit 1
),
served as (
  delete from {table}_waiters w using next n
   where w.name = $1 and w.waiter = n.waiter
     and w.client_id is not null and w.ttl_secs is not null and w.login is not null
  returning w.waiter, w.client_id, w.ttl_secs, w.login
),
own as (
  delete from {table}_waiters w
   where w.name = $1 and w.waiter = $2 and w.login = session_user
)
update {table} l
   set holder = coalesce(s.waiter, l.holder),
       client_id = coalesce(s.client_id, l.client_id),
       login = coalesce(s.login, l.login),
       token = l.token + case when s.waiter is null then 0 else 1 end,
       expires_at = now() + make_interval(secs => coalesce(s.ttl_secs, 0)),
       released = s.waiter is null,
       granted_at = case when s.waiter is null then l.granted_at else now() end
  from lk left join served s on true
 where l.name = $1 and l.holder = $2 and l.token = $3
returning {channel}, coalesce(
           s.waiter || '=' || l.token,
           (select n.waiter from next n),
           '*') || ' ' || l.name
