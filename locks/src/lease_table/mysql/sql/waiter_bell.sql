concat('fencelock:w:', {waiter})
