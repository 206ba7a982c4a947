-- Shared by the lock's scripts: each one is this file, then its own body.

-- Let `key` live at least `ms` milliseconds more; never shorten it.
local function extend(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Grant the free lock: the fence counter's next value is the token, minted
-- in this same step, and the hash names the owner. A counter that cannot be
-- incremented (at 2^63-1, or not a number: written by hand) refuses every
-- grant of this lock, with an error that says so.
local function grant(lock, fence, owner, ttl)
  local minted = redis.pcall('INCR', fence)
  if type(minted) == 'table' and minted.err then
    return redis.error_reply('FENCE the counter ' .. fence .. ' cannot mint another token ('
      .. minted.err .. '): no grant of this lock until an operator repairs it')
  end
  local token = redis.call('GET', fence)
  redis.call('HSET', lock, 'token', token, 'owner', owner, 'count', 1)
  redis.call('PEXPIRE', lock, ttl)
  return {1, token}
end

-- The owner takes the lock again: the same token, one more count.
local function reenter(lock, ttl)
  redis.call('HINCRBY', lock, 'count', 1)
  extend(lock, ttl)
  return {1, redis.call('HGET', lock, 'token')}
end

-- The Redis server's clock, in ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Drop the fair waiters whose place lapsed by `now`.
local function drop_lapsed(queue, deadlines, now)
  local dead = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)
  for i = 1, #dead do
    redis.call('LREM', queue, 0, dead[i])
    redis.call('ZREM', deadlines, dead[i])
  end
end
