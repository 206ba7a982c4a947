delete from {table}_waiters where name = ? and (waiter = ? or expires_at <= now(6))
