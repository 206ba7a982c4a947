begin
  declare v_dropped, v_held, v_bell_free, v_rang, v_first_now, v_let_go bigint;
  declare v_token bigint unsigned;
  declare v_pred varchar(64);
{statement};
  -- No row: the lock was never granted.
  if v_token is null then
    return null;
  end if;
  -- What it read before it blocked, then whether the bell came: one text,
  -- since a function answers one value.
  return concat_ws(' ', v_token, coalesce(v_held, '-'), coalesce(v_bell_free, '-'),
                   coalesce(v_rang, '-'), coalesce(v_first_now, '-'), coalesce(v_pred, '-'));
end
