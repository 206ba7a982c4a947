select count(*) from information_schema.triggers
 where trigger_schema = database() and trigger_name = ?
