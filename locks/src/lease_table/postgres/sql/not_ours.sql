  -- The lease is live and matched but for the login: another login's.
  if exists (select 1 from {table} l
              where l.name = $1 and l.holder = $2{token_match}
                and not l.released and l.expires_at > now()
                and l.login is distinct from session_user) then
    raise exception 'the lease of lock % was granted to another login', $1
      using errcode = 'insufficient_privilege';
  end if;
