local head = redis.call('LINDEX', KEYS[2], 0)
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if head == ARGV[1] and redis.call('EXISTS', KEYS[1]) == 0 then
  local next = redis.call('LINDEX', KEYS[2], 0)
  if next then
    redis.call('PUBLISH', ARGV[2], next)
  end
end
return 1
