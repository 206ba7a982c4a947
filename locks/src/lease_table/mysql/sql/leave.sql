delete from {table}_waiters
 where name = p_name and ((waiter = p_waiter and login = {login}) or expires_at <= now(6))
