begin
{statement};
  if found then
    return true;
  end if;
{not_ours}
  return false;
end
