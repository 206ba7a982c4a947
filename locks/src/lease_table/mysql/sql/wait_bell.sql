if(p.waiter is null, convert({name_bell} using utf8mb4),
   convert({pred_bell} using utf8mb4))
