local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == false then
  return grant(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
end
if owner == ARGV[1] then
  return reenter(KEYS[1], ARGV[2])
end
return {0, redis.call('PTTL', KEYS[1])}
