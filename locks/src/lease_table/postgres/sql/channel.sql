case when {waiter} ~ '^[0-9a-f]{16}\.' then '{own_channel}' || left({waiter}, 16)
     else '{table}' end
