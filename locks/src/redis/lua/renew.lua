local v = redis.call('HMGET', KEYS[1], 'owner', 'token')
if v[1] == ARGV[1] and v[2] == ARGV[2] then
  extend(KEYS[1], ARGV[3])
  return 1
end
return 0
