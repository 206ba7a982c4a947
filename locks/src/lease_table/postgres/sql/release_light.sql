update {table} l set expires_at = now(), released = true
 where l.name = $1 and l.holder = $2 and l.token = $3
   and not l.released and l.expires_at > now() and l.login = session_user
returning '{table}', '* ' || l.name
