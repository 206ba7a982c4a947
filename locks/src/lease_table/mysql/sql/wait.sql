select -- First in line, refused after its last wait: let the name's bell go.
       if(is_used_lock({name_bell}) = connection_id(), release_lock({name_bell}), null),
       l.token,
       not l.released and l.expires_at + interval p_delay microsecond > now(6),
       p.waiter,
       is_free_lock({bell}),
       get_lock({bell}, least(p_max, greatest(0, timestampdiff(microsecond, now(6),
         if(p.waiter is null,
            l.expires_at + interval if(l.released, 0, p_delay) microsecond,
            p.expires_at)) / 1000000))),
       -- Whether we are first in line once the bell rings: we have a place,
       -- and nobody is before us but the waiter whose bell we wait on (if
       -- any). (Looked at as the statement begins, as the bell's lookup is:
       -- MariaDB evaluates both before the wait. A place taken later has a
       -- higher ticket, so only a lapsed place renewed meanwhile can be
       -- missed, and a lapsed place is skipped anyway.)
       me.ticket is not null and (p.waiter is null or not exists (
         select 1 from {table}_waiters w2
          where w2.name = l.name and w2.ticket < p.ticket and {live_w2})),
       -- Keep the name's bell when first in line; let a waiter's go.
       if(p.waiter is null and me.waiter is not null, 0, release_lock({bell}))
  into v_dropped, v_token, v_held, v_pred, v_bell_free, v_rang, v_first_now, v_let_go
  from {table} l
  left join {table}_waiters me on me.name = l.name and me.waiter = p_waiter
  left join {table}_waiters p on p.name = l.name and p.ticket = (
       select max(w.ticket) from {table}_waiters w
        where w.name = l.name and w.ticket < me.ticket and {live_w})
 where l.name = p_name
