declare
  woken bigint;
  in_queue boolean;
begin
{statement}
  into woken, in_queue;
  return in_queue;
end
