create trigger if not exists {table}_queued before insert on {table}_waiters
for each row
  update {table}
     set queued_until = greatest(coalesce(queued_until, new.expires_at),
                                 coalesce(new.expires_at, queued_until))
   where name = new.name
