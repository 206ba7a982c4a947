values ($1, $2, $5, session_user, 1, now() + make_interval(secs => $3), false, now())
