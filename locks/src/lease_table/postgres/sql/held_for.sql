(select extract(epoch from l.expires_at
                + case when l.released then interval '0' else make_interval(secs => $4) end
                - now())::float8
   from {table} l where l.name = $1)
