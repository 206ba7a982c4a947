{place}.expires_at > now(6) and is_used_lock({place_bell}) is not null
