select $1, $2, $5, session_user, 1, now() + make_interval(secs => $3), false, now()
 where not exists (select 1 from {table}_waiters w
                    where w.name = $1 and w.expires_at > now())
