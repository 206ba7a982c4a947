insert into {table}_waiters (name, waiter, expires_at, login)
values (p_name, p_waiter,
        if(get_lock({waiter_bell}, 0) = 1, now(6) + interval p_place microsecond, null),
        {login})
on duplicate key update expires_at = values(expires_at)
