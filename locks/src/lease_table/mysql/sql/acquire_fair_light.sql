{acquire}
   and (l.queued_until is null or l.queued_until <= now(6))
