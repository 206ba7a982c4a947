insert into {table}_waiters (name, waiter, expires_at)
values (?, ?, if(get_lock({waiter_bell}, 0) = 1, now(6) + interval ? microsecond, null))
on duplicate key update expires_at = values(expires_at)
