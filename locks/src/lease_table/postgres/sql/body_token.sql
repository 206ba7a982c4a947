declare
  minted bigint;
begin
{statement}
  into minted;
  return minted;
end
