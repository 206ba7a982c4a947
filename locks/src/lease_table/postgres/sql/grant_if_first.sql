select $1, $2, $5, session_user, 1, now() + make_interval(secs => $3), false, now()
 where coalesce((select waiter from first), $2) = $2
