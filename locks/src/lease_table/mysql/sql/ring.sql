select get_lock({bell}, 0)
