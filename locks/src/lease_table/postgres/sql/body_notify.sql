declare
  notify_channel text;
  notify_payload text;
begin
{statement}
  into notify_channel, notify_payload;
  if found then
    -- Delivered at commit, as from the statement itself.
    perform pg_notify(notify_channel, notify_payload);
    return true;
  end if;
{not_ours}
  return false;
end
