update {table} l set expires_at = now(), released = true
 where l.name = $1 and l.holder = $2 and not l.released and l.expires_at > now()
   and l.login = session_user
returning '{table}', coalesce(
           (select w.waiter from {table}_waiters w
             where w.name = l.name and w.expires_at > now()
             order by w.ticket limit 1), '*') || ' ' || l.name
