with gone as (
  delete from {table}_waiters
   where name = $1 and waiter = $2 and login = session_user
  returning ticket
),
notified as (
  select pg_notify('{table}', coalesce(
           (select w.waiter from {table}_waiters w
             where w.name = $1 and w.ticket > g.ticket and w.expires_at > now()
             order by w.ticket limit 1), '*') || ' ' || $1)
    from gone g
   where not exists (select 1 from {table}_waiters w
                      where w.name = $1 and w.ticket < g.ticket and w.expires_at > now())
)
select (select count(*) from notified) as notified,
       (select count(*) from gone) > 0 as left_queue
