begin
  return ({statement});
end
