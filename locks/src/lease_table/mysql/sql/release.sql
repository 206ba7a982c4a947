update {table} l
   set l.expires_at = now(6),
       l.released = true,
       -- Unchanged: the `if` rings the bells this connection holds (the
       -- name's, and the holder's own if it waited) for the row this
       -- statement releases, and only for it.
       l.holder = if(release_all_locks() >= 0, l.holder, l.holder)
 where l.name = p_name and l.holder = p_holder and l.token = p_token
   and not l.released and l.expires_at > now(6) and l.login = {login}
