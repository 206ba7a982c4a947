with granted as (
{grant}
),
bumped as (
  update {table} l set queued_until = greatest(l.queued_until, now() + make_interval(secs => $6))
   where l.name = $1 and $6 > 0 and not exists (select 1 from granted)
  returning 1
),
{take_place},
ahead as (
  select w.expires_at from {table}_waiters w
   where w.name = $1 and w.expires_at > now() and w.waiter <> $2
   order by w.ticket limit 1
)
select g.token,
       case when g.token is null then
         greatest({held_for},
                  (select extract(epoch from a.expires_at - now())::float8 from ahead a))
       end as wait_secs,
       g.token is null and exists (select 1 from ahead) as behind
  from (select (select token from granted) as token) g
