begin
{statement};
  -- The token set by last_insert_id(expr), which the caller's
  -- last_insert_id() no longer shows once the function returns.
  return if(row_count() = 1, last_insert_id(), null);
end
