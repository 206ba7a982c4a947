update {table} set expires_at = now() + make_interval(secs => $4)
 where name = $1 and holder = $2 and token = $3
   and not released and expires_at > now() and login = session_user
