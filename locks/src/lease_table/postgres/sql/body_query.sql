#variable_conflict use_column
begin
  return query
{statement};
end
