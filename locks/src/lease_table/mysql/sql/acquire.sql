update {table} l
   set l.token = last_insert_id(l.token + 1),
       -- Both branches are the holder: the `if` is there to take the
       -- name's bell, and only for the row this statement grants (GET_LOCK:
       -- at once when this connection holds it already, as the first waiter
       -- does after its wait; else waiting at most 5 ms for a non-fair
       -- waiter that holds it for an instant).
       l.holder = if(get_lock({name_bell}, 0.005) >= 0, p_holder, p_holder),
       l.client_id = p_client,
       l.login = {login},
       l.expires_at = now(6) + interval p_ttl microsecond,
       l.released = false,
       l.granted_at = now(6)
 where l.name = p_name
   and ((l.released and l.expires_at <= now(6))
     or (not l.released and l.expires_at + interval p_delay microsecond <= now(6)))
