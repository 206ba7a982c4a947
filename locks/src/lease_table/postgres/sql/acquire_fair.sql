with first as (
  select w.waiter, w.expires_at from {table}_waiters w
   where w.name = $1 and w.expires_at > now()
   order by w.ticket limit 1
),
granted as (
{grant}
),
served as (
  delete from {table}_waiters w
   where w.name = $1 and w.waiter = $2 and exists (select 1 from granted)
),
purged as (
  delete from {table}_waiters w
   where w.name = $1 and w.expires_at <= now() and w.waiter <> $2
),
mine as (
  select l.token from {table} l
   where l.name = $1 and l.holder = $2 and not l.released and l.expires_at > now()
     and l.login = session_user
),
bumped as (
  update {table} l set queued_until = greatest(l.queued_until, now() + make_interval(secs => $6))
   where l.name = $1 and $6 > 0 and not exists (select 1 from granted)
     and not exists (select 1 from mine)
  returning 1
),
{take_place}
select coalesce(g.token, g.mine) as token,
       case when g.token is null and g.mine is null then
         greatest({held_for},
                  (select extract(epoch from f.expires_at - now())::float8
                     from first f where f.waiter <> $2))
       end as wait_secs,
       g.token is null and g.mine is null
         and exists (select 1 from first f where f.waiter <> $2) as behind,
       g.token is null and g.mine is not null as handed
  from (select (select token from granted) as token, (select token from mine) as mine) g
