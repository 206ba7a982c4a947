{acquire}
   and coalesce((select w.waiter from {table}_waiters w
                  where w.name = p_name and {live_place}
                  order by w.ticket limit 1), p_holder) = p_holder
