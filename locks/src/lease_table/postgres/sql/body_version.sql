begin
  return '{version}';
end
