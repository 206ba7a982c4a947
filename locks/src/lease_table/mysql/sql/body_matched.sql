begin
{statement};
  if row_count() = 1 then
    return 1;
  end if;
  -- Live and matched but for the login: another login's lease.
  if exists (select 1 from {table} l
              where l.name = p_name and l.holder = p_holder and l.token = p_token
                and not l.released and l.expires_at > now(6)
                and not l.login <=> {login}) then
    signal sqlstate '42000'
      set message_text = 'the lease of this lock was granted to another login';
  end if;
  return 0;
end
