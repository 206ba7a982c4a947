{acquire}
   and not exists (select 1 from {table}_waiters w
                    where w.name = l.name and {live_place})
