local owner = redis.call('HGET', KEYS[1], 'owner')
if owner ~= false and owner == ARGV[1] then
  return reenter(KEYS[1], ARGV[2])
end
if owner == false and redis.call('EXISTS', KEYS[3]) == 0 then
  return grant(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
end
local now = now_ms()
drop_lapsed(KEYS[3], KEYS[4], now)
local head = redis.call('LINDEX', KEYS[3], 0)
while head and not redis.call('ZSCORE', KEYS[4], head) do
  redis.call('LPOP', KEYS[3])
  head = redis.call('LINDEX', KEYS[3], 0)
end
if owner == false and (head == false or head == ARGV[3]) then
  if head then
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], ARGV[3])
  end
  return grant(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
end
local place = tonumber(ARGV[4])
if place > 0 then
  if redis.call('ZADD', KEYS[4], now + place, ARGV[3]) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[3])
  end
  extend(KEYS[3], place)
  extend(KEYS[4], place)
  if head == false then
    head = ARGV[3]
  end
end
if owner ~= false then
  return {0, redis.call('PTTL', KEYS[1])}
end
return {0, tonumber(redis.call('ZSCORE', KEYS[4], head)) - now}
