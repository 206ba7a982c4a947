begin
{statement};
  return row_count();
end
