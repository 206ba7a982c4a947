local v = redis.call('HMGET', KEYS[1], 'owner', 'token')
if v[1] ~= ARGV[1] or v[2] ~= ARGV[2] then
  return 0
end
if redis.call('HINCRBY', KEYS[1], 'count', -1) > 0 then
  return 2
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('PUBLISH', ARGV[3], '*')
  return 1
end
drop_lapsed(KEYS[2], KEYS[3], now_ms())
local head = redis.call('LINDEX', KEYS[2], 0)
if head == false then
  head = '*'
end
redis.call('PUBLISH', ARGV[3], head)
return 1
